"""ManiSkill3 adapter.

- `backend: cpu` runs physx_cpu, one env per simulator instance (ManiSkill's CPU backend
  takes num_envs=1), vectorised by `VectorizedEnv`, optionally over worker processes.
- `backend: gpu` runs physx_cuda with `num_envs` envs in one batched scene (`embodied.sim.maniskill_batched`).

Observations: `obs_mode: state` gives ManiSkill's flat state vector; `obs_mode: rgb` gives
camera images plus the robot's proprioception and task extras as `state`.

Several tasks in one env (`tasks: [PushCube-v1, PickCube-v1, ...]`, cpu backend): env i runs
tasks[i * len(tasks) // num_envs], so each task has a contiguous block of envs (a GRPO group
stays within one task), each with its own instruction. The tasks' state vectors differ in
length, so every state is zero-padded to the longest (`state_dim`, found by building each
task once); their action spaces, time limits and control rates must agree."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from embodied.core.env import BatchedEnv, SingleEnv, SingleObservation, SingleStep, select_env_ids
from embodied.core.errors import ConfigError
from embodied.core.registry import ENVS
from embodied.sim.experts import ScriptedExpert, make_expert
from embodied.sim.maniskill_batched import ManiSkillBatchedEnv
from embodied.sim.maniskill_common import (
    INSTRUCTIONS,
    ManiSkillConfig,
    camera_images,
    check_config,
    env_spec,
    flatten_state,
    make_gym_env,
    reset_collections,
    scene_collections,
)


def task_of(cfg: ManiSkillConfig, env_id: int) -> str:
    """The task env `env_id` runs: blocks of envs per task, in the order of `tasks`."""
    if not cfg.tasks:
        return cfg.task
    return cfg.tasks[env_id * len(cfg.tasks) // cfg.num_envs]


def with_state_padding(cfg: ManiSkillConfig) -> ManiSkillConfig:
    """For several tasks: `cfg` with `state_dim` set to the longest task state, after checking
    that the tasks agree on everything else a policy relies on (each task is built once)."""
    if not cfg.tasks or cfg.state_dim is not None:
        return cfg
    specs = {}
    for task in cfg.tasks:
        env = ManiSkillEnv(replace(cfg, task=task, tasks=None, num_envs=1))
        specs[task] = env.spec
        env.close()
    first = next(iter(specs.values()))
    for task, spec in specs.items():
        for key in ("action_dim", "action_low", "action_high", "image_shapes", "max_episode_steps", "control_hz"):
            if getattr(spec, key) != getattr(first, key):
                raise ConfigError(
                    f"env.tasks must agree on {key}: {cfg.tasks[0]} has {getattr(first, key)}, "
                    f"{task} has {getattr(spec, key)}"
                )
    return replace(cfg, state_dim=max(spec.state_dim for spec in specs.values()))


class ManiSkillEnv(SingleEnv):
    """One physx_cpu ManiSkill env (with `tasks`: env `env_id`'s task, its state padded)."""

    def __init__(self, cfg: ManiSkillConfig, env_id: int = 0):
        import torch

        if cfg.tasks and cfg.state_dim is None:
            raise ConfigError(
                "env.tasks needs env.state_dim; build the env with make_maniskill, or pass the "
                "config through with_state_padding"
            )
        self.torch = torch
        self.task = task_of(cfg, env_id)
        self.cfg = cfg = replace(cfg, task=self.task)
        self.instruction = cfg.instruction or INSTRUCTIONS[self.task]
        self.env = make_gym_env(cfg, num_envs=1, sim_backend="physx_cpu")
        self.expert: ScriptedExpert | None = None  # made on the first expert_action
        first = self.reset(0)
        self.spec = env_spec(self.env, cfg, first.state[None], {k: v[None] for k, v in first.images.items()})

    def _observation(self, raw: Any) -> SingleObservation:
        state = flatten_state(raw)[0]
        if self.cfg.state_dim is not None:
            if len(state) > self.cfg.state_dim:
                raise ConfigError(
                    f"{self.task}'s state has {len(state)} values, more than env.state_dim={self.cfg.state_dim}"
                )
            state = np.pad(state, (0, self.cfg.state_dim - len(state)))
        return SingleObservation(state=state, images={name: image[0] for name, image in camera_images(raw).items()})

    def reset(self, seed: int) -> SingleObservation:
        with reset_collections(self.env, "physx_cpu"):
            raw, _ = self.env.reset(seed=seed)
        if self.expert is not None:
            self.expert.reset()
        return self._observation(raw)

    def step(self, action: np.ndarray) -> SingleStep:
        raw, reward, terminated, truncated, info = self.env.step(self.torch.from_numpy(action[None]))
        return SingleStep(
            observation=self._observation(raw),
            reward=float(reward[0]),
            terminated=bool(terminated[0]) and not self.cfg.ignore_terminations,
            truncated=bool(truncated[0]),
            success=bool(info["success"][0]) if "success" in info else False,
        )

    def render(self) -> np.ndarray:
        return self.env.render()[0].cpu().numpy()

    def end_effector_position(self) -> np.ndarray | None:
        agent = self.env.unwrapped.agent
        if getattr(agent, "tcp", None) is None:
            return None
        world = agent.tcp.pose.p[0] - agent.robot.pose.p[0]  # the robot base is not rotated in these tasks
        return world.detach().cpu().numpy().astype(np.float64)

    def expert_action(self) -> np.ndarray:
        """The task's scripted expert (embodied.sim.experts) on this env's privileged state. It
        follows its waypoints from wherever the arm is, so it can take over mid-episode."""
        if self.expert is None:
            self.expert = make_expert(self.task, self.cfg.control_mode)
        return self.expert.act(self.env.unwrapped)

    def close(self) -> None:
        with scene_collections("physx_cpu"):
            self.env.close()


@ENVS.register("maniskill", ManiSkillConfig)
def make_maniskill(
    cfg: ManiSkillConfig, seed: int, stream: int = 0, env_ids: Sequence[int] | None = None
) -> BatchedEnv:
    check_config(cfg)
    if cfg.backend == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "env.backend=gpu runs physx_cuda and needs an NVIDIA GPU with CUDA; "
                "none is visible here. Use env.backend=cpu (optionally env.num_workers=N)."
            )
        return ManiSkillBatchedEnv(
            cfg, base_seed=seed, stream=stream, sim_backend="physx_cuda", env_ids=select_env_ids(cfg.num_envs, env_ids)
        )
    if cfg.backend == "cpu_batched":
        return ManiSkillBatchedEnv(
            cfg, base_seed=seed, stream=stream, sim_backend="physx_cpu", env_ids=select_env_ids(cfg.num_envs, env_ids)
        )
    from embodied.sim.vector import vectorize_config

    cfg = with_state_padding(cfg)
    return vectorize_config(ManiSkillEnv, cfg, seed, stream, env_ids, preload=("torch", "mani_skill.envs", __name__))
