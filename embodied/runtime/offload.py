"""Collocated placement (`runtime.placement=collocated`): the rollout and the learner take
turns on one device, and whichever is idle keeps its policy (the learner: its optimizer state
too) in CPU memory, so the device holds one role's weights at a time.

The turns come by themselves with `runtime.max_policy_lag=0`: the learner waits for
trajectories while the rollout collects, and the rollout waits for weights while the learner
updates. An offloaded tensor keeps its identity (the optimizer's state stays keyed to its
parameters) but holds no elements, so a role that computed while offloaded would fail loudly
instead of quietly running somewhere else."""

from __future__ import annotations

import time
from typing import Iterator

import torch


class Offloader:
    """Moves a module's parameters and buffers, and an optimizer's state, to CPU memory and
    back, freeing them on their device in between. Disabled (disaggregated placement), it
    leaves them where they are."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, enabled: bool = True):
        self.module = module
        self.optimizer = optimizer
        self.enabled = enabled
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # (tensor emptied, its CPU copy)
        self.seconds = 0.0  # spent moving, in all
        self.bytes_moved = 0  # one way, last offload

    @property
    def offloaded(self) -> bool:
        return self.saved is not None

    def _tensors(self) -> Iterator[torch.Tensor]:
        seen: set[int] = set()
        state = self.optimizer.state.values() if self.optimizer is not None else []
        found = [
            *self.module.parameters(),
            *self.module.buffers(),
            *(value for entry in state for value in entry.values() if isinstance(value, torch.Tensor)),
        ]
        for tensor in found:
            if id(tensor) not in seen and tensor.numel():
                seen.add(id(tensor))
                yield tensor

    def offload(self) -> None:
        if self.offloaded or not self.enabled:
            return
        started = time.perf_counter()
        devices: set[torch.device] = set()
        saved = []
        with torch.no_grad():
            for parameter in self.module.parameters():
                parameter.grad = None  # the next update computes its own
            for tensor in self._tensors():
                devices.add(tensor.device)
                saved.append((tensor, tensor.detach().to("cpu", copy=True)))
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        self.saved = saved
        self.bytes_moved = sum(copy.numel() * copy.element_size() for _, copy in saved)
        if any(device.type == "cuda" for device in devices):
            torch.cuda.empty_cache()  # give the freed memory back, for the role in the other process
        self.seconds += time.perf_counter() - started

    def reload(self) -> None:
        if self.saved is None:
            return
        started = time.perf_counter()
        with torch.no_grad():
            for tensor, copy in self.saved:
                tensor.data = copy.to(tensor.device)
        self.saved = None
        self.seconds += time.perf_counter() - started
