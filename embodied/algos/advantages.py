"""Advantage estimators over env (chunk) steps."""

from __future__ import annotations

import torch


def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    bootstrap_value: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over time-major (T, B) tensors.

    Where an episode ends at step t the env was reset, so value[t+1] belongs to another
    episode: a terminated step bootstraps from 0, a truncated one from the value of its
    final observation (`bootstrap_value`), and the recursion does not cross the boundary.
    Returns (advantages, returns)."""
    steps = reward.shape[0]
    advantages = torch.zeros_like(value)
    running = torch.zeros_like(last_value)
    done = terminated | truncated
    for t in reversed(range(steps)):
        next_value = last_value if t == steps - 1 else value[t + 1]
        next_value = torch.where(done[t], torch.where(terminated[t], 0.0, bootstrap_value[t]), next_value)
        delta = reward[t] + gamma * next_value - value[t]
        running = delta + gamma * gae_lambda * (~done[t]).to(value.dtype) * running
        advantages[t] = running
    return advantages, advantages + value


def explained_variance(prediction: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var[target - prediction] / Var[target]; nan when the target is constant."""
    variance = target.var()
    return float("nan") if variance == 0 else float(1 - (target - prediction).var() / variance)


def group_normalized(returns: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's advantage: each rollout's return minus its group's mean, over the group's
    standard deviation (unbiased, as torch.std), where a group is the rollouts started from
    one initial state. A group of one carries no comparison and gets advantage 0."""
    advantages = torch.zeros(returns.shape, dtype=torch.float32, device=returns.device)
    for group in torch.unique(group_ids):
        members = group_ids == group
        if int(members.sum()) < 2:
            continue
        values = returns[members].float()
        advantages[members] = (values - values.mean()) / (values.std() + eps)
    return advantages
