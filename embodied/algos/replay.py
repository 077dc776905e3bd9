"""Replay buffers of single-step transitions for off-policy learning (SAC/RLPD, WSRL, Cal-QL).

A transition is (state, action, reward, next_state, discount, intervened, mc_return), with
the action in the actor's squashed space [-1, 1]^A and `discount` 0 where the episode
terminated (no bootstrap), 1 otherwise. `mc_return` is the discounted return to the end of
the episode where the whole episode is known (offline data), else -inf: Cal-QL floors the
Q-values of policy actions at it, and -inf means no floor.

From pixels a transition also holds each camera's frames before and after the step, uint8
as the camera gave them (`images`, `next_images`), and, where the learner caches them, the
frozen backbone's features of those frames (`features`, `next_features`).

Buffers are tensors with a fixed capacity, allocated as transitions come (a capacity of
frames is gigabytes, which a short run never fills); their `state_dict` goes into
checkpoints, so a resumed run continues with the same data (its sampling generator
included)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np
import torch

from embodied.algos.buffers import Trajectory
from embodied.algos.datasets import IMAGE_PREFIX, read_frames
from embodied.core.errors import ConfigError


@dataclass
class Transitions:
    state: torch.Tensor  # (N, S)
    action: torch.Tensor  # (N, A) squashed into [-1, 1]
    reward: torch.Tensor  # (N,)
    next_state: torch.Tensor  # (N, S)
    discount: torch.Tensor  # (N,) 0 where terminated
    intervened: torch.Tensor  # (N,) bool: an operator's action
    mc_return: torch.Tensor  # (N,) -inf where unknown
    images: dict[str, torch.Tensor] = field(default_factory=dict)  # camera -> uint8 (N, H, W, 3)
    next_images: dict[str, torch.Tensor] = field(default_factory=dict)
    features: Optional[torch.Tensor] = None  # (N, F) the frozen backbone's, of `images`
    next_features: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return int(self.reward.shape[0])

    def columns(self) -> dict[str, torch.Tensor]:
        """Every tensor by a flat name (`images/<camera>` for frames)."""
        columns = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                columns.update({f"{f.name}/{camera}": image for camera, image in value.items()})
            elif value is not None:
                columns[f.name] = value
        return columns

    @classmethod
    def from_columns(cls, columns: dict[str, torch.Tensor]) -> "Transitions":
        values: dict[str, Any] = {"images": {}, "next_images": {}}
        for name, value in columns.items():
            kind, _, camera = name.partition("/")
            if camera:
                values[kind][camera] = value
            else:
                values[name] = value
        return cls(**values)

    def to(self, device: Any) -> "Transitions":
        return Transitions.from_columns({name: value.to(device) for name, value in self.columns().items()})

    def select(self, rows: Any) -> "Transitions":
        return Transitions.from_columns({name: value[rows] for name, value in self.columns().items()})


def concat(parts: list[Transitions]) -> Transitions:
    columns = [p.columns() for p in parts]  # once per part: this runs for every sampled batch
    return Transitions.from_columns({name: torch.cat([c[name] for c in columns]) for name in columns[0]})


INITIAL_ROWS = 1024  # a buffer's storage to begin with; it grows as transitions come


class ReplayBuffer:
    def __init__(
        self,
        capacity: int,
        state_dim: int,
        action_dim: int,
        seed: int = 0,
        image_shapes: dict[str, tuple[int, ...]] | None = None,
        feature_dim: int = 0,
    ):
        """`image_shapes`: the cameras whose frames transitions carry; `feature_dim` > 0: the
        width of the cached frozen features of those frames."""
        if capacity < 1:
            raise ConfigError(f"a replay buffer needs a capacity >= 1, got {capacity}")
        self.capacity = capacity
        self.state_dim, self.action_dim, self.feature_dim = state_dim, action_dim, feature_dim
        self.image_shapes = dict(image_shapes or {})
        self.data = self._empty(min(capacity, INITIAL_ROWS))
        self.size = 0
        self.cursor = 0  # where the next transition goes; the oldest are overwritten first
        self.added = 0  # ever
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.size

    def _empty(self, rows: int) -> Transitions:
        frames = lambda: {
            camera: torch.zeros(rows, *shape, dtype=torch.uint8) for camera, shape in self.image_shapes.items()
        }  # noqa: E731
        return Transitions(
            state=torch.zeros(rows, self.state_dim),
            action=torch.zeros(rows, self.action_dim),
            reward=torch.zeros(rows),
            next_state=torch.zeros(rows, self.state_dim),
            discount=torch.zeros(rows),
            intervened=torch.zeros(rows, dtype=torch.bool),
            mc_return=torch.full((rows,), -torch.inf),
            images=frames(),
            next_images=frames(),
            features=torch.zeros(rows, self.feature_dim) if self.feature_dim else None,
            next_features=torch.zeros(rows, self.feature_dim) if self.feature_dim else None,
        )

    def _reserve(self, rows: int) -> None:
        """Room for `rows` transitions (at most the capacity): the storage at least doubles when
        it grows, so growing costs a constant share of the copying over a run."""
        allocated = len(self.data)
        if rows <= allocated:
            return
        grown = self._empty(min(self.capacity, max(rows, 2 * allocated)))
        stored = grown.columns()
        for name, value in self.data.columns().items():
            stored[name][:allocated] = value
        self.data = grown

    def add(self, items: Transitions) -> None:
        stored, given = self.data.columns(), items.columns()
        if given.keys() != stored.keys():
            raise ValueError(f"transitions with {sorted(given)} do not fit a buffer of {sorted(stored)}")
        for start in range(0, len(items), self.capacity):
            part = {name: value[start : start + self.capacity] for name, value in given.items()}
            count = len(part["reward"])
            self._reserve(min(self.capacity, self.cursor + count))  # until it is full, cursor == size
            stored = self.data.columns()
            rows = (self.cursor + torch.arange(count)) % self.capacity
            for name, value in part.items():
                stored[name][rows] = value.to(stored[name].dtype)
            self.cursor = int((self.cursor + count) % self.capacity)
            self.size = min(self.size + count, self.capacity)
            self.added += count

    def latest(self, count: int) -> Transitions:
        """The `count` transitions added last, oldest first (all of them where it holds fewer)."""
        count = min(count, self.size)
        return self.data.select((self.cursor - count + torch.arange(count)) % self.capacity)

    def sample(self, count: int, frames: bool = True) -> Transitions:
        """`count` transitions drawn uniformly; without their frames where `frames` is false
        (a learner that reads their cached features only), the same rows either way."""
        if self.size == 0:
            raise ValueError("sampling from an empty replay buffer")
        rows = torch.randint(self.size, (count,), generator=self.generator)
        return (self.data if frames else replace(self.data, images={}, next_images={})).select(rows)

    def state_dict(self) -> dict[str, Any]:
        used = slice(0, self.size)
        return {
            "data": {name: value[used].clone() for name, value in self.data.columns().items()},
            "cursor": self.cursor,
            "added": self.added,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        data = state["data"]
        size = int(data["reward"].shape[0])
        if size > self.capacity:
            raise ValueError(f"a saved buffer of {size} transitions does not fit a capacity of {self.capacity}")
        self._reserve(size)
        stored = self.data.columns()
        if data.keys() != stored.keys():
            raise ValueError(f"a saved buffer of {sorted(data)} does not fit a buffer of {sorted(stored)}")
        for name, value in stored.items():
            value[:size] = data[name]
        self.size, self.cursor, self.added = size, int(state["cursor"]), int(state["added"])
        self.generator.set_state(state["generator"])


def from_trajectory(
    batch: Trajectory, to_squashed: Callable[[torch.Tensor], torch.Tensor], cameras: Iterable[str] = ()
) -> Transitions:
    """The single-step transitions of a rollout batch (chunks of one action), executed actions,
    with the frames of `cameras` before and after each step."""
    if batch.executed_action.shape[2] != 1:
        raise ConfigError("off-policy learning here stores single actions: policy.chunk_size must be 1")
    flat = lambda x: x.reshape(-1, *x.shape[2:]).cpu()  # noqa: E731
    return Transitions(
        state=flat(batch.observation.state).float(),
        action=to_squashed(flat(batch.executed_action[:, :, 0]).float()).cpu(),
        reward=flat(batch.reward).float(),
        next_state=flat(batch.next_state).float(),
        discount=1.0 - flat(batch.terminated).float(),
        intervened=flat(batch.intervened).bool(),
        mc_return=torch.full((batch.num_steps * batch.num_envs,), -torch.inf),
        images={camera: flat(batch.observation.images[camera]) for camera in cameras},
        next_images={camera: flat(batch.next_images[camera]) for camera in cameras},
    )


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """Return-to-go of one whole episode."""
    returns = np.zeros(len(rewards), np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        returns[t] = running
    return returns.astype(np.float32)


def from_dataset(
    root: str | Path,
    to_squashed: Callable[[torch.Tensor], torch.Tensor],
    gamma: float,
    state_dim: int,
    action_dim: int,
    image_shapes: dict[str, tuple[int, ...]] | None = None,
) -> Transitions:
    """Transitions from a LeRobotDataset recorded by the robot client (`robots/recording.py`):
    demonstrations and corrections, with the frames of the cameras in `image_shapes`. An
    episode's last frame is terminal when the episode terminated (`next.terminated`); otherwise
    (a time limit, a stop) it has no next state and is left out. Datasets recorded before that
    column existed end where the task succeeded, so there a successful last frame is terminal."""
    image_shapes = image_shapes or {}
    image_columns = [f"{IMAGE_PREFIX}{camera}" for camera in sorted(image_shapes)]
    frames = read_frames(
        root,
        ["observation.state", "action", "next.reward", "next.success", "episode_index", *image_columns],
        optional=("intervention", "safety_override", "next.terminated"),
        hint="record it with the robot client's record.dataset, with the cameras the policy reads",
    )
    length = len(frames["action"])
    state = frames["observation.state"].astype(np.float32).reshape(length, -1)
    action = frames["action"].astype(np.float32).reshape(length, -1)
    if state.shape[1] != state_dim or action.shape[1] != action_dim:
        raise ConfigError(
            f"the dataset at {root} has states of {state.shape[1]} and actions of {action.shape[1]}; "
            f"the env has {state_dim} and {action_dim}"
        )
    for camera, column in zip(sorted(image_shapes), image_columns):
        if frames[column].shape[1:] != tuple(image_shapes[camera]):
            raise ConfigError(
                f"the dataset at {root} has '{camera}' frames of {frames[column].shape[1:]}; "
                f"the env's are {tuple(image_shapes[camera])}"
            )
    reward = frames["next.reward"].astype(np.float32).reshape(-1)
    success = frames["next.success"].reshape(-1).astype(bool)
    episode = frames["episode_index"].reshape(-1)
    terminated = frames["next.terminated"].reshape(-1).astype(bool) if "next.terminated" in frames else success
    intervened = frames["intervention"].reshape(-1).astype(bool) if "intervention" in frames else np.zeros(length, bool)
    # The safety layer's holds are no one's demonstration: they stay out of the transitions.
    overridden = (
        frames["safety_override"].reshape(-1).astype(bool) if "safety_override" in frames else np.zeros(length, bool)
    )
    keep, following, discount, mc_return = [], [], [], []
    for index in np.unique(episode):
        rows = np.flatnonzero(episode == index)
        returns = discounted_returns(reward[rows], gamma)
        for position, row in enumerate(rows):
            last = position == len(rows) - 1
            if (last and not terminated[row]) or overridden[row]:
                continue  # cut off, not ended (nothing to bootstrap from), or a safety hold
            keep.append(row)
            following.append(row if last else rows[position + 1])  # terminal: never bootstrapped
            discount.append(0.0 if last else 1.0)
            mc_return.append(returns[position])
    rows, next_rows = np.asarray(keep, dtype=np.int64), np.asarray(following, dtype=np.int64)
    if len(rows) == 0:
        raise ConfigError(f"the dataset at {root} holds no usable transitions")
    return Transitions(
        state=torch.from_numpy(state[rows]),
        action=to_squashed(torch.from_numpy(action[rows])).cpu(),
        reward=torch.from_numpy(reward[rows]),
        next_state=torch.from_numpy(state[next_rows]),
        discount=torch.tensor(discount),
        intervened=torch.from_numpy(intervened[rows]),
        mc_return=torch.tensor(mc_return),
        images={c: torch.from_numpy(frames[k][rows]) for c, k in zip(sorted(image_shapes), image_columns)},
        next_images={c: torch.from_numpy(frames[k][next_rows]) for c, k in zip(sorted(image_shapes), image_columns)},
    )
