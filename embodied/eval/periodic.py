"""Evaluation during training: the deterministic policy on its own env every `eval_every` iterations."""

from __future__ import annotations

from embodied.build import build_env, in_this_process
from embodied.config import TrainConfig
from embodied.core.env import BatchedEnv
from embodied.core.policy import Policy
from embodied.eval.episodes import run_episodes, summarize


class PeriodicEvaluation:
    """Deterministic-policy evaluation every `eval_every` iterations on a separate env with
    its own seeds (the same episodes each time), envs in this process."""

    def __init__(self, config: TrainConfig):
        self.config = config
        self.env: BatchedEnv | None = None

    def due(self, iteration: int) -> bool:
        return self.config.eval_every > 0 and iteration % self.config.eval_every == 0

    def run(self, policy: Policy) -> dict[str, float]:
        if self.env is None:
            self.env = build_env(in_this_process(self.config.env), seed=self.config.seed, stream=1)
        episodes, _ = run_episodes(
            self.env, policy, self.config.periodic_eval_episodes, self.config.seed, progress=False
        )
        result = summarize("all", episodes)
        return {
            "eval/success_rate": result.success_rate,
            "eval/episode_return": result.mean_return,
            "eval/episode_length": result.mean_length,
        }

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
