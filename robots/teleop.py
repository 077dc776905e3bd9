"""Teleoperation: devices behind one interface, polled once per control tick by the robot
client. While the operator intervenes, the operator's action is executed (through the same
safety layer) in place of the policy's, and both are logged with the intervention flag.

- `KeyboardTeleop`: terminal keys (headless, over ssh): `i` toggles intervention; `w`/`s`,
  `a`/`d`, `z`/`x` move along the first three action dimensions; `c` flips the last one (a
  gripper); `y` success, `n` failure, `b` re-record the episode.
- `GamepadTeleop`: a gamepad through pygame; intervention while a button is held, or
  toggled by it (`teleop.intervention`).
- `SpaceMouseTeleop`: a 3Dconnexion SpaceMouse through pyspacemouse; translation and
  rotation drive the action, intervention while the knob is moved (or a button, held or
  toggled), the left button toggles the gripper, terminal keys label the episode.
- `LeaderArmTeleop` (`robots/leader_arm.py`): a lerobot leader arm whose joints are the
  follower's action; `i` toggles the intervention, which waits for the leader to match the
  follower's pose.
- `OracleTeleop`: a policy playing the operator in simulation (`teleop.operator`), which takes
  over when the policy's action drifts from its own, and hands back once they agree again.

Events: `success` and `failure` end the episode with that label; `rerecord` ends it,
discards it and runs it again."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from embodied.core.errors import ConfigError
from embodied.core.operator import OperatorConfig
from embodied.core.registry import TELEOPS
from embodied.robots.base import Robot

EVENTS = ("success", "failure", "rerecord")


@dataclass
class TeleopConfig:
    name: str = "keyboard"  # keyboard | gamepad | spacemouse | leader | oracle
    step: float = 0.5  # keyboard: action units per key press; gamepad, spacemouse: per full deflection
    intervention: str = "hold"  # gamepad: hold | toggle; spacemouse: motion | hold | toggle
    # oracle: the policy that plays the operator (a run in simulation) and when it takes over, in ticks
    operator: OperatorConfig = field(default_factory=OperatorConfig)
    leader: dict = field(default_factory=dict)  # leader: lerobot's teleoperator config ({type: so101_leader, port, id})
    engage_tolerance: Optional[float] = (
        5.0  # leader: take over only within this of the follower's pose (null: no check)
    )


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

    def close(self) -> None:
        """The run is over: let go of the device."""


class OracleRule:
    """When a simulated operator takes over, for `envs` envs at once: after `patience` ticks in
    a row where the policy's action is farther than `threshold` (Euclidean, in action units)
    from the operator's, and it hands back after `release` ticks of agreement (measured on what
    the policy would have done) or, with `max_takeover` > 0, after that many ticks of driving,
    as a person who corrects and lets go. Shared by the robot client's oracle and simulated
    training."""

    def __init__(self, threshold: float, patience: int = 1, release: int = 5, envs: int = 1, max_takeover: int = 0):
        if threshold <= 0 or patience < 1 or release < 1 or max_takeover < 0:
            raise ConfigError("the operator needs threshold > 0, patience >= 1, release >= 1 and max_takeover >= 0")
        self.threshold = threshold
        self.patience = patience
        self.release = release
        self.max_takeover = max_takeover
        self.intervening = np.zeros(envs, dtype=bool)
        self.streak = np.zeros(envs, dtype=np.int64)  # ticks in a row of disagreement (handed back) or agreement
        self.driven = np.zeros(envs, dtype=np.int64)  # ticks of this takeover so far

    def reset(self, rows: np.ndarray | slice = slice(None)) -> None:
        self.intervening[rows] = False
        self.streak[rows] = 0
        self.driven[rows] = 0

    def step(self, policy_actions: np.ndarray | None, operator_actions: np.ndarray) -> np.ndarray:
        """Which envs the operator drives this tick; actions are (envs, A), None: no policy action."""
        if policy_actions is None:
            drifted = np.ones(len(self.intervening), dtype=bool)
        else:
            drifted = np.linalg.norm(policy_actions - operator_actions, axis=-1) > self.threshold
        self.streak = np.where(drifted != self.intervening, self.streak + 1, 0)
        take_over = ~self.intervening & (self.streak >= self.patience)
        enough = (self.driven >= self.max_takeover) if self.max_takeover else np.zeros_like(self.intervening)
        hand_back = self.intervening & ((self.streak >= self.release) | enough)
        self.intervening = (self.intervening | take_over) & ~hand_back
        self.streak[take_over | hand_back] = 0
        self.driven = np.where(self.intervening, self.driven + 1, 0)
        return self.intervening.copy()


class OracleTeleop(Teleop):
    """The oracle rule for one robot, with `operate(robot)` as the operator's action."""

    def __init__(
        self,
        operate: Callable[[Robot], np.ndarray],
        threshold: float,
        patience: int = 1,
        release: int = 5,
        max_takeover: int = 0,
    ):
        self.operate = operate
        self.rule = OracleRule(threshold, patience, release, max_takeover=max_takeover)

    def reset(self) -> None:
        self.rule.reset()

    def poll(self, robot: Robot, policy_action: np.ndarray | None) -> TeleopCommand:
        operated = np.asarray(self.operate(robot), dtype=np.float32)
        intervening = bool(self.rule.step(None if policy_action is None else policy_action[None], operated[None])[0])
        return TeleopCommand(intervening, operated if intervening else None)


