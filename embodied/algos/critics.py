"""Q-function ensembles for off-policy learning, and the HL-Gauss categorical value loss.

`CriticEnsemble` evaluates N critics in one batched matrix product per layer (weights
(N, in, out)), each hidden layer with its own LayerNorm, as RLPD prescribes against
critic divergence at high update-to-data ratios. With `bins` > 1 each critic outputs
logits over a fixed support and its Q-value is the expectation (HL-Gauss)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class EnsembleLinear(nn.Module):
    def __init__(self, members: int, inputs: int, outputs: int):
        super().__init__()
        bound = 1 / math.sqrt(inputs)  # nn.Linear's default initialisation, per member
        self.weight = nn.Parameter(torch.empty(members, inputs, outputs).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(members, 1, outputs).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """(M, B, in) -> (M, B, out): every member, or the `members` chosen (M of them)."""
        if members is None:
            return torch.baddbmm(self.bias, x, self.weight)
        return torch.baddbmm(self.bias[members], x, self.weight[members])


class EnsembleLayerNorm(nn.Module):
    def __init__(self, members: int, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(members, 1, features))
        self.bias = nn.Parameter(torch.zeros(members, 1, features))

    def forward(self, x: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        weight, bias = (self.weight, self.bias) if members is None else (self.weight[members], self.bias[members])
        return F.layer_norm(x, x.shape[-1:]) * weight + bias


class CriticEnsemble(nn.Module):
    def __init__(
        self,
        members: int,
        state_dim: int,
        action_dim: int,
        hidden: list[int],
        layer_norm: bool = True,
        bins: int = 1,
        projection: nn.Module | None = None,
    ):
        """`projection`: a trainable module the members share, applied to the input first
        (from pixels: each camera's frozen features projected); `state_dim` is its output."""
        super().__init__()
        self.members = members
        self.projection = projection if projection is not None else nn.Identity()
        sizes = [state_dim + action_dim, *hidden, bins]
        layers: list[nn.Module] = []
        for i in range(len(sizes) - 1):
            layers.append(EnsembleLinear(members, sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2:
                if layer_norm:
                    layers.append(EnsembleLayerNorm(members, sizes[i + 1]))
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(
        self, state: torch.Tensor, action: torch.Tensor, members: torch.Tensor | None = None, repeats: int = 1
    ) -> torch.Tensor:
        """(N, B, bins) outputs of every critic for the same (B) state-action pairs, or (M, B,
        bins) of the `members` chosen (indices), computing only theirs. With `repeats` > 1 each
        state goes with `repeats` consecutive actions (B = states x repeats), projected once."""
        projected = self.projection(state)
        if repeats > 1:
            projected = projected.repeat_interleave(repeats, dim=0)
        x = torch.cat([projected, action], dim=-1)
        x = x.unsqueeze(0).expand(self.members if members is None else len(members), *x.shape)
        for layer in self.net:
            x = layer(x, members) if isinstance(layer, (EnsembleLinear, EnsembleLayerNorm)) else layer(x)
        return x


class HLGauss(nn.Module):
    """A scalar target y becomes the probabilities a Normal(y, sigma) puts on each bin of a
    fixed support (Imani & White; Farebrother et al. 2024), sigma a multiple of the bin
    width; the critic is trained by cross-entropy and its value is the expectation."""

    def __init__(self, low: float, high: float, bins: int, sigma_ratio: float = 0.75):
        super().__init__()
        if not low < high or bins < 2 or sigma_ratio <= 0:
            raise ValueError(
                f"HL-Gauss needs low < high, bins >= 2 and sigma_ratio > 0; got {low}, {high}, {bins}, {sigma_ratio}"
            )
        self.register_buffer("edges", torch.linspace(low, high, bins + 1))
        self.register_buffer("centers", (self.edges[:-1] + self.edges[1:]) / 2)
        self.sigma = sigma_ratio * (high - low) / bins

    def target_probs(self, target: torch.Tensor) -> torch.Tensor:
        # A target outside the support would put no mass inside it (and give no gradient).
        target = target.clamp(float(self.edges[0]), float(self.edges[-1]))
        cdf = torch.special.erf((self.edges - target.unsqueeze(-1)) / (math.sqrt(2) * self.sigma))
        mass = cdf[..., 1:] - cdf[..., :-1]
        return mass / (cdf[..., -1:] - cdf[..., :1]).clamp_min(1e-12)  # the part inside the support

    def value(self, logits: torch.Tensor) -> torch.Tensor:
        return (torch.softmax(logits, dim=-1) * self.centers).sum(-1)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy per element of `target` (logits have one more, last, dimension)."""
        return -(self.target_probs(target) * torch.log_softmax(logits, dim=-1)).sum(-1)
