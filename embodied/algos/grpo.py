"""GRPO's objective and its dynamic sampling, for token policies.

Objective (per action token t of rollout i, advantage A_i from `advantages.group_normalized`
broadcast over the rollout):

    r_t = exp(log pi(a_t) - log pi_old(a_t))
    loss = - sum_t min(r_t A_i, clip(r_t, 1 - clip_low, 1 + clip_high) A_i) / (number of tokens)

The clip is asymmetric ("clip-higher": a wider upper bound keeps low-probability tokens
that earned a positive advantage from being frozen out), the mean is over tokens of the whole
batch (not per rollout first), and there is no KL term by default.

Dynamic sampling keeps only groups whose success rate lies inside a band (all-fail and
all-succeed groups have zero advantage everywhere, so they only dilute the batch) and counts,
per task, what it kept and dropped, so a task that is always solved or never solved shows up
in the logs and in `uncovered()` instead of silently vanishing from training."""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch


@dataclass
class GRPOLoss:
    total: torch.Tensor
    policy_loss: torch.Tensor
    approx_kl: torch.Tensor
    clipfrac: torch.Tensor


def grpo_loss(new_log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.28) -> GRPOLoss:
    """Token-level inputs (N, T) with `mask` marking real action tokens; `advantages` (N,) or (N, T)."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(new_log_prob)
    mask = mask.to(new_log_prob.dtype)
    tokens = mask.sum().clamp(min=1.0)
    log_ratio = new_log_prob - old_log_prob
    ratio = log_ratio.exp()
    per_token = -torch.min(ratio * advantages, ratio.clamp(1 - clip_low, 1 + clip_high) * advantages)
    policy_loss = (per_token * mask).sum() / tokens
    with torch.no_grad():
        approx_kl = (((ratio - 1) - log_ratio) * mask).sum() / tokens
        clipped = ((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).to(mask.dtype)
        clipfrac = (clipped * mask).sum() / tokens
    return GRPOLoss(policy_loss, policy_loss, approx_kl, clipfrac)


@dataclass
class Group:
    task: str
    successes: int
    size: int

    @property
    def success_rate(self) -> float:
        return self.successes / self.size


class DynamicSampling:
    """Accepts groups whose success rate is within [low, high] until `groups_per_batch` are
    kept, with per-task accounting across the whole run."""

    def __init__(self, groups_per_batch: int, low: float = 0.1, high: float = 0.9):
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"the success band must satisfy 0 <= low <= high <= 1, got [{low}, {high}]")
        self.groups_per_batch = groups_per_batch
        self.low, self.high = low, high
        self.kept: list[Group] = []
        self.seen: collections.Counter[str] = collections.Counter()
        self.informative: collections.Counter[str] = collections.Counter()  # inside the band

    def offer(self, group: Group) -> bool:
        """Count the group for its task; keep it if it is informative and the batch has room."""
        self.seen[group.task] += 1
        if not self.low <= group.success_rate <= self.high:
            return False
        self.informative[group.task] += 1
        if self.full:
            return False
        self.kept.append(group)
        return True

    @property
    def full(self) -> bool:
        return len(self.kept) >= self.groups_per_batch

    def take_batch(self) -> list[Group]:
        batch, self.kept = self.kept, []
        return batch

    def uncovered(self) -> list[str]:
        """Tasks sampled so far whose groups were never informative (always or never solved)."""
        return sorted(task for task in self.seen if self.informative[task] == 0)

    def metrics(self) -> dict[str, float]:
        """Per task, the fraction of its groups inside the success band."""
        return {f"sampling/{task}/informative_fraction": self.informative[task] / self.seen[task]
                for task in sorted(self.seen)}