class EpisodeLabels:
    """Episode labels from terminal keys (`y` success, `n` failure, `b` re-record), pressed
    in the key thread and taken once per tick."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[str] = []
        self.keys = {
            key: (lambda name=name: self._add(name))
            for key, name in (("y", "success"), ("n", "failure"), ("b", "rerecord"))
        }

    def _add(self, name: str) -> None:
        with self._lock:
            self._events.append(name)

    def take(self) -> list[str]:
        with self._lock:
            events, self._events = self._events, []
        return events


class KeyboardTeleop(Teleop):
    MOVES = {"w": (0, 1.0), "s": (0, -1.0), "a": (1, 1.0), "d": (1, -1.0), "z": (2, 1.0), "x": (2, -1.0)}

    def __init__(self, action_dim: int, step: float = 0.5, driving: bool = False):
        self.action_dim = action_dim
        self.step = step
        self._lock = threading.Lock()
        self._intervening = driving  # in charge from the start (no policy to take over from)
        self._delta = np.zeros(action_dim, dtype=np.float32)
        self._gripper = 1.0
        self.labels = EpisodeLabels()
        self.keys = {
            "i": self._toggle,
            "c": self._flip_gripper,
            **{
                key: (lambda d=dim, s=sign: self._move(d, s))
                for key, (dim, sign) in self.MOVES.items()
                if dim < action_dim
            },
            **self.labels.keys,
        }

    def _toggle(self) -> None:
        with self._lock:
            self._intervening = not self._intervening

    def _move(self, dim: int, sign: float) -> None:
        with self._lock:
            self._delta[dim] += sign * self.step

    def _flip_gripper(self) -> None:
        with self._lock:
            self._gripper = -self._gripper

    def poll(self, robot: Robot, policy_action: np.ndarray | None) -> TeleopCommand:
        """Key presses since the last tick become this tick's action (zero without any: stay,
        for delta control); the last dimension holds the gripper's state."""
        with self._lock:
            action = self._delta.copy()
            self._delta[:] = 0
            if self.action_dim > 3:
                action[-1] = self._gripper
            return TeleopCommand(self._intervening, action if self._intervening else None, self.labels.take())


class HeldOrToggled:
    """Intervention from a button: `hold` intervenes while it is down, `toggle` flips on
    each press (operators of the anchors disagree on which is safer; it is a setting here)."""

    def __init__(self, mode: str):
        if mode not in ("hold", "toggle"):
            raise ConfigError(f"teleop.intervention must be 'hold' or 'toggle', got '{mode}'")
        self.mode = mode
        self.active = False
        self._was_down = False

    def update(self, down: bool) -> bool:
        if self.mode == "hold":
            self.active = down
        elif down and not self._was_down:
            self.active = not self.active
        self._was_down = down
        return self.active


