"""The env-side interfaces. Two levels:

- `SingleEnv`: one simulator instance stepping one action at a time (a ManiSkill CPU env,
  a gymnasium task, later a LIBERO task or a robot).
- `BatchedEnv`: what the rollout talks to: B envs, one action chunk each per step, with
  auto-reset, summed rewards and kept final observations (see `embodied.core.types.StepResult`).

Env-side code imports numpy, never torch, so it can run in another interpreter."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation, StepResult


@dataclass
class SingleObservation:
    state: np.ndarray  # float32 (S,)
    images: dict[str, np.ndarray] = field(default_factory=dict)  # uint8 (H, W, 3)


@dataclass
class SingleStep:
    observation: SingleObservation
    reward: float
    terminated: bool
    truncated: bool
    success: bool


class SingleEnv(ABC):
    spec: EnvSpec
    task: str
    instruction: str

    @abstractmethod
    def reset(self, seed: int) -> SingleObservation:
        """Start an episode; the same seed gives the same initial state."""

    @abstractmethod
    def step(self, action: np.ndarray) -> SingleStep:
        """Execute one action, already clipped to the action bounds."""

    def render(self) -> np.ndarray:
        """uint8 (H, W, 3) frame for videos."""
        raise NotImplementedError(f"{type(self).__name__} cannot render frames")

    def end_effector_position(self) -> np.ndarray | None:
        """(3,) metres in the robot's base frame, for tasks with an arm (a robot's workspace box)."""
        return None

    def expert_action(self) -> np.ndarray:
        """(A,) what a scripted expert reading the simulator's privileged state would do now:
        the operator of `operator.policy=scripted`, which a policy from pixels cannot be."""
        raise ConfigError(f"{type(self).__name__} ({self.task}) has no scripted expert")

    def close(self) -> None:
        pass


class BatchedEnv(ABC):
    spec: EnvSpec
    num_envs: int
    env_ids: list[int]  # which of the config's envs these are (a rollout may hold a share of them)
    tasks: list[str]
    instructions: list[str]

    @abstractmethod
    def reset(self, seeds: Sequence[int] | None = None, env_idx: Sequence[int] | None = None) -> Observation:
        """Reset all envs (or only `env_idx`) and return the full batch of observations.

        Without `seeds`, each env takes the next seed of its deterministic episode sequence."""

    @abstractmethod
    def step(self, actions: np.ndarray) -> StepResult:
        """Execute an action chunk float32 (B, C, A) in every env."""

    def render(self, env_idx: int = 0) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} cannot render frames")

    def expert_actions(self) -> np.ndarray:
        """float32 (B, A): each env's scripted expert action now (`SingleEnv.expert_action`)."""
        raise ConfigError(f"{type(self).__name__} has no scripted expert")

    def recover(self) -> Observation:
        """After an `EnvWorkerError`: restart what failed and return the full batch of
        observations. Envs without worker processes have nothing to restart."""
        raise NotImplementedError(f"{type(self).__name__} cannot recover from a failed env worker")

    @abstractmethod
    def rewind(self) -> Observation:
        """Reset every env to the start of its episode sequence, so the same episodes come
        again: a fixed evaluation set however often it is run."""

    def resume_state(self) -> dict[str, Any] | None:
        """What `restore` needs to put every env back where it is now; None where the env
        cannot be restored mid-episode (a resumed run then starts fresh episodes)."""
        return None

    def restore(self, state: dict[str, Any] | None) -> Observation:
        if state is not None:
            raise ValueError(f"{type(self).__name__} cannot restore a saved mid-episode state")
        return self.reset()

    def close(self) -> None:
        pass

    def __enter__(self) -> "BatchedEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def select_env_ids(num_envs: int, env_ids: Sequence[int] | None) -> list[int]:
    """The env ids an env factory builds: all `num_envs` of the config, or the share named."""
    if env_ids is None:
        return list(range(num_envs))
    chosen = [int(i) for i in env_ids]
    if not chosen or len(set(chosen)) != len(chosen) or min(chosen) < 0 or max(chosen) >= num_envs:
        raise ValueError(f"env ids {chosen} are not distinct ids in [0, {num_envs})")
    return chosen


def episode_seed(base_seed: int, env_id: int, episode: int, stream: int = 0) -> int:
    """Deterministic per-episode seed, so an env's episodes never depend on RNG state.
    `stream` separates training from evaluation episodes."""
    return int(np.random.SeedSequence([base_seed, stream, env_id, episode]).generate_state(1)[0] >> 1)
