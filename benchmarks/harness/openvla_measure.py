"""OpenVLA at its published architecture (random weights): saved in the published layout, then
loaded back with LoRA and bfloat16 and its rollout and GRPO step timed. openvla_real_size.py
measures it so, and the GPU campaign's openvla step through the same functions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.core.types import EnvSpec, Observation
from embodied.policies.pretrained.openvla import OpenVLAConfig, OpenVLAPolicy
from harness.timing import speeds, timed_grpo_update, timed_rollout

INSTRUCTION = "pick up the black bowl between the plate and the ramekin and place it on the plate"
ACTION_DIM, LORA_RANK = 7, 32
# (variant, image size, rollout batch, GRPO minibatch, timed runs): the GPU's, and --smoke's on a CPU
SIZES = {False: ("7b", 224, 64, 8, 3), True: ("tiny", 56, 4, 2, 1)}


def spec(size: int) -> EnvSpec:
    return EnvSpec(
        state_dim=8,
        action_dim=ACTION_DIM,
        action_low=(-1.0,) * ACTION_DIM,
        action_high=(1.0,) * ACTION_DIM,
        image_shapes={"image": (size, size, 3)},
    )


def observation(batch: int, size: int) -> Observation:
    g = torch.Generator().manual_seed(0)
    return Observation(
        state=torch.randn(batch, 8, generator=g),
        images={"image": torch.randint(0, 256, (batch, size, size, 3), generator=g, dtype=torch.uint8)},
        instruction=[INSTRUCTION] * batch,
    )


def save_random_checkpoint(folder: Path, variant: str, device: torch.device, size: int) -> float:
    """The published architecture with random weights, saved in the published layout."""
    started = time.perf_counter()
    torch.manual_seed(0)
    with device:
        policy = OpenVLAPolicy(OpenVLAConfig(variant=variant, lora_rank=0, precision="float32"), spec(size))
    policy.save_published(folder)
    del policy
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return time.perf_counter() - started


def measure(
    folder: Path, decoder: str, chunk: int, batch: int, minibatch: int, runs: int, device: torch.device, size: int
) -> dict[str, Any]:
    """The saved model with one decoder: its load time, rollout chunks/s over `batch` envs, GRPO
    samples/s on a minibatch and peak GPU memory (a table row)."""
    started = time.perf_counter()
    policy = OpenVLAPolicy(
        OpenVLAConfig(
            pretrained=str(folder), decoder=decoder, chunk_size=chunk, lora_rank=LORA_RANK, precision="bfloat16"
        ),
        spec(size),
    ).to(device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    load_s = time.perf_counter() - started
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-6)
    obs = observation(batch, size).to_torch(device)
    rollout = timed_rollout(policy, obs, device, runs)
    update_seconds, loss = timed_grpo_update(policy, optimizer, obs, rollout, minibatch, device, runs)
    row = {
        "decoder": decoder,
        "chunk_size": chunk,
        "parameters": sum(p.numel() for p in policy.parameters()),
        "trainable": sum(p.numel() for p in trainable),
        "load_s": load_s,
        "rollout_batch": batch,
        "minibatch": minibatch,
        **speeds(batch, rollout.act_seconds, minibatch, update_seconds),
        "peak_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None,
        "loss_finite": bool(np.isfinite(loss)),
    }
    policy = optimizer = None  # freed before the next model is built
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row