class GamepadTeleop(Teleop):
    """A gamepad through pygame (`joystick`: a `pygame.joystick.Joystick`, or anything with
    its get_axis/get_button). Sticks drive the first three action dimensions (left x/y,
    right y), scaled by `scale`, with a dead zone; the right shoulder button intervenes,
    A/B label success/failure, X re-records, the left shoulder toggles the gripper."""

    AXES = (0, 1, 4)  # left stick x, left stick y, right stick y (SDL's usual layout)
    INTERVENE, GRIPPER, SUCCESS, FAILURE, RERECORD = 5, 4, 0, 1, 2

    def __init__(
        self,
        joystick: object,
        action_dim: int,
        intervention: str = "hold",
        scale: float = 1.0,
        dead_zone: float = 0.1,
        driving: bool = False,
    ):
        self.joystick = joystick
        self.action_dim = action_dim
        self.scale = scale
        self.dead_zone = dead_zone
        self.intervention = HeldOrToggled(intervention)
        self.intervention.active = driving and intervention == "toggle"  # hold: the button is a dead man's switch
        self.gripper = HeldOrToggled("toggle")
        self._pressed: set[int] = set()

    def _press(self, button: int) -> bool:
        """True once per press of `button`."""
        down = bool(self.joystick.get_button(button))  # type: ignore[attr-defined]
        fresh = down and button not in self._pressed
        self._pressed = (self._pressed | {button}) if down else (self._pressed - {button})
        return fresh

    def poll(self, robot: Robot, policy_action: np.ndarray | None) -> TeleopCommand:
        stick = np.array([self.joystick.get_axis(axis) for axis in self.AXES], dtype=np.float32)  # type: ignore[attr-defined]
        stick[np.abs(stick) < self.dead_zone] = 0.0
        stick[1:] *= -1  # stick up is negative in SDL; up means + here
        action = np.zeros(self.action_dim, dtype=np.float32)
        moves = min(3, self.action_dim)
        action[:moves] = self.scale * stick[:moves]
        if self.action_dim > 3:
            action[-1] = -1.0 if self.gripper.update(bool(self.joystick.get_button(self.GRIPPER))) else 1.0  # type: ignore[attr-defined]
        events = [
            name
            for name, button in (("success", self.SUCCESS), ("failure", self.FAILURE), ("rerecord", self.RERECORD))
            if self._press(button)
        ]
        intervening = self.intervention.update(bool(self.joystick.get_button(self.INTERVENE)))  # type: ignore[attr-defined]
        return TeleopCommand(intervening, action if intervening else None, events)


