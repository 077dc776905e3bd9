"""The rollout role: batched policy inference over the env side and trajectory assembly."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from embodied.algos.buffers import Trajectory, TrajectoryBuilder, concat_envs
from embodied.core.env import BatchedEnv, episode_seed
from embodied.core.errors import ConfigError, EnvWorkerError
from embodied.core.policy import Policy
from embodied.core.types import ActionChunk, EpisodeStats, Observation, StepResult, concat_observations
from embodied.runtime.offload import Offloader
from embodied.runtime.operator import SimOperator

logger = logging.getLogger(__name__)

# Actions are sampled from the rollout's own random stream, seeded from the run seed plus
# this, so that the learner's stream (minibatch order) is the same whether the two share a
# process (runtime=local) or not (runtime=procs).
SAMPLING_SEED_OFFSET = 7919
GROUP_STREAM = 2  # episode seeds of grouped starts (0: training episodes, 1: evaluation)
AUTO_STAGES = "auto"  # runtime.pipeline_stages: the fastest grouping, timed on these envs
TIMED_STEPS = 4  # chunk steps each grouping is timed over, after one to warm up


def sampling_seed(seed: int, rollout_index: int = 0) -> int:
    """The seed of rollout `rollout_index`'s sampling stream; each of several rollouts has its own."""
    if rollout_index == 0:
        return seed + SAMPLING_SEED_OFFSET
    return int(np.random.SeedSequence([seed, SAMPLING_SEED_OFFSET, rollout_index]).generate_state(1)[0])


def check_pipeline_stages(stages: int | str) -> None:
    if stages != AUTO_STAGES and (not isinstance(stages, int) or stages < 2):
        raise ConfigError(f"runtime.pipeline_stages must be >= 2 or '{AUTO_STAGES}', got {stages!r}")


