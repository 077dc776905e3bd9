"""Real-time chunking (RTC, Black et al. 2025): a new chunk that agrees with the one executing.

While a chunk is computed the robot keeps executing the previous one, so the new chunk's first
`delay` actions are, in effect, the previous chunk's: whatever the policy says for those steps
is never executed. RTC samples the new chunk by guided inpainting: at each denoising step the
velocity is corrected so that the predicted clean chunk moves toward the previous chunk's
remaining actions, with full weight on the first `delay` actions, a weight that decays over the
rest of the overlap, and none beyond it.

In this package's convention (t = 1 noise, t = 0 actions; x0_hat = x_t - t v), with Y the
previous chunk's remaining actions (padded to the horizon) and W the per-action weights:

    g  = (W * (Y - x0_hat))^T d x0_hat / d x_t          (a vector-Jacobian product)
    v' = v - w(t) g,   w(t) = min(beta, ((1 - t)^2 + t^2) / (t (1 - t)))

which is the paper's Pi-GDM guidance with its time running the other way (tau = 1 - t). The
product is computed exactly, through the velocity field, as the paper does; `beta` caps the
guidance where w(t) blows up (t near 0 or 1).

A diffusion policy (x = sqrt(abar) x0 + sqrt(1 - abar) eps, epsilon prediction) is guided the
same way: x / (a + b), with a = sqrt(abar) and b = sqrt(1 - abar), is the flow's point at the
time of the same signal-to-noise ratio, s = b / (a + b). The flow's correction moves x0_hat by
s w(s) (a + b) g = b w(s) g (g now through x0_hat = (x - b eps) / a), which the noise
prediction carries as

    eps' = eps - a w(s) g."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from embodied.core.errors import ConfigError
from embodied.core.types import ChunkPrefix

SCHEDULES = ("exp", "linear")


def prefix_weights(horizon: int, pending: int, delay: int, schedule: str = "exp") -> torch.Tensor:
    """Weights (horizon,) of the new chunk's actions: 1 on the first `delay` (executed from the
    previous chunk whatever is sampled), decaying to 0 over the rest of the `pending` actions
    the previous chunk still has, 0 beyond them (nothing to agree with).

    exp: c (e^c - 1) / (e - 1) with c = (pending - i) / (pending - delay + 1), the paper's soft
    mask; linear: c itself."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"policy.rtc_schedule must be one of {SCHEDULES}, got '{schedule}'")
    if not 0 <= delay <= pending <= horizon:
        raise ValueError(
            f"real-time chunking needs 0 <= delay <= pending actions <= horizon, got delay {delay}, "
            f"{pending} pending actions, horizon {horizon}"
        )
    index = torch.arange(horizon, dtype=torch.float32)
    c = ((pending - index) / (pending - delay + 1)).clamp(min=0.0)
    ramp = c * torch.expm1(c) / math.expm1(1.0) if schedule == "exp" else c
    return torch.where(index < delay, torch.ones_like(c), torch.where(index < pending, ramp, torch.zeros_like(c)))


def guidance_weight(t: float, beta: float) -> float:
    """w(t) of the module docstring, capped at `beta` (and `beta` where it is infinite)."""
    if not 0.0 < t < 1.0:
        return beta
    return min(beta, ((1 - t) ** 2 + t**2) / (t * (1 - t)))


def guided_velocity(
    velocity_at, x: torch.Tensor, t: float, target: torch.Tensor, weights: torch.Tensor, beta: float
) -> torch.Tensor:
    """v' at (x, t): `velocity_at(x)` is the model's velocity (B, D) there, `target` the
    previous chunk's actions (B, D) and `weights` (B, D) theirs, both in the model's units."""
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        velocity = velocity_at(x)
        x0_hat = x - t * velocity
        (correction,) = torch.autograd.grad(x0_hat, x, grad_outputs=weights * (target - x0_hat.detach()))
    return velocity.detach() - guidance_weight(t, beta) * correction


def guided_noise(
    noise_at: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    abar: float,
    target: torch.Tensor,
    weights: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """eps' at (x, abar) of the module docstring: `noise_at(x)` is the model's predicted noise
    (B, D) there; `target` and `weights` as for `guided_velocity`."""
    a, b = math.sqrt(abar), math.sqrt(1.0 - abar)
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        noise = noise_at(x)
        x0_hat = (x - b * noise) / a
        (correction,) = torch.autograd.grad(x0_hat, x, grad_outputs=weights * (target - x0_hat.detach()))
    return noise.detach() - a * guidance_weight(b / (a + b), beta) * correction


def prefix_target(
    prefix: ChunkPrefix,
    batch: int,
    horizon: int,
    action_dim: int,
    schedule: str,
    chunk_vector: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device,
    action_width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pending actions as a target chunk (B, D) in a policy's units (`chunk_vector` maps
    actions (B, P, A) there, padding to the horizon), and their weights (B, D), row by row:
    zero on padding (of the row's pending actions, of the horizon, of an action wider than
    the env's, `action_width`)."""
    actions = torch.as_tensor(prefix.actions, dtype=torch.float32, device=device)
    if actions.ndim != 3 or actions.shape[0] != batch or actions.shape[2] != action_dim:
        raise ValueError(
            f"pending actions must be (batch={batch}, P >= 1, action_dim={action_dim}), got {tuple(actions.shape)}"
        )
    width = min(actions.shape[1], horizon)
    if width < 1:
        raise ValueError("real-time chunking needs at least one pending action")
    pending = np.broadcast_to(width if prefix.pending is None else np.asarray(prefix.pending), (batch,))
    delay = np.broadcast_to(np.asarray(prefix.delay), (batch,))
    per_action = torch.stack(
        [prefix_weights(horizon, min(int(p), horizon), min(int(d), horizon), schedule) for p, d in zip(pending, delay)]
    ).to(device)
    action_width = action_width or action_dim
    weights = per_action[:, :, None].expand(batch, horizon, action_width).clone()
    weights[:, :, action_dim:] = 0.0
    return chunk_vector(actions[:, :width]), weights.flatten(1)


class PrefixGuided:
    """The pending actions' target for a denoising policy that samples by real-time chunking;
    the policy has `cfg.horizon`, `cfg.rtc_schedule`, `spec`, `low`, `action_width` (its action
    vector's width, the env's or wider) and `_chunk_vector` (actions into its units)."""

    def _prefix_guide(self, prefix: ChunkPrefix, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return prefix_target(
            prefix,
            batch,
            self.cfg.horizon,
            self.spec.action_dim,
            self.cfg.rtc_schedule,
            self._chunk_vector,
            self.low.device,
            self.action_width,
        )