class SpaceMouseTeleop(Teleop):
    """A SpaceMouse (`device`: what `pyspacemouse.open()` returns, or anything with its
    `read()` -> state with x, y, z, roll, pitch, yaw in [-1, 1] and `buttons`).

    Translation drives the first three action dimensions; rotation the next three where the
    action has room for them besides the gripper (7-d: position, rotation, gripper); both
    scaled by `scale`, with a dead zone. `intervention`: `motion` (HIL-SERL's: intervening
    while the knob is off centre, and `linger` ticks after, so a pause does not hand back
    mid-correction), `hold` or `toggle` on the right button. The left button toggles the
    gripper (the last dimension); `y` / `n` / `b` in the terminal label the episode."""

    GRIPPER, INTERVENE = 0, 1  # left and right button

    def __init__(
        self,
        device: object,
        action_dim: int,
        intervention: str = "motion",
        scale: float = 1.0,
        dead_zone: float = 0.05,
        linger: int = 5,
        driving: bool = False,
    ):
        if intervention not in ("motion", "hold", "toggle"):
            raise ConfigError(
                f"teleop.intervention must be motion, hold or toggle for a SpaceMouse, got '{intervention}'"
            )
        self.device = device
        self.action_dim = action_dim
        self.scale = scale
        self.dead_zone = dead_zone
        self.linger = linger
        self.mode = intervention
        self.button = HeldOrToggled("toggle" if intervention == "toggle" else "hold")
        self.button.active = driving and intervention == "toggle"  # hold: the button is a dead man's switch
        self.driving = driving
        self.gripper = HeldOrToggled("toggle")
        self._still = linger + 1  # ticks since the knob last moved
        self.labels = EpisodeLabels()
        self.keys = self.labels.keys

    def reset(self) -> None:
        self._still = self.linger + 1

    def poll(self, robot: Robot, policy_action: np.ndarray | None) -> TeleopCommand:
        state = self.device.read()  # type: ignore[attr-defined]
        motion = np.array([state.x, state.y, state.z, state.roll, state.pitch, state.yaw], dtype=np.float32)
        motion[np.abs(motion) < self.dead_zone] = 0.0
        buttons = list(state.buttons) + [0, 0]
        action = np.zeros(self.action_dim, dtype=np.float32)
        gripper = self.action_dim > 3
        moves = min(6 if self.action_dim >= 7 else 3, self.action_dim - int(gripper))
        action[:moves] = self.scale * motion[:moves]
        if gripper:
            action[-1] = -1.0 if self.gripper.update(bool(buttons[self.GRIPPER])) else 1.0
        if self.mode == "motion":
            self._still = 0 if motion.any() else self._still + 1
            intervening = self.driving or self._still <= self.linger
        else:
            intervening = self.button.update(bool(buttons[self.INTERVENE]))
        return TeleopCommand(intervening, action if intervening else None, self.labels.take())


def open_spacemouse() -> object:
    try:
        import pyspacemouse
    except ImportError:
        raise ConfigError(
            "teleop=spacemouse needs pyspacemouse and the hidapi library: pip install 'embodied-rl[teleop]'"
        ) from None
    try:
        return pyspacemouse.open(nonblocking=True)
    except (RuntimeError, ValueError, OSError) as error:
        raise ConfigError(f"no SpaceMouse could be opened: {error}") from None


def open_gamepad(index: int = 0) -> object:
    try:
        import pygame
    except ImportError:
        raise ConfigError("teleop=gamepad needs pygame: pip install pygame") from None
    pygame.init()
    pygame.joystick.init()
    if pygame.joystick.get_count() <= index:
        raise ConfigError(f"no gamepad {index} found ({pygame.joystick.get_count()} connected)")
    joystick = pygame.joystick.Joystick(index)
    joystick.init()

    class Pumped:  # pygame updates joystick state only while its event queue is pumped
        def get_axis(self, axis: int) -> float:
            pygame.event.pump()
            return joystick.get_axis(axis)

        def get_button(self, button: int) -> int:
            return joystick.get_button(button)

    return Pumped()


# The operator devices, by `teleop.name`. Each builds its teleop from the config, the robot's
# action size, whether the operator drives from the start (no policy) and the robot's names
# for its action dimensions. The oracle, which loads a run's policy, registers in the robot CLI.
@TELEOPS.register("keyboard", TeleopConfig)
def keyboard_teleop(config: TeleopConfig, action_dim: int, driving: bool, action_names: list[str] | None) -> Teleop:
    return KeyboardTeleop(action_dim, config.step, driving)


@TELEOPS.register("gamepad", TeleopConfig)
def gamepad_teleop(config: TeleopConfig, action_dim: int, driving: bool, action_names: list[str] | None) -> Teleop:
    return GamepadTeleop(open_gamepad(), action_dim, config.intervention, config.step, driving=driving)


@TELEOPS.register("spacemouse", TeleopConfig)
def spacemouse_teleop(config: TeleopConfig, action_dim: int, driving: bool, action_names: list[str] | None) -> Teleop:
    return SpaceMouseTeleop(open_spacemouse(), action_dim, config.intervention, config.step, driving=driving)
