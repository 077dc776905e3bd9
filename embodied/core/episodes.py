"""A robot's finished episode on its way to a learner (`runtime=robots`): the `episode`
message of the policy protocol. Numpy only, so the robot client stays torch-free.

    states        float32 (T + 1, S)  the observation at each acted tick, then the one after the last action
    actions       float32 (T, A)      what the robot executed (after the safety layer; the operator's while intervening)
    rewards       float32 (T,)
    intervened    bool (T,)           an operator drove this tick
    terminated    bool                the task ended it (success or failure), so the last state has no future
    success       bool                the robot's check, or the operator's label where given
    instruction   str
    policy_version int | None         the weights that acted at the episode's end
    images        {camera: uint8 (T + 1, H, W, 3)}  like `states`, for the cameras the learner's
                                      policy reads (the welcome's `policy_cameras`); absent otherwise
    outcome_images {camera: uint8 (T, H, W, 3)}  what each acted tick led to, for the cameras
                                      the learner's welcome names (`outcome_cameras`: its reward
                                      classifier reads them, and the policy does not, so their
                                      frames are not in `images` already); absent otherwise

Every field is checked against the learner's spec before anything is stored: a malformed
episode is refused whole."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embodied.core.types import EnvSpec

MAX_INSTRUCTION_CHARS = 4096
ACTION_TOLERANCE = 1e-4  # executed actions are clipped to the bounds; allow float rounding


class EpisodeNotTaken(ValueError):
    """A well-formed episode the learner cannot take now (its run is finished, or it is behind)."""


@dataclass
class Episode:
    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    intervened: np.ndarray
    terminated: bool
    success: bool
    instruction: str = ""
    policy_version: int | None = None
    images: dict[str, np.ndarray] = field(default_factory=dict)
    outcome_images: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(len(self.actions))

    def to_message(self) -> dict[str, Any]:
        return {
            "states": self.states.astype(np.float32),
            "actions": self.actions.astype(np.float32),
            "rewards": self.rewards.astype(np.float32),
            "intervened": self.intervened.astype(bool),
            "terminated": bool(self.terminated),
            "success": bool(self.success),
            "instruction": self.instruction,
            "policy_version": self.policy_version,
            **({"images": self.images} if self.images else {}),
            **({"outcome_images": self.outcome_images} if self.outcome_images else {}),
        }


def episode_bytes(
    spec: EnvSpec, ticks: int, outcome_cameras: Sequence[str] = (), policy_cameras: Sequence[str] = ()
) -> int:
    """An upper bound on the size of an episode message of `ticks` ticks."""
    images = sum(math.prod(spec.image_shapes[camera]) for camera in [*outcome_cameras, *policy_cameras])
    frames = sum(math.prod(spec.image_shapes[camera]) for camera in policy_cameras)
    return (
        ticks * (8 * spec.state_dim + 4 * spec.action_dim + 8 + images)
        + 4 * spec.state_dim
        + frames
        + 4 * MAX_INSTRUCTION_CHARS
        + (1 << 16)
    )


def parse_episode(
    body: Any, spec: EnvSpec, max_ticks: int, outcome_cameras: Sequence[str] = (), policy_cameras: Sequence[str] = ()
) -> Episode:
    """The episode in an `episode` message body; ValueError naming the first thing wrong.
    `outcome_cameras`: the cameras whose outcome images the episode must carry;
    `policy_cameras`: those whose frames it must carry like its states."""
    if not isinstance(body, dict):
        raise ValueError("an episode message is a map of states, actions, rewards, intervened, terminated, success")
    actions = _array(body, "actions", np.float32, 2)
    ticks = len(actions)
    if not 1 <= ticks <= max_ticks:
        raise ValueError(f"an episode has 1 to {max_ticks} acted ticks, got {ticks}")
    if actions.shape[1] != spec.action_dim:
        raise ValueError(f"actions must be float32 ({ticks}, {spec.action_dim}), got {actions.shape}")
    states = _array(body, "states", np.float32, 2)
    if states.shape != (ticks + 1, spec.state_dim):
        raise ValueError(
            f"states must be float32 ({ticks + 1}, {spec.state_dim}): one per acted tick and the "
            f"one after the last action; got {states.shape}"
        )
    rewards = _array(body, "rewards", np.float32, 1)
    intervened = _array(body, "intervened", np.bool_, 1)
    for name, array in (("rewards", rewards), ("intervened", intervened)):
        if array.shape != (ticks,):
            raise ValueError(f"{name} must have one entry per acted tick ({ticks}), got {array.shape}")
    for name, array in (("states", states), ("actions", actions), ("rewards", rewards)):
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{name} contain NaN or infinity")
    low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
    if np.any(actions < low - ACTION_TOLERANCE) or np.any(actions > high + ACTION_TOLERANCE):
        raise ValueError("actions lie outside the action bounds: the robot executes only actions within them")
    flags = {}
    for name in ("terminated", "success"):
        if not isinstance(body.get(name), bool):
            raise ValueError(f"{name} must be true or false, got {body.get(name)!r}")
        flags[name] = body[name]
    instruction = body.get("instruction", "")
    if not isinstance(instruction, str) or len(instruction) > MAX_INSTRUCTION_CHARS:
        raise ValueError(f"instruction must be a string of at most {MAX_INSTRUCTION_CHARS} characters")
    version = body.get("policy_version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise ValueError(f"policy_version must be an integer or null, got {version!r}")
    return Episode(
        states=states,
        actions=actions,
        rewards=rewards,
        intervened=intervened,
        terminated=flags["terminated"],
        success=flags["success"],
        instruction=instruction,
        policy_version=version,
        images=_frames(body, "images", spec, ticks + 1, policy_cameras),
        outcome_images=_frames(body, "outcome_images", spec, ticks, outcome_cameras),
    )


FRAME_ROLES = {
    "images": ("policy_cameras", "one frame per acted tick and the one after the last action"),
    "outcome_images": ("outcome_cameras", "one frame per acted tick"),
}


def _frames(body: dict[str, Any], key: str, spec: EnvSpec, count: int, cameras: Sequence[str]) -> dict[str, np.ndarray]:
    images = body.get(key, {})
    welcome_key, meaning = FRAME_ROLES[key]
    if not isinstance(images, dict) or set(images) != set(cameras):
        raise ValueError(
            f"{key} must hold exactly the cameras {sorted(cameras)} (the learner's {welcome_key}), "
            f"got {sorted(images) if isinstance(images, dict) else type(images).__name__}"
        )
    for camera, frames in images.items():
        shape = (count, *spec.image_shapes[camera])
        if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.shape != shape:
            raise ValueError(
                f"{key}['{camera}'] must be uint8 {shape}: {meaning}, got "
                f"{getattr(frames, 'dtype', type(frames).__name__)} {getattr(frames, 'shape', '')}"
            )
    return dict(images)


def _array(body: dict[str, Any], name: str, dtype: Any, ndim: int) -> np.ndarray:
    value = body.get(name)
    if not isinstance(value, np.ndarray) or value.dtype != dtype or value.ndim != ndim:
        raise ValueError(
            f"{name} must be a {ndim}-d {np.dtype(dtype).name} array, got "
            f"{getattr(value, 'dtype', type(value).__name__)} {getattr(value, 'shape', '')}"
        )
    return value
