"""Pipelined against sequential rollout, measured the same way wherever it is measured
(pipeline.py on CPU cores, the GPU campaign's pipeline step with a GPU policy): a call's
seconds, rollout rates with and without pipelining, a stage of env workers stepped alone, and
the best ratio those times allow."""

from __future__ import annotations

import time

import numpy as np
import torch

from embodied.runtime.configs import LocalRuntimeConfig
from embodied.runtime.rollout import Rollout

STAGES = LocalRuntimeConfig.pipeline_stages  # the runtime's default grouping of env workers


def seconds_per_call(function, repeats: int = 20) -> float:
    """The mean seconds of a call, after one call to warm up."""
    function()
    started = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - started) / repeats


def rollout_rates(env, policy, steps: int, device: str = "cpu", stages: int = STAGES) -> dict[str, float]:
    """Env steps per second over `steps` chunk steps, sequential and pipelined: the best of two
    interleaved rollouts each, after a few steps to warm up."""
    rates: dict[str, float] = {}
    for pipeline in (False, True, False, True):  # interleaved, best of two each
        rollout = Rollout(env, policy, torch.device(device), pipeline=pipeline, pipeline_stages=stages)
        rollout.start()
        rollout.collect(3)
        started = time.perf_counter()
        _, _, env_steps = rollout.collect(steps)
        rate = env_steps / (time.perf_counter() - started)
        key = "pipelined" if pipeline else "sequential"
        rates[key] = max(rates.get(key, 0.0), rate)
    return rates


def stage_step(env, stage: int, actions: np.ndarray) -> None:
    """One worker's share of the envs stepped alone, the others idle."""
    env.send_stage_step(stage, actions[env.stage_rows(stage)])
    env.receive_stage_step(stage)


def pipelining_bound(
    step_s: float, stage_s: float, inference_s: float, stages: int, stage_inference_s: float | None = None
) -> float:
    """The best pipelined / sequential ratio these times allow: sequential pays the whole
    batch's step and inference one after the other; pipelined, each stage's step and its own
    inference, while the policy infers for every stage in turn. `stage_inference_s`: one
    stage's inference where measured (a GPU's small batches do not cost their share of the
    whole batch's); else its share."""
    stage_inference_s = inference_s / stages if stage_inference_s is None else stage_inference_s
    return (step_s + inference_s) / max(stages * stage_inference_s, stage_s + stage_inference_s)
