"""Gymnasium adapter: classic control and MuJoCo tasks behind the same batched interface,
so the trainer can be checked against published results on standard tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from embodied.core.env import BatchedEnv, SingleEnv, SingleObservation, SingleStep
from embodied.core.errors import ConfigError
from embodied.core.registry import ENVS, unknown_name_message
from embodied.core.types import EnvSpec
from embodied.sim.latency import LatencyConfig


@dataclass
class GymnasiumConfig:
    name: str = "gymnasium"
    task: str = "InvertedPendulum-v4"
    num_envs: int = 1
    num_workers: int = 0
    transport: str = "pipe"  # to worker processes: pipe | zmq
    python: Optional[str] = None  # zmq workers: interpreter to run them (default: this one)
    max_episode_steps: Optional[int] = None
    instruction: str = ""
    kwargs: dict = field(default_factory=dict)  # passed to gymnasium.make
    latency: LatencyConfig = field(default_factory=LatencyConfig)  # delays between world and policy (docs/robots.md)


class GymnasiumEnv(SingleEnv):
    def __init__(self, cfg: GymnasiumConfig, env_id: int = 0):
        import gymnasium as gym

        if cfg.task not in gym.registry:
            raise ConfigError(unknown_name_message("gymnasium task (env.task)", cfg.task, sorted(gym.registry)))
        extra = {} if cfg.max_episode_steps is None else {"max_episode_steps": cfg.max_episode_steps}
        self.env = gym.make(cfg.task, render_mode="rgb_array", **extra, **cfg.kwargs)
        space = self.env.action_space
        if not isinstance(space, gym.spaces.Box):
            raise ConfigError(
                f"{cfg.task} has a {type(space).__name__} action space; only continuous (Box) is supported"
            )
        self.task = cfg.task
        self.instruction = cfg.instruction or cfg.task
        limit = self.env.spec.max_episode_steps if self.env.spec else None
        self.spec = EnvSpec(
            state_dim=int(np.prod(self.env.observation_space.shape)),
            action_dim=int(space.shape[0]),
            action_low=tuple(float(x) for x in space.low),
            action_high=tuple(float(x) for x in space.high),
            max_episode_steps=limit,
            control_hz=1.0 / self.env.unwrapped.dt if hasattr(self.env.unwrapped, "dt") else None,
        )

    @staticmethod
    def _observation(raw: Any) -> SingleObservation:
        return SingleObservation(state=np.asarray(raw, dtype=np.float32).reshape(-1))

    def reset(self, seed: int) -> SingleObservation:
        raw, _ = self.env.reset(seed=seed)
        return self._observation(raw)

    def step(self, action: np.ndarray) -> SingleStep:
        raw, reward, terminated, truncated, info = self.env.step(action)
        return SingleStep(
            observation=self._observation(raw),
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            success=bool(info.get("is_success", info.get("success", False))),
        )

    def render(self) -> np.ndarray:
        return np.asarray(self.env.render(), dtype=np.uint8)

    def close(self) -> None:
        self.env.close()


@ENVS.register("gymnasium", GymnasiumConfig)
def make_gymnasium(
    cfg: GymnasiumConfig, seed: int, stream: int = 0, env_ids: Sequence[int] | None = None
) -> BatchedEnv:
    from embodied.sim.vector import vectorize_config

    return vectorize_config(GymnasiumEnv, cfg, seed, stream, env_ids, preload=("gymnasium", __name__))
