"""What ManiSkill's CPU and GPU adapters share: the config, the tasks and their
instructions, building ManiSkill's gym env, and reading its observations and spec."""

from __future__ import annotations

import gc
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager, Iterator, Optional

import numpy as np

from embodied.core.errors import ConfigError
from embodied.core.registry import unknown_name_message
from embodied.core.types import EnvSpec
from embodied.sim.latency import LatencyConfig
from embodied.sim.sapien_shaders import check_scene, use_lean_shaders

# Tasks whose assets ship inside the mani-skill wheel (others download assets at run time).
INSTRUCTIONS = {
    "PushCube-v1": "push the cube to the goal region",
    "PickCube-v1": "pick up the cube and move it to the goal position",
    "StackCube-v1": "stack the red cube on top of the green cube",
    "PegInsertionSide-v1": "insert the peg into the hole on the side of the box",
    "PushT-v1": "push the T-shaped block onto the target",
    "PullCube-v1": "pull the cube to the goal region",
    "LiftPegUpright-v1": "lift the peg and stand it upright",
    "PokeCube-v1": "use the peg to poke the cube to the goal",
    "RollBall-v1": "roll the ball to the goal region",
}
OBS_MODES = ("state", "rgb")
BACKENDS = ("cpu", "gpu", "cpu_batched")


@dataclass
class ManiSkillConfig:
    name: str = "maniskill"
    task: str = "PushCube-v1"
    num_envs: int = 16
    num_workers: int = 0  # cpu backend: worker processes holding the envs (0: this process)
    transport: str = "pipe"  # to worker processes: pipe | zmq
    python: Optional[str] = None  # zmq workers: interpreter to run them (default: this one)
    # cpu (physx_cpu, one scene per env) | gpu (physx_cuda, num_envs in one scene) | cpu_batched (the gpu
    # backend's code on physx_cpu with one env: that path checked on a machine without a GPU)
    backend: str = "cpu"
    obs_mode: str = "state"  # state | rgb
    control_mode: str = "pd_joint_delta_pos"
    reward_mode: str = "normalized_dense"
    image_size: int = 128  # camera width and height for obs_mode=rgb
    # ManiSkill's robot (null: the task's own, panda for most). panda_wristcam is the Panda with a
    # hand camera (`hand_camera`) beside the task's base camera; PickCube's dense reward names panda
    # alone in its "held still" term, so with panda_wristcam that term also counts the fingers' velocity.
    robot: Optional[str] = None
    max_episode_steps: Optional[int] = None  # None: the task's own limit
    # Run every episode to the time limit instead of ending it at success (success still
    # counts if reached at any step). With dense rewards, ending at success teaches the
    # agent to hover just short of it, where reward keeps coming.
    ignore_terminations: bool = True
    instruction: Optional[str] = None  # None: the built-in instruction for the task
    render_size: int = 256  # frames for videos
    tasks: Optional[list[str]] = None  # several tasks in blocks of envs (replaces `task`; see above)
    state_dim: Optional[int] = None  # pad every state to this length (null: set for `tasks`, else unpadded)
    latency: LatencyConfig = field(default_factory=LatencyConfig)  # delays between world and policy (docs/robots.md)


def check_config(cfg: ManiSkillConfig) -> None:
    for task in cfg.tasks or [cfg.task]:
        if task not in INSTRUCTIONS:
            name = "env.tasks" if cfg.tasks else "env.task"
            raise ConfigError(unknown_name_message(f"ManiSkill task ({name})", task, sorted(INSTRUCTIONS)))
    if cfg.tasks is not None:
        if not cfg.tasks:
            raise ConfigError("env.tasks is empty: name at least one task (or null for env.task)")
        if cfg.backend != "cpu":
            raise ConfigError("env.tasks runs on the cpu backend (a physx_cuda scene holds one task)")
        if cfg.num_envs < len(cfg.tasks):
            raise ConfigError(f"env.num_envs={cfg.num_envs} cannot give each of {len(cfg.tasks)} tasks an env")
        if cfg.instruction is not None:
            raise ConfigError("env.instruction names one task's instruction; with env.tasks each task has its own")
    if cfg.obs_mode not in OBS_MODES:
        raise ConfigError(f"env.obs_mode must be one of {OBS_MODES}, got '{cfg.obs_mode}'")
    if cfg.backend not in BACKENDS:
        raise ConfigError(f"env.backend must be one of {', '.join(BACKENDS)}, got '{cfg.backend}'")
    if cfg.backend != "cpu" and LatencyConfig.from_value(cfg.latency).active:
        raise ConfigError("env.latency delays the cpu backend's single envs; it is not built for a batched backend")
    if cfg.backend == "cpu_batched" and cfg.num_envs != 1:
        raise ConfigError(
            f"env.backend=cpu_batched holds one env (physx_cpu scenes are single), got num_envs={cfg.num_envs}"
        )
    if cfg.num_envs < 1:
        raise ConfigError(f"env.num_envs must be >= 1, got {cfg.num_envs}")


