"""A simulator behind the Robot interface: any single env of `sim/` (ManiSkill, a gymnasium
MuJoCo task, robosuite) driven by the robot client exactly as an arm would be. For tests,
demos and teleop practice without hardware.

It is stepped in real time by the client's control loop: one simulator step per command, at
the control rate; a robot that receives no command stays where it is. The simulator is built
when the robot is created, so its spec is known before `connect()`, as a real robot's is."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from embodied.core.env import SingleObservation
from embodied.core.errors import ConfigError
from embodied.core.registry import ROBOTS
from embodied.core.types import EnvSpec
from embodied.robots.base import EpisodeOutcome, Robot, RobotObservation

logger = logging.getLogger(__name__)

# Batch settings of a training env config that mean nothing for one simulated robot.
BATCH_KEYS = ("num_envs", "num_workers", "transport", "python", "backend")


@dataclass
class SimRobotConfig:
    name: str = "sim"
    env: dict = field(default_factory=dict)  # an env config as in configs/env/*.yaml
    env_from: Optional[str] = None  # or the env a run was trained on: its run or checkpoint directory
    # Action dimensions an idle robot keeps at their last command (e.g. a gripper's target);
    # the others hold at zero, which is "stay" for delta and velocity control modes.
    hold_keeps_dims: list[int] = field(default_factory=list)


def env_config_of(cfg: SimRobotConfig) -> dict[str, Any]:
    """The env config to simulate, from `env` or from a run's saved config."""
    if cfg.env_from:
        from omegaconf import OmegaConf

        path = Path(cfg.env_from).expanduser()
        candidates = [path / "config.yaml", path.parent.parent / "config.yaml"] if path.is_dir() else []
        config_file = next((c for c in candidates if c.is_file()), None)
        if config_file is None:
            raise ConfigError(f"robot.env_from: no config.yaml in '{path}' (expected a run or checkpoint directory)")
        env = OmegaConf.to_container(OmegaConf.load(config_file)).get("env")
        if not isinstance(env, dict):
            raise ConfigError(f"{config_file} has no env section")
        # A run trained under simulated latency (env.latency): the robot is the world, whose
        # delays are the deployment's own (the client's inject_delay_ticks for a study).
        env.pop("latency", None)
    elif cfg.env:
        env = dict(cfg.env)
    else:
        raise ConfigError("a sim robot needs robot.env (an env config) or robot.env_from (a run directory)")
    return {key: value for key, value in env.items() if key not in BATCH_KEYS}


class SimRobot(Robot):
    def __init__(self, cfg: SimRobotConfig):
        from embodied.sim.worker import single_env_factory

        self.cfg = cfg
        env_config = env_config_of(cfg)
        self.env = single_env_factory(env_config)(0)
        self.name = f"sim:{getattr(self.env, 'task', env_config.get('name'))}"
        self.instruction = self.env.instruction
        self._connected = False
        self._observation: SingleObservation | None = None
        self._outcome = EpisodeOutcome()
        self._last_sent = np.zeros(self.env.spec.action_dim, dtype=np.float32)
        for dim in cfg.hold_keeps_dims:
            if not -self.env.spec.action_dim <= dim < self.env.spec.action_dim:
                raise ConfigError(
                    f"robot.hold_keeps_dims: {dim} is not an action dimension "
                    f"(the robot has {self.env.spec.action_dim})"
                )

    @property
    def spec(self) -> EnvSpec:
        return self.env.spec

    def connect(self) -> None:
        if not self._connected:
            self._connected = True
            self.reset_episode(seed=0)

    def disconnect(self) -> None:
        if self._connected:
            self._connected = False
            self.env.close()

    @property
    def is_connected(self) -> bool:
        return self._connected

    def reset_episode(self, seed: int) -> None:
        self._require_connected()
        self._observation = self.env.reset(seed)
        self._outcome = EpisodeOutcome()
        self._last_sent[:] = 0

    def get_observation(self) -> RobotObservation:
        self._require_connected()
        assert self._observation is not None
        return RobotObservation(
            state=self._observation.state,
            images=dict(self._observation.images),
            timestamp=time.monotonic(),
            end_effector_position=self.env.end_effector_position(),
        )

    def end_effector_position(self) -> np.ndarray | None:
        return self.env.end_effector_position()

    def send_action(self, action: np.ndarray) -> np.ndarray:
        self._require_connected()
        spec = self.spec
        sent = np.clip(np.asarray(action, dtype=np.float32), spec.action_low, spec.action_high).astype(np.float32)
        step = self.env.step(sent)
        self._observation = step.observation
        self._outcome = EpisodeOutcome(
            reward=step.reward, terminated=step.terminated, truncated=step.truncated, success=step.success
        )
        self._last_sent = sent
        return sent

    def outcome(self) -> EpisodeOutcome:
        return self._outcome

    def hold_action(self) -> np.ndarray:
        hold = np.zeros_like(self._last_sent)
        for dim in self.cfg.hold_keeps_dims:
            hold[dim] = self._last_sent[dim]
        return hold


@ROBOTS.register("sim", SimRobotConfig)
def make_sim_robot(cfg: SimRobotConfig) -> Robot:
    return SimRobot(cfg)
