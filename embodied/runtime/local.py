"""`runtime=local`: env side, rollout and learner in one process and one loop.

Deterministic on CPU for a given seed; a resumed run reproduces the uninterrupted one
(env state comes back by replaying each episode's seed and actions, see `embodied.sim.worker_envs`)."""

from __future__ import annotations

import logging

from embodied.build import build_algo, build_env, build_policy, resolve_device
from embodied.config import TrainConfig
from embodied.eval.periodic import PeriodicEvaluation
from embodied.runtime.classified_reward import with_reward
from embodied.runtime.configs import LocalRuntimeConfig
from embodied.runtime.learner import Learner
from embodied.runtime.operator import build_operator
from embodied.runtime.process import start_process
from embodied.runtime.rollout import Rollout, check_pipeline_stages
from embodied.runtime.session import TrainSession

logger = logging.getLogger(__name__)


class LocalRuntime:
    def __init__(self, cfg: LocalRuntimeConfig):
        self.cfg = cfg

    def train(self, config: TrainConfig) -> TrainSession:
        if self.cfg.pipeline:
            check_pipeline_stages(self.cfg.pipeline_stages)  # before any env is built
        start_process(config.seed, self.cfg.torch_threads)
        device = resolve_device(self.cfg.device)

        session = TrainSession(config)
        evaluation = PeriodicEvaluation(config)
        env = with_reward(build_env(config.env, seed=config.seed), config.reward)
        try:
            policy = build_policy(config.policy, env.spec, device)
            learner = Learner(policy, build_algo(config.algo, policy), device)
            rollout = Rollout(
                env,
                policy,
                device,
                pipeline=self.cfg.pipeline,
                pipeline_stages=self.cfg.pipeline_stages,
                seed=config.seed,
                operator=build_operator(config, env),
            )
            session.restore(learner, rollout)
            learner.before_training()

            session.start_logging()
            group_size = getattr(config.algo, "group_size", 0)  # GRPO-style algorithms: grouped starts
            while not session.finished:
                if group_size:
                    rollout.start_groups(group_size, session.iteration, config.seed)
                progress = session.env_steps / config.total_env_steps
                batch, episodes, env_steps = rollout.collect(config.algo.rollout_steps)
                metrics = learner.update(batch, progress)
                rollout.policy_version = learner.policy_version
                metrics["train/policy_version"] = learner.policy_version
                metrics["train/env_worker_restarts"] = rollout.env_restarts
                session.record(env_steps, episodes, metrics)
                if evaluation.due(session.iteration):
                    session.record_eval(evaluation.run(policy))
                if session.should_checkpoint(session.finished):
                    session.save(
                        learner,
                        env.resume_state(),
                        {"sampling_rng": rollout.generator.get_state(), "spec": env.spec.to_dict()},
                    )
        finally:
            session.close()
            evaluation.close()
            env.close()
        return session
