"""ManiSkill with all envs in one batched scene (physx_cuda on an NVIDIA GPU).

Every env steps together, so an env whose episode ends inside a chunk keeps being simulated
until the chunk is over; its extra steps are ignored (reward, success, executed actions) and
it is reset, with its final observation kept, once the chunk is done.

Seeding: the first reset is seeded from the run seed and ManiSkill's enhanced determinism is
on, so later automatic resets draw episode seeds from ManiSkill's own seeded generators rather
than from torch's global RNG (which the policy samples from). ManiSkill cannot seed a partial
reset per env, so `reset(seeds=..., env_idx=...)` is refused on this backend. Runs on this
backend resume from checkpoints with fresh episodes (GPU physics is not replayed bit-exactly)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from embodied.core.env import BatchedEnv, episode_seed
from embodied.core.types import EpisodeStats, Observation, StepResult
from embodied.sim.maniskill_common import (
    INSTRUCTIONS,
    ManiSkillConfig,
    camera_images,
    env_spec,
    flatten_state,
    make_gym_env,
    reset_collections,
    scene_collections,
)


class ManiSkillBatchedEnv(BatchedEnv):
    def __init__(
        self,
        cfg: ManiSkillConfig,
        base_seed: int,
        stream: int = 0,
        sim_backend: str = "physx_cuda",
        env_ids: Sequence[int] | None = None,
    ):
        import torch

        self.torch = torch
        self.cfg = cfg
        self.env_ids = list(range(cfg.num_envs)) if env_ids is None else [int(i) for i in env_ids]
        self.num_envs = len(self.env_ids)
        self.sim_backend = sim_backend
        self.env = make_gym_env(cfg, self.num_envs, sim_backend, enhanced_determinism=True)
        self.device = self.env.unwrapped.device
        # A rollout holding a share of the envs seeds its scene from its first env's id.
        self.first_seed = episode_seed(base_seed, self.env_ids[0], 0, stream)
        self.tasks = [cfg.task] * self.num_envs
        self.instructions = [cfg.instruction or INSTRUCTIONS[cfg.task]] * self.num_envs
        self.episode_return = np.zeros(self.num_envs)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)
        self.episode_success = np.zeros(self.num_envs, dtype=bool)
        self._seeded = False
        first = self.reset()
        self.spec = env_spec(self.env, cfg, first.state, first.images)
        space = self.env.unwrapped.single_action_space
        self.low = torch.as_tensor(space.low, device=self.device)
        self.high = torch.as_tensor(space.high, device=self.device)

    def _observation(self, raw: Any) -> Observation:
        return Observation(state=flatten_state(raw), images=camera_images(raw), instruction=list(self.instructions))

    def reset(self, seeds: Sequence[int] | None = None, env_idx: Sequence[int] | None = None) -> Observation:
        options: dict[str, Any] = {}
        if env_idx is not None and seeds is not None and len(env_idx) != self.num_envs:
            raise ValueError("this backend cannot seed a partial reset per env; reset all envs or pass no seeds")
        if env_idx is not None:
            if len(env_idx) == 0:
                return self._observation(self.env.unwrapped.get_obs())
            options["env_idx"] = self.torch.as_tensor(np.asarray(env_idx), device=self.device)
        if seeds is None and not self._seeded:
            seeds = [self.first_seed]
        self._seeded = True
        with reset_collections(self.env, self.sim_backend):
            raw, _ = self.env.reset(seed=None if seeds is None else [int(s) for s in seeds], options=options)
        rows = slice(None) if env_idx is None else np.asarray(env_idx)
        self.episode_return[rows], self.episode_length[rows], self.episode_success[rows] = 0.0, 0, False
        return self._observation(raw)

    def rewind(self) -> Observation:
        self._seeded = False
        return self.reset()

    def step(self, actions: np.ndarray) -> StepResult:
        torch = self.torch
        chunk = torch.as_tensor(actions, dtype=torch.float32, device=self.device)
        chunk = torch.maximum(torch.minimum(chunk, self.high), self.low)
        n, chunk_size = chunk.shape[:2]
        active = torch.ones(n, dtype=torch.bool, device=self.device)
        reward = torch.zeros(n, device=self.device)
        terminated = torch.zeros_like(active)
        truncated = torch.zeros_like(active)
        success = torch.zeros_like(active)
        executed = torch.zeros(n, dtype=torch.int64, device=self.device)
        final_state: np.ndarray | None = None
        final_images: dict[str, np.ndarray] = {}
        for j in range(chunk_size):
            raw, step_reward, step_terminated, step_truncated, info = self.env.step(chunk[:, j])
            if self.cfg.ignore_terminations:
                step_terminated = torch.zeros_like(step_terminated)
            reward += torch.where(active, step_reward.float(), 0.0)
            executed += active.long()
            if "success" in info:
                success |= info["success"] & active
            ended = active & (step_terminated | step_truncated)
            terminated |= ended & step_terminated
            truncated |= ended & step_truncated
            if ended.any():
                rows = ended.cpu().numpy()
                state, images = flatten_state(raw), camera_images(raw)
                final_state = state.copy() if final_state is None else np.where(rows[:, None], state, final_state)
                for name, image in images.items():
                    kept = final_images.get(name, image)
                    final_images[name] = np.where(rows[:, None, None, None], image, kept)
            active &= ~ended
            if not active.any():
                break
        observation = self._observation(raw)
        done = (terminated | truncated).cpu().numpy()
        reward_np = reward.cpu().numpy()
        executed_np = executed.cpu().numpy()
        success_np = success.cpu().numpy()
        self.episode_return += reward_np
        self.episode_length += executed_np
        self.episode_success |= success_np
        episodes = [
            EpisodeStats(
                int(i),
                self.tasks[i],
                float(self.episode_return[i]),
                int(self.episode_length[i]),
                bool(self.episode_success[i]),
            )
            for i in np.flatnonzero(done)
        ]
        final = Observation(
            state=final_state if final_state is not None else observation.state,
            images=final_images or observation.images,
            instruction=list(self.instructions),
        )
        if done.any():
            observation = self.reset(env_idx=np.flatnonzero(done))
        mask = np.arange(chunk_size)[None, :] < executed_np[:, None]
        return StepResult(
            observation=observation,
            reward=reward_np.astype(np.float32),
            terminated=terminated.cpu().numpy(),
            truncated=truncated.cpu().numpy(),
            success=success_np,
            executed_steps=executed_np,
            executed_action=chunk.cpu().numpy() * mask[:, :, None],
            final_observation=final,
            episodes=episodes,
        )

    def render(self, env_idx: int = 0) -> np.ndarray:
        return self.env.render()[env_idx].cpu().numpy()

    def close(self) -> None:
        with scene_collections(self.sim_backend):
            self.env.close()
