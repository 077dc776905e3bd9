"""robosuite 1.5 tasks (Lift, PickPlaceCan, NutAssemblySquare, Stack, ...) behind the batched
env interface, with state or camera observations.

- state: robosuite's own flat vectors, robot proprioception then object state;
- rgb: proprioception as state plus the chosen cameras, flipped vertically so that up is up
  (robosuite renders with OpenGL's bottom-left origin);
- success is the task's own check; by default an episode runs to `max_episode_steps` and
  counts as a success if the check fired at any step (like the ManiSkill adapter), or ends at
  success with `terminate_on_success=true`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from embodied.core.env import BatchedEnv, SingleEnv, SingleObservation, SingleStep
from embodied.core.errors import ConfigError
from embodied.core.registry import ENVS, unknown_name_message
from embodied.core.types import EnvSpec
from embodied.sim.latency import LatencyConfig

INSTRUCTIONS = {
    "Lift": "lift the cube",
    "Stack": "stack the red cube on the green cube",
    "PickPlaceCan": "put the can into its bin",
    "NutAssemblySquare": "fit the square nut onto the square peg",
    "NutAssemblyRound": "fit the round nut onto the round peg",
    "Door": "open the door",
}
OBS_MODES = ("state", "rgb")


@dataclass
class RobosuiteConfig:
    name: str = "robosuite"
    task: str = "Lift"
    robot: str = "Panda"
    num_envs: int = 4
    num_workers: int = 0
    transport: str = "pipe"  # to worker processes: pipe | zmq
    python: Optional[str] = None  # zmq workers: interpreter to run them (default: this one)
    obs_mode: str = "state"  # state | rgb
    cameras: list[str] = field(default_factory=lambda: ["agentview", "robot0_eye_in_hand"])
    image_size: int = 128
    control_freq: int = 20
    max_episode_steps: int = 200
    reward_shaping: bool = True
    terminate_on_success: bool = False  # run to the time limit; success counts at any step
    render_size: int = 256
    mujoco_gl: str = "egl"  # offscreen rendering backend for rgb and videos: egl | osmesa
    instruction: Optional[str] = None
    latency: LatencyConfig = field(default_factory=LatencyConfig)  # delays between world and policy (docs/robots.md)


def check_config(cfg: RobosuiteConfig) -> None:
    if cfg.task not in INSTRUCTIONS:
        raise ConfigError(unknown_name_message("robosuite task (env.task)", cfg.task, sorted(INSTRUCTIONS)))
    if cfg.obs_mode not in OBS_MODES:
        raise ConfigError(f"env.obs_mode must be one of {OBS_MODES}, got '{cfg.obs_mode}'")
    if cfg.obs_mode == "rgb" and not cfg.cameras:
        raise ConfigError("env.obs_mode=rgb needs at least one camera in env.cameras")
    if cfg.num_envs < 1 or cfg.max_episode_steps < 1:
        raise ConfigError("env.num_envs and env.max_episode_steps must be >= 1")


class RobosuiteEnv(SingleEnv):
    def __init__(self, cfg: RobosuiteConfig, env_id: int = 0):
        os.environ.setdefault("MUJOCO_GL", cfg.mujoco_gl)
        import robosuite

        check_config(cfg)
        rgb = cfg.obs_mode == "rgb"
        self.cfg = cfg
        self.cameras = list(cfg.cameras) if rgb else []
        self.env = robosuite.make(
            cfg.task,
            robots=cfg.robot,
            has_renderer=False,
            has_offscreen_renderer=True,
            use_camera_obs=rgb,
            camera_names=self.cameras or "agentview",
            camera_heights=cfg.image_size,
            camera_widths=cfg.image_size,
            reward_shaping=cfg.reward_shaping,
            control_freq=cfg.control_freq,
            horizon=cfg.max_episode_steps,
            ignore_done=True,  # this adapter ends episodes itself, keeping truncation apart
        )
        self.task = cfg.task
        self.instruction = cfg.instruction or INSTRUCTIONS[cfg.task]
        self.steps = 0
        low, high = self.env.action_spec
        first = self._observation(self.env.reset())
        size = cfg.image_size
        self.spec = EnvSpec(
            state_dim=int(first.state.shape[0]),
            action_dim=int(low.shape[0]),
            action_low=tuple(float(x) for x in low),
            action_high=tuple(float(x) for x in high),
            image_shapes={c: (size, size, 3) for c in self.cameras},
            max_episode_steps=cfg.max_episode_steps,
            control_hz=float(cfg.control_freq),
        )

    def _observation(self, raw: dict) -> SingleObservation:
        robot = raw["robot0_proprio-state"]
        state = robot if self.cameras else np.concatenate([robot, raw["object-state"]])
        images = {c: np.ascontiguousarray(raw[f"{c}_image"][::-1]) for c in self.cameras}
        return SingleObservation(state=state.astype(np.float32), images=images)

    def reset(self, seed: int) -> SingleObservation:
        # The env's generator is shared with its object placement samplers and robot
        # initialisation noise: rewinding it in place makes the episode a function of the seed.
        self.env.rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state
        self.steps = 0
        return self._observation(self.env.reset())

    def step(self, action: np.ndarray) -> SingleStep:
        raw, reward, _, _ = self.env.step(np.asarray(action, dtype=np.float64))
        self.steps += 1
        success = bool(self.env._check_success())
        terminated = success and self.cfg.terminate_on_success
        return SingleStep(
            observation=self._observation(raw),
            reward=float(reward),
            terminated=terminated,
            truncated=not terminated and self.steps >= self.cfg.max_episode_steps,
            success=success,
        )

    def render(self) -> np.ndarray:
        size = self.cfg.render_size
        return np.ascontiguousarray(self.env.sim.render(height=size, width=size, camera_name="agentview")[::-1])

    def close(self) -> None:
        self.env.close()


@ENVS.register("robosuite", RobosuiteConfig)
def make_robosuite(
    cfg: RobosuiteConfig, seed: int, stream: int = 0, env_ids: Sequence[int] | None = None
) -> BatchedEnv:
    from embodied.sim.vector import vectorize_config

    check_config(cfg)
    # not robosuite preloaded: each worker imports it after setting MUJOCO_GL
    return vectorize_config(RobosuiteEnv, cfg, seed, stream, env_ids, preload=(__name__,))
