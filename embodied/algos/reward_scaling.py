"""Reward scaling by the running std of the discounted return (PPO's standard trick)."""

from __future__ import annotations

import torch


class ReturnScaler:
    def __init__(self, gamma: float, clip: float, epsilon: float = 1e-8):
        self.gamma = gamma
        self.clip = clip
        self.epsilon = epsilon
        self.mean = torch.zeros((), dtype=torch.float64)
        self.var = torch.ones((), dtype=torch.float64)
        self.count = torch.tensor(1e-4, dtype=torch.float64)
        self.discounted_return: torch.Tensor | None = None  # (B,) per env, carried across batches

    def _update(self, batch: torch.Tensor) -> None:
        batch = batch.to(torch.float64)
        delta = batch.mean() - self.mean
        total = self.count + batch.numel()
        self.mean = self.mean + delta * batch.numel() / total
        m2 = self.var * self.count + batch.var(unbiased=False) * batch.numel() + delta**2 * self.count * batch.numel() / total
        self.var = m2 / total
        self.count = total

    def __call__(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Scale time-major (T, B) rewards, updating the statistics step by step."""
        if self.discounted_return is None:
            self.discounted_return = torch.zeros(reward.shape[1], dtype=torch.float64)
        scaled = torch.empty_like(reward)
        for t in range(reward.shape[0]):
            self.discounted_return = self.discounted_return * self.gamma + reward[t].to(torch.float64)
            self._update(self.discounted_return)
            scaled[t] = (reward[t] / torch.sqrt(self.var + self.epsilon).to(reward.dtype)).clamp(-self.clip, self.clip)
            self.discounted_return = torch.where(done[t], 0.0, self.discounted_return)
        return scaled

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count, "discounted_return": self.discounted_return}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]
        self.discounted_return = state.get("discounted_return")
