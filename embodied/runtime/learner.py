"""The learner role: owns the trainable policy and the algorithm; publishes versioned weights."""

from __future__ import annotations

from typing import Any

import torch

from embodied.buffers import Trajectory
from policies.base import Policy


class Learner:
    def __init__(self, policy: Policy, algo: Any, device: torch.device):
        self.policy = policy
        self.algo = algo
        self.device = device
        self.policy_version = 0
        # Weights trained elsewhere (SFT, `init`) expect the input statistics they were trained
        # with: moving them would change the function those weights compute.
        self.normalization_frozen = False

    def update(self, batch: Trajectory, progress: float, off_policy: bool = False) -> dict[str, float]:
        """`off_policy`: the batch was sampled by an older policy_version than the current one."""
        batch = batch.to(self.device)
        metrics = self.algo.update(batch, progress, off_policy=off_policy)
        # Input statistics move after the update, so rollout and update of one batch saw
        # the same normalisation and the first PPO ratio is exactly 1.
        if not self.normalization_frozen:
            self.policy.update_normalization(batch.flat_observation(slice(None)))
        self.policy_version += 1
        return metrics

    def before_training(self) -> dict[str, float]:
        """What the algorithm does once before the first env step (e.g. offline pretraining)."""
        prepare = getattr(self.algo, "before_training", None)
        return prepare() if prepare is not None else {}

    def get_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.policy.load_state_dict(weights)

    def state_dict(self) -> dict[str, Any]:
        return {"algo": self.algo.state_dict(), "policy_version": self.policy_version,
                "normalization_frozen": self.normalization_frozen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.algo.load_state_dict(state["algo"])
        self.policy_version = int(state["policy_version"])
        self.normalization_frozen = bool(state.get("normalization_frozen", False))
