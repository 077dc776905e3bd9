"""Pieces shared by the policies that denoise an action chunk (flow matching, diffusion):
Gaussian step likelihoods, the time embedding, and the map between env actions and the
[-1, 1] space the chunk is denoised in."""

from __future__ import annotations

import math

import torch

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Diagonal Gaussian log-density summed over the last dimension."""
    z = (x - mean) / std
    return (-0.5 * z.pow(2) - torch.log(std) - HALF_LOG_2PI).sum(-1)


def time_frequencies(features: int) -> torch.Tensor:
    """Frequencies of a sinusoidal embedding of a time in [0, 1] with `features` outputs."""
    return torch.exp(torch.linspace(0, math.log(100.0), features // 2))


def time_embedding(t: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """(B,) times in [0, 1] -> (B, 2 x len(frequencies)) sines and cosines."""
    angles = t[:, None] * frequencies[None]
    return torch.cat([torch.sin(angles), torch.cos(angles)], -1)


def to_unit(actions: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Env actions (..., A) within [low, high] -> [-1, 1]."""
    return 2 * (actions - low) / (high - low) - 1


def from_unit(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """[-1, 1] (clipped) -> env actions within [low, high]."""
    return low + (x.clamp(-1, 1) + 1) / 2 * (high - low)


def pad_to_horizon(actions: torch.Tensor, horizon: int) -> torch.Tensor:
    """Demonstrated chunks (B, C, A) cut or padded to `horizon` actions; a demo shorter than the
    horizon (its segment ended) repeats its last action."""
    if actions.shape[1] < horizon:
        actions = torch.cat([actions, actions[:, -1:].expand(-1, horizon - actions.shape[1], -1)], 1)
    return actions[:, :horizon]
