"""A lerobot leader arm (SO-100/101 leader, Koch leader, ...) as a teleop device: its joint
readings are the follower's action, matched by name.

`i` in the terminal toggles the intervention; `y` / `n` / `b` label the episode. A leader
arm commands absolute joint positions, so taking over while it stands elsewhere than the
follower would make the follower jump: the takeover waits until every joint of the leader is
within `engage_tolerance` (in action units, e.g. degrees) of the follower's, saying how far
off it is, and the safety layer's `max_delta` still limits each step."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from embodied.core.errors import ConfigError
from embodied.core.registry import TELEOPS
from embodied.robots.base import Robot
from embodied.robots.teleop import EpisodeLabels, HeldOrToggled, Teleop, TeleopCommand, TeleopConfig

logger = logging.getLogger(__name__)

WARN_EVERY_S = 2.0


class LeaderArmTeleop(Teleop):
    """`device`: anything with lerobot's Teleoperator API (`action_features`, `get_action()`
    -> {name: value}, `connect()`, `disconnect()`, `is_connected`). `action_names`: the
    follower's action names in its action order; None (a robot that does not name them):
    the leader's own order, which must have as many entries as the action."""

    def __init__(
        self,
        device: Any,
        action_dim: int,
        action_names: list[str] | None = None,
        engage_tolerance: float | None = 5.0,
        driving: bool = False,
    ):
        self.device = device
        features = list(device.action_features)
        if action_names is None:
            if len(features) != action_dim:
                raise ConfigError(
                    f"the leader arm has {len(features)} action features ({', '.join(features)}) and the "
                    f"robot takes {action_dim} actions; without action names they must match one to one"
                )
            action_names = features
        missing = [name for name in action_names if name not in features]
        if missing:
            raise ConfigError(
                f"the leader arm has no reading for the robot's actions {', '.join(missing)} "
                f"(it has {', '.join(features)})"
            )
        if engage_tolerance is not None and engage_tolerance <= 0:
            raise ConfigError(f"teleop.engage_tolerance must be > 0 (or null: no check), got {engage_tolerance}")
        self.action_names = list(action_names)
        self.engage_tolerance = engage_tolerance
        self.driving = driving
        self.toggle = HeldOrToggled("toggle")
        self.toggle.active = driving  # with no policy, the operator is in charge from the start
        self._pressed = False
        self.engaged = False  # actually driving: wanted, and the leader was close enough to take over
        self._warned = 0.0
        self.labels = EpisodeLabels()
        self.keys = {"i": self._press, **self.labels.keys}

    def _press(self) -> None:
        self._pressed = True

    def close(self) -> None:
        if self.device.is_connected:
            self.device.disconnect()

    def reset(self) -> None:
        self.engaged = False  # each episode's takeover checks the pose again

    def poll(self, robot: Robot, policy_action: np.ndarray | None) -> TeleopCommand:
        pressed, self._pressed = self._pressed, False
        wanted = self.toggle.update(pressed)
        reading = self.device.get_action()
        action = np.asarray([reading[name] for name in self.action_names], dtype=np.float32)
        if not wanted:
            self.engaged = False
        elif not self.engaged:
            self.engaged = self._close_enough(robot, action)
        return TeleopCommand(self.engaged, action if self.engaged else None, self.labels.take())

    def _close_enough(self, robot: Robot, action: np.ndarray) -> bool:
        if self.engage_tolerance is None:
            return True
        gap = np.abs(action - robot.hold_action())
        if float(gap.max()) <= self.engage_tolerance:
            return True
        now = time.monotonic()
        if now - self._warned > WARN_EVERY_S:
            worst = int(gap.argmax())
            logger.warning(
                "bring the leader arm to the follower's pose to take over: '%s' is %.1f off "
                "(teleop.engage_tolerance=%.1f)",
                self.action_names[worst],
                gap[worst],
                self.engage_tolerance,
            )
            self._warned = now
        return False


def open_leader_arm(config: dict) -> Any:
    """lerobot's teleoperator from its own config (e.g. {type: so101_leader, port: ..., id: ...}), connected."""
    import importlib

    if "type" not in config:
        raise ConfigError("teleop.leader must hold lerobot's teleoperator config with its 'type' (e.g. so101_leader)")
    try:
        import draccus
        from lerobot.teleoperators import TeleoperatorConfig, make_teleoperator_from_config
    except ImportError as error:
        raise ConfigError(
            f"teleop=leader needs lerobot installed on this machine ({error}); see lerobot's "
            f"installation guide for your arm"
        ) from None
    try:  # registers the type's config class where the package does not import it itself
        importlib.import_module(f"lerobot.teleoperators.{config['type']}")
    except ImportError:
        pass
    device = make_teleoperator_from_config(draccus.decode(TeleoperatorConfig, dict(config)))
    device.connect()
    return device


@TELEOPS.register("leader", TeleopConfig)
def leader_teleop(config: TeleopConfig, action_dim: int, driving: bool, action_names: list[str] | None) -> Teleop:
    return LeaderArmTeleop(open_leader_arm(config.leader), action_dim, action_names, config.engage_tolerance, driving)
