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

from embodied.core.types import ActionChunk, Observation
from embodied.policies.gaussian.squashed_gaussian import EDGE, layer_norm_mlp, squash_log_prob, squashed_sample

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
        self,
        context: torch.Tensor,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        samples: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised squashed noise in [-1, 1]^D and its log-probability (see
        `squashed_sample` for `samples`)."""
        return squashed_sample(*self.distribution(context), deterministic, generator, samples)

    def log_prob(self, context: torch.Tensor, squashed: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.distribution(context)
        return squash_log_prob(torch.atanh(squashed.clamp(-EDGE, EDGE)), mean, log_std)


# running the steps backwards: fixed-point iterations per step until the estimate moves less
# than this (pi0.5's tiny test model needs about 20; pi0's about 8), at most that many
INVERSION_TOLERANCE, INVERSION_ITERATIONS = 1e-6, 100


class NoiseSteering:
    """DSRL's side of a denoising policy (flow or diffusion): its deterministic sampler, run
    from the noise the latent actor picks, and run backwards to find the noise of a chunk.

    The policy sets `latent_actor` (None when `policy.latent_actor` is off) and `latent_width`,
    has `cfg.latent_bound` and `cfg.denoise_steps`, and provides `_state(observation)` (its
    context), `_deterministic_step(context, x, step)`, `_step_scale(context, x, step)` (how
    the step moves with x, for the inversion), `_chunk_vector(actions)` (env actions as the
    denoised vector) and `_actions(x0)` (the vector as env actions)."""

    latent_actor: LatentNoiseActor | None

    def _act_from_latent(
        self, context: torch.Tensor, deterministic: bool, generator: torch.Generator | None
    ) -> ActionChunk:
        """The latent actor picks the noise, the sampler maps it to the chunk. The record keeps
        the squashed noise: DSRL's action. Value 0: DSRL's critics live with the algorithm."""
        squashed, log_prob = self.latent_actor.sample(self.latent_input(context), deterministic, generator)
        x0 = self.denoise(context, self.cfg.latent_bound * squashed)
        return ActionChunk(
            actions=self._actions(x0), log_prob=log_prob, value=torch.zeros_like(log_prob), record={"latent": squashed}
        )

    def denoise(self, context: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The deterministic sampler from `noise` (B, D) to the denoised chunk."""
        x = noise
        for step in range(self.cfg.denoise_steps):
            x = self._deterministic_step(context, x, step)
        return x

    @torch.no_grad()
    def latent_for_actions(self, observation: Observation, actions: torch.Tensor) -> torch.Tensor:
        """The squashed noise whose chunk is `actions` (B, C, A, env units; a chunk shorter than
        the horizon repeats its last action) at `observation`, clipped into the latent actor's
        range. How an operator's correction becomes a DSRL action."""
        return self.invert(self._state(observation), actions)

    def invert(self, context: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """`latent_for_actions` given the context: each step x' = step(x) solved for x by the
        iteration x <- x + (x' - step(x)) / scale(x)."""
        x = self._chunk_vector(actions.to(context.device, torch.float32))
        for step in reversed(range(self.cfg.denoise_steps)):
            earlier = x
            for _ in range(INVERSION_ITERATIONS):
                scale = self._step_scale(context, earlier, step)
                estimate = earlier + (x - self._deterministic_step(context, earlier, step)) / scale
                converged = float((estimate - earlier).detach().abs().max()) < INVERSION_TOLERANCE
                earlier = estimate
                if converged:
                    break
            x = earlier
        return (x / self.cfg.latent_bound).clamp(-1, 1)

    def latent_context(self, observation: Observation) -> torch.Tensor:
        """What the latent actor and DSRL's critics read (B, latent_width), fixed while the
        policy is frozen."""
        with torch.no_grad():
            return self.latent_input(self._state(observation))

    def latent_input(self, context: torch.Tensor) -> torch.Tensor:
        """The latent actor's input from the context: the context itself where it is one
        vector; a model whose context is a sequence (a VLM's prefix) pools it."""
        return context

    def new_modules(self) -> set[str]:
        return {"latent_actor"} if self.latent_actor is not None else set()
