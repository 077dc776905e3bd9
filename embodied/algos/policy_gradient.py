"""What PPO and GRPO share: the log-probs a ratio is taken over, the advantage each of them
gets, the minibatch walk over learner ranks, the optimizer step and the loss averages.

What the ratio is taken over is `ratio`: the whole chunk's log-prob (one ratio per env step),
or each term of it where the policy's log-prob is a sum of terms (`term`: one ratio per action
token of a token VLA, or per trained denoising step of a diffusion or flow_noise policy, as in
DPPO / ReinFlow). With terms, the env step's advantage is given to each term, weighted by
`denoise_discount`^(P - 1 - j) for term j of P: earlier denoising steps count less, the last
one (which makes the action) fully."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Optional

import torch
from torch import nn

from embodied.algos.buffers import Trajectory
from embodied.algos.distributed import DataParallel
from embodied.core.errors import ConfigError
from embodied.core.policy import Policy, Recomputed
from embodied.core.types import ActionChunk

RATIOS = ("chunk", "term")


def check_ratio(ratio: str, denoise_discount: float) -> None:
    if ratio not in RATIOS:
        raise ConfigError(f"algo.ratio must be one of {RATIOS}, got '{ratio}'")
    if not 0 < denoise_discount <= 1:
        raise ConfigError(f"algo.denoise_discount must be in (0, 1], got {denoise_discount}")


def ratio_log_probs(log_prob: torch.Tensor, term_log_prob: Optional[torch.Tensor], ratio: str) -> torch.Tensor:
    """(B, P) log-probs a ratio is taken of: the chunk's as one term, or the policy's terms
    (action tokens, denoising steps) with ratio=term where it has them."""
    if ratio == "term" and term_log_prob is not None:
        return term_log_prob
    return log_prob[:, None]


def term_advantages(advantages: torch.Tensor, terms: int, denoise_discount: float) -> torch.Tensor:
    """(B,) advantages -> (B, P): term j of P weighted by denoise_discount^(P - 1 - j)."""
    powers = torch.arange(terms - 1, -1, -1, device=advantages.device, dtype=advantages.dtype)
    return advantages[:, None] * denoise_discount ** powers[None]


def recompute_rows(
    policy: Policy, batch: Trajectory, rows: torch.Tensor, ratio: str
) -> tuple[Recomputed, ActionChunk, torch.Tensor]:
    """The policy's evaluation now of flat rows `rows`, the chunk they collected, and the
    evaluation's (B, P) log-probs a ratio is taken of."""
    chunk = batch.chunk(rows)
    recomputed = policy.recompute(batch.flat_observation(rows), chunk)
    return recomputed, chunk, ratio_log_probs(recomputed.log_prob, recomputed.term_log_prob, ratio)


def minibatch_order(size: int, parallel: DataParallel | None) -> torch.Tensor:
    """A random order of `size` rows; on learner ranks rank 0's, so every rank walks the same
    minibatches."""
    order = torch.randperm(size)
    if parallel:
        parallel.broadcast(order)
    return order


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    parameters: list[torch.nn.Parameter],
    clipped: list[list[torch.nn.Parameter]],
    max_grad_norm: float,
    parallel: DataParallel | None,
) -> list[torch.Tensor]:
    """After a minibatch's backward: gradients averaged over learner ranks, each group in
    `clipped` clipped to `max_grad_norm` on its own, one step. Returns each group's norm."""
    if parallel:
        parallel.average_gradients(parameters)
    norms = [nn.utils.clip_grad_norm_(group, max_grad_norm) for group in clipped]
    optimizer.step()
    return norms


class LossAverages:
    """Means of a loss's named terms and the gradient norm over an update's minibatches."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0

    def add(self, loss: Any, grad_norm: torch.Tensor, **other_norms: torch.Tensor) -> None:
        terms = {f.name: float(getattr(loss, f.name).detach()) for f in fields(loss)}
        norms = {"grad_norm": float(grad_norm), **{name: float(norm) for name, norm in other_norms.items()}}
        for name, value in {**terms, **norms}.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        self.count += 1

    def metrics(self) -> dict[str, float]:
        return {f"loss/{name}": total / self.count for name, total in self.sums.items()}
