"""Torch values as codec-ready numpy values, and back: what the learner and rollout send
each other (weights, trajectories). numpy has no bfloat16, so such tensors travel as their
raw 16-bit pattern with the torch dtype named beside them."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import torch

from embodied.algos.buffers import Trajectory
from embodied.core.codec import DEFAULT_LIMITS, Limits
from embodied.core.types import Observation

_RAW16 = {"bfloat16": torch.bfloat16}


def tensors_to_wire(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    arrays, raw = {}, {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu()
        dtype_name = str(tensor.dtype).removeprefix("torch.")
        if dtype_name in _RAW16:
            raw[name] = dtype_name
            tensor = tensor.view(torch.int16)
        arrays[name] = tensor.contiguous().numpy()
    return {"arrays": arrays, "raw": raw}


def tensors_from_wire(wire: dict[str, Any]) -> dict[str, torch.Tensor]:
    tensors = {}
    for name, array in wire["arrays"].items():
        # A copy: received buffers are read-only, and the tensors outlive the message.
        tensor = torch.from_numpy(np.array(array))
        if name in wire["raw"]:
            tensor = tensor.view(_RAW16[wire["raw"][name]])
        tensors[name] = tensor
    return tensors


def published_weights(policy: torch.nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """What a weight update carries: trainable parameters and all buffers (e.g. the
    observation-normalisation statistics). Frozen parameters never change, so they stay home.
    `state`: the policy's whole state dict where it was gathered elsewhere (a sharded policy)."""
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    buffers = {name for name, _ in policy.named_buffers()}
    state = policy.state_dict() if state is None else state
    return {name: value.detach().cpu().clone() for name, value in state.items() if name in trainable or name in buffers}


def weights_limits(policy: torch.nn.Module) -> Limits:
    """What a weight update for `policy` may measure on the wire: its whole state (an upper
    bound on what the learner publishes), where that exceeds the codec's defaults for outside
    peers. A VLA at its published size (pi0: 13 GB in float32) is larger than those."""
    sizes = [value.numel() * value.element_size() for value in policy.state_dict().values()]
    return Limits(
        max_frames=max(DEFAULT_LIMITS.max_frames, len(sizes)),
        max_header_bytes=DEFAULT_LIMITS.max_header_bytes,
        max_frame_bytes=max(DEFAULT_LIMITS.max_frame_bytes, max(sizes, default=0)),
        max_total_bytes=max(DEFAULT_LIMITS.max_total_bytes, sum(sizes) + DEFAULT_LIMITS.max_header_bytes),
        max_ndim=DEFAULT_LIMITS.max_ndim,
    )


def load_published_weights(policy: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    missing, unexpected = policy.load_state_dict(weights, strict=False)
    if unexpected:
        raise ValueError(f"weights for parameters this policy does not have: {', '.join(unexpected[:5])}")


def trajectory_to_wire(trajectory: Trajectory) -> dict[str, Any]:
    wire: dict[str, Any] = {}
    for f in fields(Trajectory):
        value = getattr(trajectory, f.name)
        if f.name == "observation":
            wire[f.name] = {
                "state": value.state.numpy(),
                "images": {k: v.numpy() for k, v in value.images.items()},
                "instruction": list(value.instruction),
            }
        elif f.name in ("record", "next_images"):
            wire[f.name] = tensors_to_wire(value)
        else:
            wire[f.name] = value.numpy()
    return wire


def trajectory_from_wire(wire: dict[str, Any]) -> Trajectory:
    values: dict[str, Any] = {}
    for f in fields(Trajectory):
        if f.name not in wire:
            raise ValueError(f"trajectory message lacks '{f.name}'")
        item = wire[f.name]
        if f.name == "observation":
            values[f.name] = Observation(
                state=torch.from_numpy(np.array(item["state"])),
                images={k: torch.from_numpy(np.array(v)) for k, v in item["images"].items()},
                instruction=[str(text) for text in item["instruction"]],
            )
        elif f.name in ("record", "next_images"):
            values[f.name] = tensors_from_wire(item)
        else:
            values[f.name] = torch.from_numpy(np.array(item))
    trajectory = Trajectory(**values)
    _check_shapes(trajectory)
    return trajectory


def _check_shapes(trajectory: Trajectory) -> None:
    """Every field time-major with the same (T, B), so a malformed message fails here, by name."""
    if trajectory.reward.dim() != 2:
        raise ValueError(f"trajectory reward must be (T, B), got shape {tuple(trajectory.reward.shape)}")
    steps, envs = trajectory.reward.shape
    observation = trajectory.observation
    named = [
        ("observation.state", observation.state),
        *((f"observation.images.{k}", v) for k, v in observation.images.items()),
        *((f"record.{k}", v) for k, v in trajectory.record.items()),
        *((f"next_images.{k}", v) for k, v in trajectory.next_images.items()),
        *(
            (f.name, getattr(trajectory, f.name))
            for f in fields(Trajectory)
            if f.name not in ("observation", "record", "next_images")
        ),
    ]
    for name, tensor in named:
        expected = (envs,) if name == "last_value" else (steps, envs)
        if tuple(tensor.shape[: len(expected)]) != expected:
            raise ValueError(
                f"trajectory field '{name}' has shape {tuple(tensor.shape)}, expected leading dims {expected}"
            )
