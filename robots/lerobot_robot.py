"""lerobot's robots (SO-100/101, Koch, LeKiwi, ...) behind our Robot interface, where lerobot
is installed on the robot PC.

lerobot describes a robot by flat feature dicts: `observation_features` maps a name to
`float` (a joint reading) or to an (H, W, 3) shape (a camera); `action_features` maps a name
to `float`. The state vector is the float readings in that order, the images are the cameras,
the action vector is the action features in order. lerobot publishes no action bounds, so
they come from our config; `hold` commands the current reading of each action's joint.
Note that lerobot robots disable torque on disconnect by default
(`disable_torque_on_disconnect` in lerobot's robot config): an arm left holding goes limp
when the client exits unless that is turned off.
`LeRobotCamera` puts a lerobot camera behind our Camera interface."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from embodied.core.errors import ConfigError
from embodied.core.registry import ROBOTS
from embodied.core.types import EnvSpec
from embodied.robots.base import Robot, RobotError, RobotObservation
from embodied.robots.cameras import Camera, CameraError, fit_image


@dataclass
class LeRobotConfig:
    name: str = "lerobot"
    robot: dict = field(
        default_factory=dict
    )  # lerobot's own robot config, e.g. {type: so101_follower, port: ..., id: ...}
    action_low: list[float] = field(default_factory=list)
    action_high: list[float] = field(default_factory=list)
    control_hz: float = 30.0
    max_episode_steps: int = 600
    instruction: str = ""
    image_size: Optional[list[int]] = None  # (height, width) the policy expects; None: as captured


class LeRobotRobot(Robot):
    """Wraps any object with lerobot's Robot API (`device`)."""

    def __init__(self, device: Any, cfg: LeRobotConfig):
        self.device = device
        self.cfg = cfg
        self.name = f"lerobot:{getattr(device, 'name', type(device).__name__)}"
        self.instruction = cfg.instruction
        features = dict(device.observation_features)
        self.state_keys = [key for key, kind in features.items() if kind is float]
        self.image_keys = [key for key, kind in features.items() if isinstance(kind, tuple)]
        self.action_keys = list(device.action_features)
        if len(cfg.action_low) != len(self.action_keys) or len(cfg.action_high) != len(self.action_keys):
            raise ConfigError(
                f"robot.action_low and robot.action_high need {len(self.action_keys)} values, "
                f"one per action feature: {', '.join(self.action_keys)}"
            )
        size = tuple(cfg.image_size) if cfg.image_size else None
        self._image_size = size
        self._spec = EnvSpec(
            state_dim=len(self.state_keys),
            action_dim=len(self.action_keys),
            action_low=tuple(float(x) for x in cfg.action_low),
            action_high=tuple(float(x) for x in cfg.action_high),
            image_shapes={key: (*size, 3) if size else tuple(features[key]) for key in self.image_keys},
            max_episode_steps=cfg.max_episode_steps,
            control_hz=cfg.control_hz,
        )

    @property
    def spec(self) -> EnvSpec:
        return self._spec

    def connect(self) -> None:
        if not self.device.is_connected:
            self.device.connect()

    def disconnect(self) -> None:
        if self.device.is_connected:
            self.device.disconnect()

    @property
    def is_connected(self) -> bool:
        return bool(self.device.is_connected)

    def get_observation(self) -> RobotObservation:
        self._require_connected()
        raw = self.device.get_observation()
        missing = [key for key in self.state_keys + self.image_keys if key not in raw]
        if missing:
            raise RobotError(f"{self.name} returned an observation without {', '.join(missing)}")
        state = np.asarray([raw[key] for key in self.state_keys], dtype=np.float32)
        images = {key: fit_image(np.asarray(raw[key], dtype=np.uint8), self._image_size) for key in self.image_keys}
        return RobotObservation(state=state, images=images, timestamp=time.monotonic())

    def send_action(self, action: np.ndarray) -> np.ndarray:
        self._require_connected()
        clipped = np.clip(np.asarray(action, dtype=np.float64), self._spec.action_low, self._spec.action_high)
        sent = self.device.send_action({key: float(v) for key, v in zip(self.action_keys, clipped)})
        return np.asarray([sent.get(key, v) for key, v in zip(self.action_keys, clipped)], dtype=np.float32)

    def hold_action(self) -> np.ndarray:
        """Position-controlled joints hold by commanding where they are now (read afresh: a
        reading from the last query could be a second old, and commanding it moves the arm)."""
        unread = [key for key in self.action_keys if key not in self.state_keys]
        if unread:
            raise RobotError(
                f"{self.name}: no reading for action features {', '.join(unread)} to hold at; "
                f"the robot's observation must report each commanded joint"
            )
        raw = self.device.get_observation()
        return np.asarray([raw[key] for key in self.action_keys], dtype=np.float32)


class LeRobotCamera(Camera):
    """A lerobot camera (OpenCV, RealSense, ...: anything with lerobot's `async_read`) behind
    our Camera interface, for robots with their own drivers and lerobot's camera support."""

    def __init__(self, camera: Any, name: str, size: tuple[int, int] | None = None, timeout_ms: float = 200.0):
        self.camera = camera
        self.name = name
        self.size = size
        self.timeout_ms = timeout_ms

    def connect(self) -> None:
        if not self.camera.is_connected:
            self.camera.connect()

    def read_latest(self, max_age_s: float = 1.0) -> tuple[np.ndarray, float]:
        """lerobot's `async_read` returns its background thread's newest frame, waiting at
        most `timeout_ms` for one, and raises when none comes."""
        try:
            frame = self.camera.async_read(timeout_ms=min(self.timeout_ms, max_age_s * 1000))
        except Exception as error:  # lerobot raises TimeoutError or RuntimeError by backend
            raise CameraError(f"camera '{self.name}': {error}") from None
        return fit_image(np.asarray(frame, dtype=np.uint8), self.size), time.monotonic()

    def disconnect(self) -> None:
        if self.camera.is_connected:
            self.camera.disconnect()


@ROBOTS.register("lerobot", LeRobotConfig)
def make_lerobot_robot(cfg: LeRobotConfig) -> Robot:
    import importlib

    if "type" not in cfg.robot:
        raise ConfigError("robot.robot must hold lerobot's robot config with its 'type' (e.g. so101_follower)")
    try:
        import draccus
        from lerobot.robots import RobotConfig
        from lerobot.robots.utils import make_robot_from_config

        importlib.import_module(f"lerobot.robots.{cfg.robot['type']}")  # registers the type's config class
    except ImportError as error:
        raise ConfigError(
            f"robot=lerobot needs lerobot with robot type '{cfg.robot['type']}' installed on this "
            f"machine ({error}); see lerobot's installation guide for your robot"
        ) from None
    return LeRobotRobot(make_robot_from_config(draccus.decode(RobotConfig, dict(cfg.robot))), cfg)
