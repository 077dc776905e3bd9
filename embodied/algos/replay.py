"""Replay buffers of single-step transitions for off-policy learning (SAC/RLPD, WSRL, Cal-QL).

A transition is (state, action, reward, next_state, discount, intervened, mc_return), with
the action in the actor's squashed space [-1, 1]^A and `discount` 0 where the episode
terminated (no bootstrap), 1 otherwise. `mc_return` is the discounted return to the end of
the episode where the whole episode is known (offline data), else -inf: Cal-QL floors the
Q-values of policy actions at it, and -inf means no floor.

Buffers are tensors with a fixed capacity; their `state_dict` goes into checkpoints, so a
resumed run continues with the same data (its sampling generator included)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from embodied.algos.buffers import Trajectory
from embodied.algos.datasets import read_frames
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

    def __len__(self) -> int:
        return int(self.reward.shape[0])

    def to(self, device: Any) -> "Transitions":
        return Transitions(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def concat(parts: list[Transitions]) -> Transitions:
    return Transitions(**{f.name: torch.cat([getattr(p, f.name) for p in parts]) for f in fields(Transitions)})


class ReplayBuffer:
    def __init__(self, capacity: int, state_dim: int, action_dim: int, seed: int = 0):
        if capacity < 1:
            raise ConfigError(f"a replay buffer needs a capacity >= 1, got {capacity}")
        self.capacity = capacity
        self.data = Transitions(
            state=torch.zeros(capacity, state_dim),
            action=torch.zeros(capacity, action_dim),
            reward=torch.zeros(capacity),
            next_state=torch.zeros(capacity, state_dim),
            discount=torch.zeros(capacity),
            intervened=torch.zeros(capacity, dtype=torch.bool),
            mc_return=torch.full((capacity,), -torch.inf),
        )
        self.size = 0
        self.cursor = 0  # where the next transition goes; the oldest are overwritten first
        self.added = 0  # ever
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.size

    def add(self, items: Transitions) -> None:
        for start in range(0, len(items), self.capacity):
            part = Transitions(
                **{f.name: getattr(items, f.name)[start : start + self.capacity] for f in fields(Transitions)}
            )
            rows = (self.cursor + torch.arange(len(part))) % self.capacity
            for f in fields(Transitions):
                getattr(self.data, f.name)[rows] = getattr(part, f.name).to(getattr(self.data, f.name).dtype)
            self.cursor = int((self.cursor + len(part)) % self.capacity)
            self.size = min(self.size + len(part), self.capacity)
            self.added += len(part)

    def sample(self, count: int) -> Transitions:
        if self.size == 0:
            raise ValueError("sampling from an empty replay buffer")
        rows = torch.randint(self.size, (count,), generator=self.generator)
        return Transitions(**{f.name: getattr(self.data, f.name)[rows] for f in fields(Transitions)})

    def state_dict(self) -> dict[str, Any]:
        used = slice(0, self.size)
        return {
            "data": {f.name: getattr(self.data, f.name)[used].clone() for f in fields(Transitions)},
            "cursor": self.cursor,
            "added": self.added,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        data = state["data"]
        size = int(data["reward"].shape[0])
        if size > self.capacity:
            raise ValueError(f"a saved buffer of {size} transitions does not fit a capacity of {self.capacity}")
        for f in fields(Transitions):
            getattr(self.data, f.name)[:size] = data[f.name]
        self.size, self.cursor, self.added = size, int(state["cursor"]), int(state["added"])
        self.generator.set_state(state["generator"])


def from_trajectory(batch: Trajectory, to_squashed: Callable[[torch.Tensor], torch.Tensor]) -> Transitions:
    """The single-step transitions of a rollout batch (chunks of one action), executed actions."""
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
    root: str | Path, to_squashed: Callable[[torch.Tensor], torch.Tensor], gamma: float, state_dim: int, action_dim: int
) -> Transitions:
    """Transitions from a LeRobotDataset recorded by the robot client (`robots/recording.py`):
    demonstrations and corrections. An episode's last frame is terminal when it succeeded;
    otherwise it has no next state and is left out."""
    frames = read_frames(
        root,
        ["observation.state", "action", "next.reward", "next.success", "episode_index"],
        optional=("intervention", "safety_override"),
    )
    length = len(frames["action"])
    state = frames["observation.state"].astype(np.float32).reshape(length, -1)
    action = frames["action"].astype(np.float32).reshape(length, -1)
    if state.shape[1] != state_dim or action.shape[1] != action_dim:
        raise ConfigError(
            f"the dataset at {root} has states of {state.shape[1]} and actions of {action.shape[1]}; "
            f"the env has {state_dim} and {action_dim}"
        )
    reward = frames["next.reward"].astype(np.float32).reshape(-1)
    success = frames["next.success"].reshape(-1).astype(bool)
    episode = frames["episode_index"].reshape(-1)
    intervened = frames["intervention"].reshape(-1).astype(bool) if "intervention" in frames else np.zeros(length, bool)
    # The safety layer's holds are no one's demonstration: they stay out of the transitions.
    overridden = (
        frames["safety_override"].reshape(-1).astype(bool) if "safety_override" in frames else np.zeros(length, bool)
    )
    keep, next_state, discount, mc_return = [], [], [], []
    for index in np.unique(episode):
        rows = np.flatnonzero(episode == index)
        returns = discounted_returns(reward[rows], gamma)
        for position, row in enumerate(rows):
            last = position == len(rows) - 1
            if (last and not success[row]) or overridden[row]:
                continue  # cut off, not ended (nothing to bootstrap from), or a safety hold
            keep.append(row)
            next_state.append(state[row] if last else state[rows[position + 1]])
            discount.append(0.0 if last else 1.0)
            mc_return.append(returns[position])
    rows = np.asarray(keep, dtype=np.int64)
    if len(rows) == 0:
        raise ConfigError(f"the dataset at {root} holds no usable transitions")
    return Transitions(
        state=torch.from_numpy(state[rows]),
        action=to_squashed(torch.from_numpy(action[rows])).cpu(),
        reward=torch.from_numpy(reward[rows]),
        next_state=torch.from_numpy(np.stack(next_state)),
        discount=torch.tensor(discount),
        intervened=torch.from_numpy(intervened[rows]),
        mc_return=torch.tensor(mc_return),
    )
