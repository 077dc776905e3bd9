"""Reward scaling by the running std of the discounted return (PPO's standard trick)."""

from __future__ import annotations

import numpy as np
import torch


class ReturnScaler:
    def __init__(self, gamma: float, clip: float, epsilon: float = 1e-8):
        self.gamma = gamma
        self.clip = clip
        self.epsilon = epsilon
        self.mean = 0.0
        self.var = 1.0
        self.count = 1e-4
        self.discounted_return: np.ndarray | None = None  # (B,) per env, carried across batches

    def _update(self, batch: np.ndarray) -> None:
        delta = batch.mean() - self.mean
        total = self.count + batch.size
        self.mean += delta * batch.size / total
        m2 = self.var * self.count + batch.var() * batch.size + delta**2 * self.count * batch.size / total
        self.var = m2 / total
        self.count = total

    def __call__(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Scale time-major (T, B) rewards, updating the statistics step by step (a plain
        numpy loop: thousands of tiny torch ops would dominate a single-env update)."""
        rewards = reward.detach().cpu().numpy().astype(np.float64)
        dones = done.detach().cpu().numpy()
        if self.discounted_return is None:
            self.discounted_return = np.zeros(rewards.shape[1])
        scaled = np.empty_like(rewards)
        for t in range(rewards.shape[0]):
            self.discounted_return = self.discounted_return * self.gamma + rewards[t]
            self._update(self.discounted_return)
            scaled[t] = rewards[t] / np.sqrt(self.var + self.epsilon)
            self.discounted_return[dones[t]] = 0.0
        return torch.as_tensor(np.clip(scaled, -self.clip, self.clip), dtype=reward.dtype, device=reward.device)

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count, "discounted_return": self.discounted_return}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), float(state["count"])
        self.discounted_return = state.get("discounted_return")
