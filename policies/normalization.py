"""How a policy normalises what it reads and writes, kept as module buffers (saved with the
weights): this run's running mean and variance of its inputs (`RunningNormalizer`), or fixed
statistics, a pretrained checkpoint's or a dataset's (`StatisticsNormalizer`; read by
`policies/pretrained/statistics.py`).

Fixed statistics are an affine map per element, `normalised = (x - offset) / scale_in` and
`x = normalised * scale_out + offset`, with each library's own epsilon where it puts it, so
statistics of any shape (per dimension, or per horizon step and dimension) apply as they did
in training."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from embodied.core.errors import ConfigError


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


@dataclass(frozen=True)
class FeatureStatistics:
    """How one feature (the state, or the actions) was normalised in training."""

    mode: str  # e.g. "lerobot MEAN_STD", "openpi quantiles": for messages and the record
    source: str  # the file and key the statistics came from
    offset: np.ndarray
    scale_in: np.ndarray  # normalise: (x - offset) / scale_in
    scale_out: np.ndarray  # unnormalise: y * scale_out + offset

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.offset.shape)

    def require_width(self, dim: int, horizon: int | None = None) -> None:
        """Refuse statistics of another width than the env's `dim` (or, per horizon step, of
        more or fewer steps than `horizon`), naming where they came from."""
        shape = self.shape
        per_step = len(shape) == 2 and horizon is not None and shape[0] == horizon
        if shape[-1:] != (dim,) or not (len(shape) == 1 or per_step):
            wanted = f"({dim},)" + (f" or ({horizon}, {dim})" if horizon else "")
            raise ConfigError(f"{self.source}: statistics of shape {shape} do not fit the env's {wanted}")


def range_feature(mode: str, source: str, low: np.ndarray, width: np.ndarray) -> FeatureStatistics:
    """[low, low + width] onto [-1, 1], both ways."""
    half = np.asarray(width, dtype=np.float64) / 2
    return FeatureStatistics(mode, source, np.asarray(low, dtype=np.float64) + half, half, half)


class StatisticsNormalizer(nn.Module):
    """A feature's fixed training normalisation, as module buffers (saved with the weights,
    so a served checkpoint's `normalization_id` changes when they do)."""

    def __init__(self, statistics: FeatureStatistics, dtype: torch.dtype = torch.float32):
        """`dtype`: the arithmetic's precision; float64 where the publisher normalises in numpy's
        float64 (OpenVLA), which a width of 1e-8 beside values near 1 needs."""
        super().__init__()
        self.mode, self.source = statistics.mode, statistics.source
        for name in ("offset", "scale_in", "scale_out"):
            self.register_buffer(name, torch.as_tensor(getattr(statistics, name), dtype=dtype))

    @classmethod
    def unfitted(cls, dim: int) -> StatisticsNormalizer:
        """A normaliser whose statistics are still to come (`set`); NaN until then, so nothing
        can act on them by mistake."""
        nan = np.full(dim, np.nan)
        return cls(FeatureStatistics("not set yet", "SFT's demonstrations", nan, nan, nan))

    @property
    def fitted(self) -> bool:
        return not bool(torch.isnan(self.scale_in).any())

    @torch.no_grad()
    def set(self, statistics: FeatureStatistics) -> None:
        self.mode, self.source = statistics.mode, statistics.source
        for name in ("offset", "scale_in", "scale_out"):
            getattr(self, name).copy_(torch.as_tensor(getattr(statistics, name)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offset, scale_in, _ = self._for(x)
        if offset.dtype == torch.float64:  # in float64, returned at x's precision
            return ((x.double() - offset) / scale_in).to(x.dtype)
        return (x - offset) / scale_in

    def unnormalize(self, y: torch.Tensor) -> torch.Tensor:
        offset, _, scale_out = self._for(y)
        if offset.dtype == torch.float64:
            return (y.double() * scale_out + offset).to(y.dtype)
        return y * scale_out + offset

    def _for(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The buffers for `x`: per-horizon statistics (H, A) cut to its first steps (..., C, A)."""
        buffers = (self.offset, self.scale_in, self.scale_out)
        if self.offset.dim() == 2:
            return tuple(b[: x.shape[-2]] for b in buffers)
        return buffers
