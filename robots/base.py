"""The Robot interface: what the robot client needs from an arm, a simulator standing in for
one, or a lerobot robot.

Specs are known before `connect()`, so a client can check them against the policy server
while the hardware is still off. `send_action` returns what was actually commanded after the
robot's own clipping, which is what gets logged and learned from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embodied.core.errors import EmbodiedError
from embodied.core.types import EnvSpec


@dataclass
class RobotObservation:
    state: np.ndarray  # float32 (S,)
    images: dict[str, np.ndarray] = field(default_factory=dict)  # uint8 (H, W, 3)
    timestamp: float = 0.0  # time.monotonic() when the observation was read
    end_effector_position: np.ndarray | None = None  # (3,) metres, where the robot reports it


@dataclass
class EpisodeOutcome:
    """What the env side knows about the episode after a step. A real robot without a reward
    source reports zeros and leaves the end of an episode to the operator or a time limit."""

    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    success: bool = False


class RobotError(EmbodiedError):
    """A robot that cannot be used as configured (not connected, wrong spec, driver failure)."""


class Robot(ABC):
    name: str
    instruction: str = ""

    @property
    @abstractmethod
    def spec(self) -> EnvSpec:
        """State and action space, cameras and control rate; available while disconnected."""

    @abstractmethod
    def connect(self) -> None:
        """Open the hardware (or simulator); idempotent."""

    @abstractmethod
    def disconnect(self) -> None:
        """Release the hardware; safe to call twice."""

    @property
    @abstractmethod
    def is_connected(self) -> bool: ...

    @abstractmethod
    def get_observation(self) -> RobotObservation: ...

    @abstractmethod
    def send_action(self, action: np.ndarray) -> np.ndarray:
        """Command one action; returns the action actually sent (after the robot's clipping)."""

    def hold_action(self) -> np.ndarray:
        """The action that keeps the robot where it is (the watchdog's `hold`). Robots that can
        tell (position control) override this."""
        raise RobotError(
            f"{type(self).__name__} cannot tell which action holds its position; where zero "
            f"means 'stay' (velocity or delta control) use safety.safe_action=zero"
        )

    def end_effector_position(self) -> np.ndarray | None:
        """(3,) metres in the base frame, for the safety layer's workspace box; None if unknown."""
        return None

    def outcome(self) -> EpisodeOutcome:
        """Reward and episode end since the last action, where the robot knows them."""
        return EpisodeOutcome()

    def reset_episode(self, seed: int) -> None:
        """Bring the scene to a new initial state. A real robot leaves this to its operator."""

    def __enter__(self) -> "Robot":
        self.connect()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disconnect()

    def _require_connected(self) -> None:
        if not self.is_connected:
            raise RobotError(f"robot '{self.name}' is not connected; call connect() or use it as a context manager")