def env_share(
    num_envs: int, num_workers: int, num_rollouts: int, index: int, group_size: int = 0
) -> tuple[list[int], int]:
    """Rollout `index` of `num_rollouts`: its env ids (a contiguous block, whole groups of
    `group_size` where GRPO starts envs in groups) and its number of env workers. The shares
    together are the config's envs and workers, so several rollouts run the episodes one would."""
    unit = max(group_size, 1)
    blocks = np.array_split(np.arange(num_envs // unit), num_rollouts)[index]
    env_ids = [int(b) * unit + k for b in blocks for k in range(unit)]
    workers = len(np.array_split(np.arange(num_workers), num_rollouts)[index])
    return env_ids, workers


class Rollout:
    def __init__(
        self,
        env: BatchedEnv,
        policy: Policy,
        device: torch.device,
        max_env_restarts: int = 3,
        pipeline: bool = False,
        pipeline_stages: int | str = 2,
        seed: int = 0,
        operator: SimOperator | None = None,
        index: int = 0,
        offload: bool = False,
    ):
        self.env = env
        self.operator = operator  # a scripted operator that may take over envs (embodied/runtime/operator.py)
        # Pipelining needs an env whose env workers step independently (VectorizedEnv with
        # workers), grouped into stages: each stage costs one inference per step, and a GPU's
        # small-batch inference costs about as much for a few rows as for all of them.
        # `auto`: each grouping is timed once the policy and the envs are there (`choose_stages`).
        auto = pipeline_stages == AUTO_STAGES
        if pipeline:
            check_pipeline_stages(pipeline_stages)
        if pipeline and hasattr(env, "group_stages"):
            env.group_stages(len(env.workers) if auto else pipeline_stages)
        self.pipeline = pipeline and getattr(env, "num_stages", 1) > 1
        self.stages_to_choose = self.pipeline and auto
        self.policy = policy
        self.device = device
        self.observation: Observation | None = None
        self.policy_version = 0
        self.max_env_restarts = max_env_restarts  # in a row, before the failure stops training
        self.env_restarts = 0
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(sampling_seed(seed, index))
        # runtime.placement=collocated: the policy waits in CPU memory while the learner has the device
        self.offloader = Offloader(policy, enabled=offload)

    @property
    def keeps_next_images(self) -> bool:
        return bool(getattr(self.policy, "needs_next_images", False))

    def start(self) -> None:
        if self.stages_to_choose:
            self.choose_stages()
            self.observation = self.env.rewind()  # the episodes a run without the timing starts with
        else:
            self.observation = self.env.reset()

    def start_groups(self, group_size: int, round_index: int, base_seed: int) -> None:
        """Every env starts a new episode; the envs of each group of `group_size` start from the
        same initial state (GRPO compares rollouts within a group). Seeds follow (run seed,
        group, round), apart from the training and evaluation streams."""
        if self.stages_to_choose:
            self.choose_stages()
        groups = np.asarray(self.env.env_ids) // group_size  # the config's groups, whichever share this is
        self.observation = self.env.reset(
            seeds=[episode_seed(base_seed, int(g), round_index, GROUP_STREAM) for g in groups]
        )

    def restore(self, env_state: dict[str, Any]) -> None:
        if self.stages_to_choose:
            self.choose_stages()
        self.observation = self.env.restore(env_state)

    def choose_stages(self) -> dict[int, float]:
        """runtime.pipeline_stages=auto: every grouping of the env workers into stages (1: no
        pipelining) steps these envs with this policy for a few chunk steps, timed; the fastest
        is kept (the fewer stages on a tie). The sampling stream and the operator are left as
        they were, and the caller puts the envs where training starts. Returns each grouping's
        seconds per chunk step."""
        env, operator, sampling = self.env, self.operator, self.generator.get_state()
        self.operator = None
        seconds: dict[int, float] = {}
        try:
            self.observation = env.reset()
            for stages in range(1, len(env.workers) + 1):
                env.group_stages(stages)
                collect = self._collect if stages == 1 else self._collect_pipelined
                collect(1)
                started = time.perf_counter()
                collect(TIMED_STEPS)
                seconds[stages] = (time.perf_counter() - started) / TIMED_STEPS
        finally:
            self.operator = operator
            self.generator.set_state(sampling)
        best = min(seconds, key=lambda stages: (seconds[stages], stages))
        env.group_stages(best)
        self.pipeline, self.stages_to_choose = best > 1, False
        logger.info(
            "runtime.pipeline_stages=auto: %d (seconds per chunk step: %s)",
            best,
            ", ".join(f"{stages} stage{'s' * (stages > 1)} {s:.4f}" for stages, s in seconds.items()),
        )
        return seconds

    def _act(self, observation: Observation) -> ActionChunk:
        chunk = self.policy.act(observation.to_torch(self.device), generator=self.generator)
        return ActionChunk(
            actions=chunk.actions.cpu(),
            log_prob=chunk.log_prob.cpu(),
            value=chunk.value.cpu(),
            policy_version=self.policy_version,
            record={k: v.cpu() for k, v in chunk.record.items()},
        )

    def collect(self, num_steps: int) -> tuple[Trajectory, list[EpisodeStats], int]:
        """Run `num_steps` chunk steps in every env. Returns the trajectory, the episodes
        that ended and the number of env steps (single actions) executed.

        If an env worker dies or stops answering, it is restarted and the whole batch is
        collected again, so no partial trajectory reaches the learner."""
        if self.observation is None:
            raise RuntimeError("Rollout.start() or restore() must come before collect()")
        failures = 0
        while True:
            try:
                if failures:
                    self.observation = self.env.recover()
                    self.env_restarts += 1
                    if self.operator is not None:
                        self.operator.episodes_ended()  # recovered envs start new episodes
                return self._collect_pipelined(num_steps) if self.pipeline else self._collect(num_steps)
            except EnvWorkerError as error:
                failures += 1
                if failures > self.max_env_restarts:
                    raise
                logger.warning("env worker failed, restarting it and collecting the batch again: %s", error)

    def _bootstrap(self, result: StepResult) -> torch.Tensor:
        """Value of the final observation where an episode was truncated, else 0."""
        bootstrap = torch.zeros(len(result.reward))
        truncated_rows = np.flatnonzero(result.truncated & ~result.terminated)
        if truncated_rows.size:
            final = result.final_observation.select(truncated_rows).to_torch(self.device)
            bootstrap[truncated_rows] = self.policy.value(final).cpu()
        return bootstrap

    @torch.no_grad()
    def _collect(self, num_steps: int) -> tuple[Trajectory, list[EpisodeStats], int]:
        builder = TrajectoryBuilder(self.keeps_next_images)
        episodes: list[EpisodeStats] = []
        env_steps = 0
        for _ in range(num_steps):
            chunk = self._act(self.observation)
            actions, intervened = chunk.actions.numpy(), None
            if self.operator is not None:
                actions, intervened = self.operator.apply(self.observation, actions)
            result = self.env.step(actions)
            if self.operator is not None:
                self.operator.stepped(result.reward, result.success, result.done)
            builder.add(self.observation, chunk, result, self._bootstrap(result), intervened)
            self.observation = result.observation
            env_steps += int(result.executed_steps.sum())
            episodes.extend(result.episodes)
        last_value = self.policy.value(self.observation.to_torch(self.device)).cpu()
        return builder.build(last_value), episodes, env_steps

    @torch.no_grad()
    def _collect_pipelined(self, num_steps: int) -> tuple[Trajectory, list[EpisodeStats], int]:
        """Each stage (a group of env workers) steps on its own: while one stage simulates its
        chunk, the policy runs for the next one, so inference and simulation overlap (SEED RL /
        RLinf style)."""
        env = self.env
        stages = range(env.num_stages)
        observations = [self.observation.select(env.stage_rows(k)) for k in stages]
        builders = [TrajectoryBuilder(self.keeps_next_images) for _ in stages]
        chunks: list[ActionChunk] = []
        for k in stages:
            chunks.append(self._act(observations[k]))
            env.send_stage_step(k, chunks[k].actions.numpy())
        episodes: list[EpisodeStats] = []
        env_steps = 0
        try:
            for t in range(num_steps):
                for k in stages:
                    result = env.receive_stage_step(k)
                    builders[k].add(observations[k], chunks[k], result, self._bootstrap(result))
                    observations[k] = result.observation
                    env_steps += int(result.executed_steps.sum())
                    episodes.extend(result.episodes)
                    if t < num_steps - 1:
                        chunks[k] = self._act(observations[k])
                        env.send_stage_step(k, chunks[k].actions.numpy())
        except BaseException:
            env.drain()
            raise
        self.observation = concat_observations(observations)
        parts = [builders[k].build(self.policy.value(observations[k].to_torch(self.device)).cpu()) for k in stages]
        return concat_envs(parts), episodes, env_steps
