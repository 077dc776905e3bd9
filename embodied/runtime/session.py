"""What every runtime shares around its training loop: run directory, resolved config,
checkpoint save/restore, metric logging, the progress bar and the closing evaluation."""

from __future__ import annotations

import collections
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from embodied.config import TrainConfig, to_yaml
from embodied.core.types import EpisodeStats
from embodied.runs.checkpoint import (
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
    without_pretrained_frozen,
)
from embodied.runs.folders import MetricLogger, drop_metrics_after, new_run_dir, refuse_a_used_run_dir
from embodied.runs.loading import load_run_policy
from embodied.runtime.learner import Learner
from embodied.runtime.process import get_rng_state, set_rng_state
from embodied.runtime.rollout import Rollout

logger = logging.getLogger(__name__)


EPISODE_WINDOW = 100  # episodes behind the success rate and return shown while training


class TrainSession:
    def __init__(self, config: TrainConfig):
        self.config = config
        self.checkpoint = resolve_checkpoint(config.resume) if config.resume else None
        if config.run_dir:
            self.run_dir = Path(config.run_dir)
            if self.checkpoint is None:
                refuse_a_used_run_dir(self.run_dir)
            self.run_dir.mkdir(parents=True, exist_ok=True)
        else:
            self.run_dir = new_run_dir(config.runs_root, config.run_name)
            config.run_dir = str(self.run_dir)
        self.config_yaml = to_yaml(config)
        (self.run_dir / "config.yaml").write_text(self.config_yaml)
        self.episodes: collections.deque[EpisodeStats] = collections.deque(maxlen=EPISODE_WINDOW)
        self.iteration = 0
        self.env_steps = 0
        self.checkpoint_path: Path | None = None
        self._logger: MetricLogger | None = None
        self._bar: Any = None
        self._last_time = time.perf_counter()
        self._started = self._last_time
        self._elapsed_before = 0.0  # wall time of the run before it was resumed
        self._last_eval: float | None = None
        self._last_steps = 0

    # ---- checkpoints -------------------------------------------------------------------
    def saved_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        """Weights and state of the checkpoint this run resumes from, or None for a new run."""
        return load_checkpoint(self.checkpoint) if self.checkpoint is not None else None

    def restore(self, learner: Learner, rollout: Rollout | None = None) -> None:
        """Continue from the run's latest checkpoint, or start fresh episodes. Without a
        `rollout` (it lives in another process) only the learner side is restored."""
        saved_state = self.saved_state()
        if saved_state is None:
            if self.config.init:
                self._load_init(learner)
            if rollout is not None:
                rollout.start()
            return
        weights, saved = saved_state
        self.checkpoint_path = self.checkpoint
        self.iteration = int(saved["iteration"])
        self.env_steps = int(saved["env_steps"])
        self._elapsed_before = float(saved.get("elapsed_s", 0.0))
        self._last_steps = self.env_steps
        self.episodes.extend(EpisodeStats(**e) for e in saved["episodes"])
        drop_metrics_after(self.run_dir, "env_steps", self.env_steps)
        learner.load_weights(weights, saved)
        learner.load_state_dict(saved["learner"])
        if rollout is not None:
            if self.config.env_resume == "fresh":
                logger.info("starting new episodes (env_resume=fresh)")
                rollout.start()
            else:
                rollout.restore(saved["env"])
            rollout.policy_version = learner.policy_version
            if "sampling_rng" in saved:
                rollout.generator.set_state(saved["sampling_rng"])
        set_rng_state(saved["rng"])  # last: replaying the env may draw random numbers

    def _load_init(self, learner: Learner) -> None:
        """A new run's starting weights (`init`): the policy of another run, e.g. an SFT run.
        The weights come with their input statistics, which stay fixed from then on;
        optimizer state and counters start fresh."""
        assert self.config.init is not None
        checkpoint = load_run_policy(
            self.config.init, into=learner.policy, label=f"policy '{self.config.policy.name}' on this env"
        ).checkpoint
        learner.normalization_frozen = True
        logger.info("policy weights from %s (input statistics fixed)", checkpoint)

    def save(self, learner: Learner, env_state: dict[str, Any] | None, extra: dict[str, Any] | None = None) -> Path:
        """A checkpoint of the learner, the env side's resume state where this process holds
        it, and `extra` state of the runtime."""
        saved = {
            "learner": learner.state_dict(),
            "env": env_state,
            "rng": get_rng_state(),
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "elapsed_s": self.elapsed_s,
            "episodes": [vars(e) for e in self.episodes],
            **(extra or {}),
        }
        weights, saved["pretrained_frozen"] = without_pretrained_frozen(learner.policy, learner.get_weights())
        self.checkpoint_path = save_checkpoint(
            self.run_dir / "checkpoints",
            f"iter_{self.iteration:06d}",
            weights,
            saved,
            self.config_yaml,
            keep=self.config.keep_checkpoints,
        )
        return self.checkpoint_path

    def should_checkpoint(self, finished: bool) -> bool:
        every = self.config.checkpoint_every
        return finished or (every > 0 and self.iteration % every == 0)

    # ---- logging -----------------------------------------------------------------------
    def start_logging(self) -> None:
        self._logger = MetricLogger(
            self.run_dir, self.config.logger, OmegaConf.to_container(OmegaConf.create(self.config_yaml))
        )
        self._bar = tqdm(
            total=self.config.total_env_steps,
            initial=self.env_steps,
            unit="step",
            desc="train",
            disable=not self.config.logger.progress_bar,
            dynamic_ncols=True,
        )

    def record(self, env_steps: int, episodes: list[EpisodeStats], metrics: dict[str, float]) -> None:
        self.iteration += 1
        self.env_steps += env_steps
        self.episodes.extend(episodes)
        now = time.perf_counter()
        metrics = dict(metrics)
        metrics["train/env_steps_per_s"] = (self.env_steps - self._last_steps) / max(now - self._last_time, 1e-9)
        metrics["train/iteration"] = self.iteration
        metrics["train/elapsed_s"] = self.elapsed_s
        self._last_time, self._last_steps = now, self.env_steps
        if self.episodes:
            metrics["rollout/success_rate"] = float(np.mean([e.success for e in self.episodes]))
            metrics["rollout/episode_return"] = float(np.mean([e.episode_return for e in self.episodes]))
            metrics["rollout/episode_length"] = float(np.mean([e.length for e in self.episodes]))
        metrics["rollout/episodes_finished"] = len(episodes)
        assert self._logger is not None
        self._logger.log(metrics, self.env_steps)
        self._bar.update(env_steps)
        eval_success = {} if self._last_eval is None else {"eval_success": f"{self._last_eval:.2f}"}
        self._bar.set_postfix(
            **eval_success,
            success=f"{metrics.get('rollout/success_rate', 0.0):.2f}",
            ret=f"{metrics.get('rollout/episode_return', 0.0):.2f}",
            sps=f"{metrics['train/env_steps_per_s']:.0f}",
        )

    def record_eval(self, metrics: dict[str, float]) -> None:
        assert self._logger is not None
        self._logger.log(metrics, self.env_steps)
        self._last_eval = metrics["eval/success_rate"]

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._logger is not None:
            self._logger.close()

    @property
    def elapsed_s(self) -> float:
        """Wall time the run has trained, over all its resumptions."""
        return self._elapsed_before + time.perf_counter() - self._started

    @property
    def finished(self) -> bool:
        """The run has its env steps, or has used its wall-time budget (`time_limit_s`; a new
        run trains at least one iteration, so it has a checkpoint)."""
        limit = self.config.time_limit_s
        out_of_time = limit is not None and self.iteration > 0 and self.elapsed_s >= limit
        return self.env_steps >= self.config.total_env_steps or out_of_time
