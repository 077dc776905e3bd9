"""The data that flows between env side, rollout and learner.

Everything is batch-first on the env side (B = envs) and time-major in trajectories
(T, B, ...). This module imports only numpy so that env workers and robot clients, which
never load torch, share the same types."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

Array = Any  # numpy.ndarray on the env side, torch.Tensor on the policy side


@dataclass
class Observation:
    """state float32 (B, S); images name -> uint8 (B, H, W, 3); one instruction per env."""

    state: Array
    images: dict[str, Array] = field(default_factory=dict)
    instruction: list[str] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return int(self.state.shape[0])

    def select(self, index: Any) -> "Observation":
        """Rows `index` (an int array, slice or mask) of every field."""
        rows = np.arange(self.batch_size)[index] if not isinstance(index, slice) else index
        instructions = np.asarray(self.instruction, dtype=object)[rows].tolist() if self.instruction else []
        return Observation(
            state=self.state[index],
            images={name: image[index] for name, image in self.images.items()},
            instruction=instructions,
        )

    def to_torch(self, device: Any = "cpu") -> "Observation":
        import torch

        return Observation(
            state=torch.as_tensor(self.state, device=device),
            images={name: torch.as_tensor(image, device=device) for name, image in self.images.items()},
            instruction=list(self.instruction),
        )


def concat_observations(parts: list[Observation]) -> Observation:
    """Observations of disjoint env rows, joined in order (numpy on the env side)."""
    return Observation(
        state=np.concatenate([p.state for p in parts]),
        images={name: np.concatenate([p.images[name] for p in parts]) for name in parts[0].images},
        instruction=[text for p in parts for text in p.instruction],
    )


@dataclass
class ActionChunk:
    """What the policy decided for one env step: C actions per env.

    `record` holds what is needed to recompute `log_prob` later (e.g. the denoising chain of
    a flow policy, token ids of an autoregressive one); empty for a Gaussian policy, whose
    sample is `actions` itself."""

    actions: Array  # float32 (B, C, A)
    log_prob: Array  # (B,)
    value: Array | None = None  # (B,)
    policy_version: int = 0
    record: dict[str, Array] = field(default_factory=dict)


@dataclass
class ChunkPrefix:
    """What real-time chunking conditions a new chunk on (policies/denoising/realtime.py): the
    actions (B, P, A), in env units, that the chunk being executed still has when the new one
    is asked for, and the delay in env steps until the new chunk takes over. The new chunk's
    first `delay` actions are executed from these whatever it says, so it is sampled to agree
    with them. Rows may differ (robots part way through their chunks): `delay` and `pending`
    are then (B,) integers, `pending` the number of a row's P actions that are real (the rest
    padding); an int applies to every row, and `pending=None` means all P."""

    actions: Array
    delay: Any  # int or (B,) ints
    pending: Any = None  # None, int or (B,) ints


@dataclass
class EpisodeStats:
    env_id: int
    task: str
    episode_return: float
    length: int
    success: bool  # success at any step of the episode


@dataclass
class StepResult:
    """The env side's answer to one action chunk.

    A chunk stops early where its episode ends. Where `done` (terminated or truncated) the
    env was reset at once: `observation` is the new episode's first observation and the last
    observation of the ended episode is kept in `final_observation` for bootstrapping."""

    observation: Observation
    reward: np.ndarray  # float32 (B,), summed over the executed actions
    terminated: np.ndarray  # bool (B,)
    truncated: np.ndarray  # bool (B,)
    success: np.ndarray  # bool (B,), success at any executed step of this chunk
    executed_steps: np.ndarray  # int64 (B,), actions of the chunk actually executed
    executed_action: np.ndarray  # float32 (B, C, A), after clipping; zero past executed_steps
    final_observation: Observation  # rows valid where `done`
    episodes: list[EpisodeStats] = field(default_factory=list)

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated


@dataclass(frozen=True)
class EnvSpec:
    """What a policy must know about an env before the first observation arrives."""

    state_dim: int
    action_dim: int
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    image_shapes: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    max_episode_steps: int | None = None
    control_hz: float | None = None  # actions per second the env side executes

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "EnvSpec":
        """The spec from `to_dict` after a trip over the wire (lists back to tuples)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
