"""Timing model calls on a device: a CUDA call is timed once it has finished, not when it was
queued. token_vla_real_size.py and the OpenVLA measurement time their rollout and update
steps with it."""

from __future__ import annotations

import time
from typing import Any, Callable

import torch


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
