"""Teleoperation: devices behind one interface, polled once per control tick by the robot
client. While the operator intervenes, the operator's action is executed (through the same
safety layer) in place of the policy's, and both are logged with the intervention flag.

- `KeyboardTeleop`: terminal keys (headless, over ssh): `i` toggles intervention; `w`/`s`,
  `a`/`d`, `z`/`x` move along the first three action dimensions; `c` flips the last one (a
  gripper); `y` success, `n` failure, `b` re-record the episode.
- `OracleTeleop`: a scripted operator for simulation that takes over when the policy's
  action drifts from a privileged expert's, and hands back once they agree again.

Events: `success` and `failure` end the episode with that label; `rerecord` ends it,
discards it and runs it again."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from embodied.errors import ConfigError
from robots.base import Robot

EVENTS = ("success", "failure", "rerecord")


@dataclass
class TeleopCommand:
    intervening: bool = False
    action: np.ndarray | None = None  # the operator's action, while intervening
    events: list[str] = field(default_factory=list)


class Teleop(ABC):
    keys: dict[str, Callable[[], None]] = {}  # terminal keys this device reads, if any

    @abstractmethod
    def poll(self, robot: Robot, policy_action: np.ndarray | None) -> TeleopCommand:
        """This tick's command; `policy_action` is what the policy would do now (None when the
        policy has nothing for this tick)."""

    def reset(self) -> None:
        """A new episode begins."""


class OracleTeleop(Teleop):
    """Intervenes after `patience` ticks in a row where the policy's action is farther than
    `threshold` (Euclidean, in action units) from `expert(robot)`, and hands back after
    `release` ticks of agreement (measured on what the policy would have done)."""

    def __init__(self, expert: Callable[[Robot], np.ndarray], threshold: float, patience: int = 1, release: int = 5):
        if threshold <= 0 or patience < 1 or release < 1:
            raise ConfigError("the oracle needs threshold > 0, patience >= 1 and release >= 1")
        self.expert = expert
        self.threshold = threshold
        self.patience = patience
        self.release = release
        self.reset()

    def reset(self) -> None:
        self.intervening = False
        self.streak = 0  # ticks in a row of disagreement (handed back) or agreement (intervening)

    def poll(self, robot: Robot, policy_action: np.ndarray | None) -> TeleopCommand:
        expert = np.asarray(self.expert(robot), dtype=np.float32)
        drifted = policy_action is None or float(np.linalg.norm(policy_action - expert)) > self.threshold
        self.streak = self.streak + 1 if drifted != self.intervening else 0
        if not self.intervening and self.streak >= self.patience:
            self.intervening, self.streak = True, 0
        elif self.intervening and self.streak >= self.release:
            self.intervening, self.streak = False, 0
        return TeleopCommand(self.intervening, expert if self.intervening else None)


class KeyboardTeleop(Teleop):
    MOVES = {"w": (0, 1.0), "s": (0, -1.0), "a": (1, 1.0), "d": (1, -1.0), "z": (2, 1.0), "x": (2, -1.0)}

    def __init__(self, action_dim: int, step: float = 0.5):
        self.action_dim = action_dim
        self.step = step
        self._lock = threading.Lock()
        self._intervening = False
        self._delta = np.zeros(action_dim, dtype=np.float32)
        self._gripper = 1.0
        self._events: list[str] = []
        self.keys = {"i": self._toggle, "c": self._flip_gripper,
                     **{key: (lambda d=dim, s=sign: self._move(d, s)) for key, (dim, sign) in self.MOVES.items()
                        if dim < action_dim},
                     "y": lambda: self._event("success"), "n": lambda: self._event("failure"),
                     "b": lambda: self._event("rerecord")}

    def _toggle(self) -> None:
        with self._lock:
            self._intervening = not self._intervening

    def _move(self, dim: int, sign: float) -> None:
        with self._lock:
            self._delta[dim] += sign * self.step

    def _flip_gripper(self) -> None:
        with self._lock:
            self._gripper = -self._gripper

    def _event(self, name: str) -> None:
        with self._lock:
            self._events.append(name)

    def poll(self, robot: Robot, policy_action: np.ndarray | None) -> TeleopCommand:
        """Key presses since the last tick become this tick's action (zero without any: stay,
        for delta control); the last dimension holds the gripper's state."""
        with self._lock:
            action = self._delta.copy()
            self._delta[:] = 0
            if self.action_dim > 3:
                action[-1] = self._gripper
            events, self._events = self._events, []
            return TeleopCommand(self._intervening, action if self._intervening else None, events)


def checkpoint_expert(checkpoint: str) -> Callable[[Robot], np.ndarray]:
    """A trained policy as the oracle's expert, acting on the robot's observation: for
    simulation, where a state-based expert may coach an image-based policy. Loads torch."""
    from embodied.serve import ServeConfig, load_checkpoint_policy
    from embodied.types import Observation

    infer, _, _ = load_checkpoint_policy(ServeConfig(checkpoint=checkpoint, device="cpu"))

    def expert(robot: Robot) -> np.ndarray:
        seen = robot.get_observation()
        observation = Observation(state=seen.state[None], images={k: v[None] for k, v in seen.images.items()},
                                  instruction=[robot.instruction])
        return infer(observation)[0, 0]

    return expert


def build_teleop(config: object, action_dim: int) -> Teleop:
    name = getattr(config, "name")
    if name == "keyboard":
        return KeyboardTeleop(action_dim, config.step)  # type: ignore[attr-defined]
    if name == "oracle":
        if not config.expert:  # type: ignore[attr-defined]
            raise ConfigError("teleop.name=oracle needs teleop.expert=<run or checkpoint directory>")
        return OracleTeleop(checkpoint_expert(config.expert), config.threshold,  # type: ignore[attr-defined]
                            config.patience, config.release)  # type: ignore[attr-defined]
    raise ConfigError(f"teleop.name must be keyboard or oracle, got '{name}'")