def make_gym_env(cfg: ManiSkillConfig, num_envs: int, sim_backend: str, **extra: Any) -> Any:
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401  (registers the tasks)
    import torch

    kwargs: dict[str, Any] = dict(
        obs_mode=cfg.obs_mode,
        num_envs=num_envs,
        sim_backend=sim_backend,
        control_mode=cfg.control_mode,
        reward_mode=cfg.reward_mode,
        render_mode="rgb_array",
        # Without CUDA, render with SAPIEN's CPU (Vulkan llvmpipe) device directly instead
        # of asking for a CUDA one and falling back with a warning per env.
        render_backend="gpu" if torch.cuda.is_available() else "cpu",
        human_render_camera_configs=dict(width=cfg.render_size, height=cfg.render_size),
        **extra,
    )
    if cfg.robot is not None:
        kwargs["robot_uids"] = cfg.robot
    if cfg.obs_mode == "rgb":
        kwargs["sensor_configs"] = dict(width=cfg.image_size, height=cfg.image_size)
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    # on a CPU renderer a process's first frame would compute a table no scene here reads: 20 s
    lean_shaders = not torch.cuda.is_available() and use_lean_shaders()
    try:
        with scene_collections(sim_backend):
            env = gym.make(cfg.task, **kwargs)
    except Exception as error:
        hint, library = "", physx_gpu_library() if sim_backend == "physx_cuda" else None
        if library is not None and not library.is_file():
            hint = (
                f"\nSAPIEN downloads its PhysX GPU library from GitHub the first time physx_cuda runs; "
                f"offline, unzip linux-so.zip of {PHYSX_GPU_RELEASES} release {library.parent.name} "
                f"into {library.parent}"
            )
        raise ConfigError(f"ManiSkill could not build {cfg.task} with {kwargs}: {error}{hint}") from error
    if lean_shaders:
        check_scene(env)
    return env


@contextmanager
def scene_collections(sim_backend: str) -> Iterator[None]:
    """ManiSkill runs a full `gc.collect()` whenever it builds or clears a scene, to hand GPU
    memory back at once. In a process that has imported torch that walks some 300,000 objects,
    0.2-1 s a time, twice per env of a CPU vector (16 envs: up to half a minute). Where no GPU
    memory can wait on it (physx_cpu on a machine without CUDA; with CUDA, scenes render on
    the GPU), the objects that existed before are frozen out of those collections for the call
    and given back to the collector after: the old scene's cycles go at the next regular
    collection and nothing is kept for good. Where something else froze objects already (a
    server about to fork) its freeze is left as it is. The freeze is process-wide: envs are
    built one at a time in a process (vector workers are processes of their own)."""
    import torch

    spare = sim_backend == "physx_cpu" and not torch.cuda.is_available() and gc.get_freeze_count() == 0
    if spare:
        gc.freeze()
    try:
        yield
    finally:
        if spare:
            gc.unfreeze()


def reset_collections(env: Any, sim_backend: str) -> ContextManager[None]:
    """`scene_collections` for a reset that rebuilds the scene (a task with a reconfiguration
    frequency, such as PegInsertionSide with one env per scene, rebuilds it at every reset). An
    ordinary reset collects nothing, and freezing then would only age the young objects."""
    return scene_collections(sim_backend) if env.unwrapped.reconfiguration_freq else nullcontext()


PHYSX_GPU_RELEASES = "https://github.com/sapien-sim/physx-precompiled/releases"


def physx_gpu_library() -> Path:
    """Where SAPIEN looks for its PhysX GPU library (`sapien.physx.enable_gpu`), which it
    downloads from PHYSX_GPU_RELEASES the first time physx_cuda runs on a machine."""
    import sapien.physx

    return Path.home() / ".sapien" / "physx" / sapien.physx.version() / "libPhysXGpu_64.so"


def flatten_state(observation: Any) -> np.ndarray:
    """ManiSkill observation (tensor, or dict of agent/extra tensors) -> float32 (B, S)."""
    if not isinstance(observation, dict):
        return observation.detach().cpu().numpy().astype(np.float32)
    parts = []
    for section in ("agent", "extra"):
        for value in observation.get(section, {}).values():
            array = value.detach().cpu().numpy().astype(np.float32)
            parts.append(array.reshape(array.shape[0], -1))
    return np.concatenate(parts, axis=1)


def camera_images(observation: Any) -> dict[str, np.ndarray]:
    if not isinstance(observation, dict):
        return {}
    return {name: data["rgb"].detach().cpu().numpy() for name, data in observation["sensor_data"].items()}


def env_spec(gym_env: Any, cfg: ManiSkillConfig, state: np.ndarray, images: dict[str, np.ndarray]) -> EnvSpec:
    space = gym_env.unwrapped.single_action_space
    limit = cfg.max_episode_steps or getattr(gym_env, "_max_episode_steps", None)  # ManiSkill's TimeLimitWrapper
    return EnvSpec(
        state_dim=int(state.shape[-1]),
        action_dim=int(space.shape[0]),
        action_low=tuple(float(x) for x in space.low),
        action_high=tuple(float(x) for x in space.high),
        image_shapes={name: tuple(image.shape[-3:]) for name, image in images.items()},
        max_episode_steps=int(limit) if limit else None,
        control_hz=float(gym_env.unwrapped.control_freq),
    )
