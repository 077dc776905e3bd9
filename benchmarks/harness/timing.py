"""Timing model calls on a device: a CUDA call is timed once it has finished, not when it was
queued; and a token policy's rollout and GRPO update, timed as token_vla_real_size.py and the
OpenVLA measurement time them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from embodied.algos.grpo import grpo_loss
from embodied.core.types import ActionChunk, Observation


def timed(step: Callable[[], Any], device: torch.device, runs: int) -> tuple[list[float], Any]:
    """Seconds of each of `runs` calls after one warm-up call, and the last call's result."""
    result = step()
    seconds = []
    for _ in range(runs):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        result = step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return seconds, result


@dataclass
class TokenRollout:
    """A token policy's timed rollout chunk, kept for its timed GRPO update."""

    act_seconds: list[float]
    chunk: ActionChunk
    old: torch.Tensor  # the rollout's per-term log-probabilities, outside inference mode
    tokens: torch.Tensor

    def recorded(self, rows: slice) -> ActionChunk:
        """Those rows of the chunk as the learner receives them."""
        return ActionChunk(
            actions=self.chunk.actions[rows],
            log_prob=self.old[rows].sum(-1),
            record={"action_tokens": self.tokens[rows]},
        )


def timed_rollout(policy: Any, obs: Observation, device: torch.device, runs: int) -> TokenRollout:
    """A token policy acting on a batch of envs without gradients (as the actor runs it), timed."""
    generator = torch.Generator(device=device).manual_seed(0)
    policy.eval()

    def act() -> Any:
        with torch.inference_mode():
            return policy.act(obs, generator=generator)

    act_seconds, chunk = timed(act, device, runs)
    # clones leave inference mode: training may save them
    return TokenRollout(
        act_seconds, chunk, chunk.record["term_log_prob"].clone(), chunk.record["action_tokens"].clone()
    )


def timed_grpo_update(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    obs: Observation,
    rollout: TokenRollout,
    minibatch: int,
    device: torch.device,
    runs: int,
) -> tuple[list[float], float]:
    """Seconds of each GRPO update on the rollout's first `minibatch` rows (random advantages),
    and the last update's loss; the GPU's peak memory counts from here."""
    rows = slice(0, minibatch)
    old = rollout.old[rows]
    advantages = torch.randn(minibatch, generator=torch.Generator().manual_seed(1)).to(device)
    policy.train()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def update() -> float:
        recomputed = policy.recompute(obs.select(rows), rollout.recorded(rows))
        loss = grpo_loss(recomputed.term_log_prob, old, advantages, torch.ones_like(old))
        loss.total.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.total.detach())

    return timed(update, device, runs)


def speeds(rollout_batch: int, act_seconds: list[float], minibatch: int, update_seconds: list[float]) -> dict:
    """A results row's speed columns: median seconds per rollout chunk and per update, and their rates."""
    act, update = float(np.median(act_seconds)), float(np.median(update_seconds))
    return {
        "act_s": act,
        "chunks_per_s": rollout_batch / act,
        "update_s": update,
        "samples_per_s": minibatch / update,
    }
