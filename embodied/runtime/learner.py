"""The learner role: owns the trainable policy and the algorithm; publishes versioned weights."""

from __future__ import annotations

import logging
from typing import Any

import torch

from embodied.algos.buffers import Trajectory
from embodied.algos.distributed import (
    DataParallel,
    full_optimizer_state,
    full_weights,
    optimizer_parameter_names,
    shard_with_optimizer,
)
from embodied.core.policy import Policy
from embodied.runs.checkpoint import load_policy_weights
from embodied.runtime.offload import Offloader
from embodied.runtime.wire import published_weights

logger = logging.getLogger(__name__)


class Learner:
    def __init__(self, policy: Policy, algo: Any, device: torch.device):
        self.policy = policy
        self.algo = algo
        self.device = device
        self.policy_version = 0
        # Weights trained elsewhere (SFT, `init`) expect the input statistics they were trained
        # with: moving them would change the function those weights compute.
        self.normalization_frozen = False
        # fsdp: the names of the optimizer's parameters (its state is gathered by name), and
        # the whole weights gathered last (rank 0), e.g. for an unsharded evaluation copy
        self.sharded_names: list[str] | None = None
        self.gathered_weights: dict[str, torch.Tensor] = {}
        self.offloader = Offloader(policy, enabled=False)  # see `collocate`

    def collocate(self) -> None:
        """From now on `offloader.offload()` moves the policy and the optimizer state to CPU
        memory (the rollout has the device while this learner waits) and `reload()` brings
        them back (runtime.placement=collocated)."""
        self.offloader = Offloader(self.policy, self.algo.optimizer)

    def _check_loaded(self) -> None:
        if self.offloader.offloaded:
            raise RuntimeError("the learner's policy is offloaded to CPU memory: reload() it first")

    def update(self, batch: Trajectory, progress: float, off_policy: bool = False) -> dict[str, float]:
        """`off_policy`: the batch was sampled by an older policy_version than the current one."""
        self._check_loaded()
        batch = batch.to(self.device)
        metrics = self.algo.update(batch, progress, off_policy=off_policy)
        # Input statistics move after the update, so rollout and update of one batch saw
        # the same normalisation and the first PPO ratio is exactly 1.
        if not self.normalization_frozen:
            self.policy.update_normalization(batch.flat_observation(slice(None)))
        self.policy_version += 1
        return metrics

    def before_training(self) -> dict[str, float]:
        """What the algorithm does once before the first env step (e.g. offline pretraining),
        logged; returns its metrics."""
        prepare = getattr(self.algo, "before_training", None)
        metrics = prepare() if prepare is not None else {}
        if metrics:
            logger.info("before training: %s", ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
        return metrics

    def shard(self, parallel: DataParallel) -> None:
        """fsdp: shard the policy and the optimizer state over the ranks (after every rank
        loaded the same state). From then on, whole weights and state are gathered, a
        collective every rank joins: `get_weights`, `published`, `state_dict`."""
        names = optimizer_parameter_names(self.policy, self.algo.optimizer)
        self.algo.optimizer = shard_with_optimizer(self.policy, self.algo.optimizer, parallel)
        self.sharded_names = names

    def get_weights(self) -> dict[str, torch.Tensor]:
        self._check_loaded()
        if self.sharded_names is not None:
            self.gathered_weights = full_weights(self.policy)
            return self.gathered_weights
        return {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}

    def published(self) -> dict[str, torch.Tensor]:
        """What a weight update for the rollout carries (`wire.published_weights`)."""
        self._check_loaded()
        if self.sharded_names is not None:
            return published_weights(self.policy, self.get_weights())
        return published_weights(self.policy)

    def load_weights(self, weights: dict[str, torch.Tensor], checkpoint_state: dict[str, Any] | None = None) -> None:
        """The policy's whole state, or a checkpoint's weights with its state (which says what
        it left out: `embodied.runs.checkpoint.load_policy_weights`)."""
        self._check_unsharded()
        load_policy_weights(self.policy, weights, checkpoint_state or {})

    def state_dict(self) -> dict[str, Any]:
        self._check_loaded()
        algo = self.algo.state_dict()
        if self.sharded_names is not None:
            algo["optimizer"] = full_optimizer_state(self.policy, self.algo.optimizer, self.sharded_names)
        return {"algo": algo, "policy_version": self.policy_version, "normalization_frozen": self.normalization_frozen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_unsharded()
        self.algo.load_state_dict(state["algo"])
        self.policy_version = int(state["policy_version"])
        self.normalization_frozen = bool(state.get("normalization_frozen", False))

    def _check_unsharded(self) -> None:
        if self.sharded_names is not None:
            raise RuntimeError("a sharded learner loads weights and state before it is sharded")
