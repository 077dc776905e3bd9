"""Running mean/variance of inputs, kept as module buffers (saved with the weights)."""

from __future__ import annotations

import torch
from torch import nn


class RunningNormalizer(nn.Module):
    def __init__(self, size: int, clip: float = 10.0, epsilon: float = 1e-8):
        super().__init__()
        self.clip = clip
        self.epsilon = epsilon
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Parallel (Chan et al.) merge of the batch moments into the running ones."""
        batch = batch.reshape(-1, batch.shape[-1]).to(torch.float64)
        batch_mean = batch.mean(0)
        batch_var = batch.var(0, unbiased=False)
        batch_count = batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean += delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count + delta.pow(2) * self.count * batch_count / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normalized = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var.to(x.dtype) + self.epsilon)
        return normalized.clamp(-self.clip, self.clip)
