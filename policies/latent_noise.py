"""DSRL's actor (Wagenmaker et al. 2025, "Steering Your Diffusion Policy with Latent Space
Reinforcement Learning"): a small tanh-Gaussian policy over the *initial noise* of a frozen
flow policy. The flow's deterministic ODE maps the chosen noise to the action chunk, so RL
moves only this actor (about 0.5M weights at the defaults) and never the flow.

Its action is the noise scaled into [-1, 1]^D (`squashed`); the flow starts from
`bound * squashed`, so the noise stays within [-bound, bound] per dimension, where the flow
was trained (N(0, I) puts 87% of its mass inside 1.5)."""

from __future__ import annotations

import torch
from torch import nn

from embodied.policies.squashed_gaussian import EDGE, layer_norm_mlp, squash_log_prob

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class LatentNoiseActor(nn.Module):
    def __init__(self, context_dim: int, noise_dim: int, hidden: list[int], bound: float):
        super().__init__()
        self.noise_dim, self.bound = noise_dim, bound
        self.net = layer_norm_mlp([context_dim, *hidden, 2 * noise_dim], nn.ReLU, layer_norm=True)

    def distribution(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(context).chunk(2, dim=-1)
        return mean, LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1)

    def sample(
        self, context: torch.Tensor, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised squashed noise in [-1, 1]^D and its log-probability."""
        mean, log_std = self.distribution(context)
        u = mean
        if not deterministic:
            u = mean + log_std.exp() * torch.randn(
                mean.shape, generator=generator, dtype=mean.dtype, device=mean.device
            )
        return torch.tanh(u), squash_log_prob(u, mean, log_std)

    def log_prob(self, context: torch.Tensor, squashed: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.distribution(context)
        return squash_log_prob(torch.atanh(squashed.clamp(-EDGE, EDGE)), mean, log_std)
