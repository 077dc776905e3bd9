"""Flow-matching policy with RL-ready samplers (Flow-SDE and Flow-Noise, as in πRL).

The policy predicts a chunk of H actions (C <= H are executed) by integrating a learned
velocity field from noise (t = 1) to actions (t = 0) in K steps, t_k = 1 - k/K. With
x_t = (1 - t) x0 + t x1 (x0 actions, x1 noise), the velocity is v = x1 - x0, so from a
prediction v at (x_t, t): x0_hat = x_t - t v, x1_hat = x_t + (1 - t) v, and the ODE step
to t - d is x0_hat (1 - (t - d)) + x1_hat (t - d) = x_t - d v.

Samplers, each recording the whole denoising chain so log-likelihoods can be recomputed:

- ode: deterministic (evaluation, SFT).
- flow_sde: one step, chosen uniformly per chunk, is stochastic:
      sigma_t = a sqrt(t / (1 - t))      (a = `noise_level`; the first step uses t of step 1,
                                          since sigma is infinite at t = 1)
      mean    = (1 - (t - d)) x0_hat + ((t - d) - sigma_t^2 d / (2 t)) x1_hat
      std     = sqrt(d) sigma_t
  The chunk's log-likelihood is that step's Gaussian; a = 0 is the ODE step. Needs K >= 2.
- flow_noise: every step adds noise whose std comes from a learned head, squashed into
  [`noise_std_min`, `noise_std_max`], around the ODE mean; the log-likelihood sums all K
  transitions and the initial N(0, I) term (K + 1 terms). Each transition is also one term
  of `term_log_prob`, so `algo.ratio=term` clips one ratio per denoising step, as ReinFlow
  does (its std floor is `noise_std_min`; `algo.denoise_discount` weights early steps less).

Log-probs are summed over the chunk's dimensions and, for flow_noise, over steps; with
`log_prob_reduction=mean` they are averaged instead. The choice changes the scale of the PPO
ratio (a sum over 4 x 7 x 5 terms moves far faster than one action's log-prob), so it is an
explicit setting."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from embodied.core.errors import ConfigError
from embodied.core.policy import Policy, Recomputed
from embodied.core.registry import POLICIES
from embodied.core.types import ActionChunk, ChunkPrefix, EnvSpec, Observation
from embodied.policies.denoising.common import (
    HALF_LOG_2PI,
    from_unit,
    gaussian_log_prob,
    pad_to_horizon,
    time_embedding,
    time_frequencies,
    to_unit,
)
from embodied.policies.denoising.realtime import SCHEDULES, PrefixGuided, guided_velocity
from embodied.policies.gaussian.latent_noise import LatentNoiseActor, NoiseSteering
from embodied.policies.gaussian.mlp import mlp
from embodied.policies.normalization import RunningNormalizer

SAMPLERS = ("ode", "flow_sde", "flow_noise")
SFT_TIMES = ("uniform", "beta")


@dataclass
class FlowPolicyConfig:
    name: str = "flow"
    chunk_size: int = 1  # C actions executed per env step
    horizon: int = 4  # H actions predicted per chunk
    denoise_steps: int = 4  # K
    sampler: str = "flow_sde"  # ode | flow_sde | flow_noise
    noise_level: float = 0.5  # a, Flow-SDE
    noise_std_min: float = 0.08  # Flow-Noise
    noise_std_max: float = 0.16
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    critic_hidden: list[int] = field(default_factory=lambda: [256, 256])
    time_features: int = 16
    # How a chunk's log-likelihood aggregates its terms: sum (the chunk's true log-density) or
    # mean over dimensions and stochastic steps (a per-action scale, so the PPO ratio does not
    # grow with the horizon and the number of steps).
    log_prob_reduction: str = "sum"
    # SFT's flow-matching time t (1: noise, 0: the demonstrated actions): uniform, or beta, pi0's
    # Beta(sft_time_alpha, sft_time_beta) * 0.999 + 0.001, which weights the noisy end
    sft_time: str = "uniform"
    sft_time_alpha: float = 1.5
    sft_time_beta: float = 1.0
    # DSRL (algo=dsrl): a small actor chooses the initial noise within [-latent_bound,
    # latent_bound] per dimension and the frozen flow's ODE maps it to the chunk
    latent_actor: bool = False
    latent_hidden: list[int] = field(default_factory=lambda: [256, 256])
    latent_bound: float = 1.5
    # Real-time chunking (policies/denoising/realtime.py), used where a chunk is asked for with
    # the actions still pending from the last one: the cap on the guidance weight (the paper's
    # beta) and the decay of the weights over the overlap after the delay (exp or linear)
    rtc_beta: float = 5.0
    rtc_schedule: str = "exp"


def sde_step(
    x_t: torch.Tensor, velocity: torch.Tensor, t: torch.Tensor, dt: float | torch.Tensor, sigma_t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of the Flow-SDE transition from t to t - dt (see the module docstring);
    `dt` a float, or per row (B, 1) with `t` and `sigma_t` (then the std is sqrt(dt) sigma_t too)."""
    x0_hat = x_t - t * velocity
    x1_hat = x_t + (1 - t) * velocity
    mean = (1 - (t - dt)) * x0_hat + ((t - dt) - sigma_t.pow(2) * dt / (2 * t)) * x1_hat
    return mean, (dt.sqrt() if isinstance(dt, torch.Tensor) else math.sqrt(dt)) * sigma_t


class FlowPolicy(nn.Module, NoiseSteering, PrefixGuided, Policy):
    accepts_images = False  # this one conditions on the state alone; the VLA adds encoders
    steerable = True  # DSRL's latent actor can steer it (see `latent_input`)

    def __init__(self, cfg: FlowPolicyConfig, spec: EnvSpec, context_dim: int | None = None):
        """`context_dim`: the size of what the flow and the critic are conditioned on (`_state`);
        the normalised state vector unless a subclass builds a richer context."""
        super().__init__()
        if cfg.sampler not in SAMPLERS:
            raise ConfigError(f"policy.sampler must be one of {SAMPLERS}, got '{cfg.sampler}'")
        if not 1 <= cfg.chunk_size <= cfg.horizon:
            raise ConfigError(f"policy.chunk_size must be in [1, policy.horizon={cfg.horizon}], got {cfg.chunk_size}")
        if cfg.denoise_steps < 1 or (cfg.sampler == "flow_sde" and cfg.denoise_steps < 2):
            raise ConfigError(
                "policy.denoise_steps must be >= 1, and >= 2 for flow_sde (its first step's "
                "noise uses the t of step 1, which is 0 when there is only one step)"
            )
        if cfg.sampler == "flow_sde" and cfg.noise_level <= 0:
            raise ConfigError(
                "policy.noise_level must be > 0 for flow_sde: without noise the step has no "
                "likelihood (use sampler=ode for deterministic sampling)"
            )
        if cfg.log_prob_reduction not in ("sum", "mean"):
            raise ConfigError(f"policy.log_prob_reduction must be 'sum' or 'mean', got '{cfg.log_prob_reduction}'")
        if cfg.sft_time not in SFT_TIMES or min(cfg.sft_time_alpha, cfg.sft_time_beta) <= 0:
            raise ConfigError(
                f"policy.sft_time must be one of {SFT_TIMES} (beta: alpha, beta > 0), got '{cfg.sft_time}'"
            )
        if not 0 < cfg.noise_std_min <= cfg.noise_std_max:
            raise ConfigError("policy.noise_std_min must be > 0 and <= policy.noise_std_max")
        if cfg.latent_actor and not self.steerable:
            raise ConfigError(
                f"policy '{cfg.name}' has no policy.latent_actor (DSRL) yet. DSRL runs on policy=flow, "
                "flow_vla, pi0, pi05, smolvla and diffusion"
            )
        if cfg.rtc_beta < 0 or cfg.rtc_schedule not in SCHEDULES:
            raise ConfigError(
                f"policy.rtc_beta must be >= 0 and policy.rtc_schedule one of {SCHEDULES}, "
                f"got {cfg.rtc_beta} and '{cfg.rtc_schedule}'"
            )
        if cfg.latent_actor and cfg.latent_bound <= 0:
            raise ConfigError(f"policy.latent_bound must be > 0, got {cfg.latent_bound}")
        if spec.image_shapes and not self.accepts_images:
            raise ConfigError(
                f"policy '{cfg.name}' reads only the state vector; use state observations or policy=flow_vla"
            )
        self.cfg, self.spec, self.chunk_size = cfg, spec, cfg.chunk_size
        self.action_width = self._action_width()
        self.dim = cfg.horizon * self.action_width
        # Only the env's action dimensions count in a chunk's log-likelihood and entropy: the
        # padding (pi0 denoises 32 numbers per action) moves nothing, and counting it would scale
        # the PPO ratio with the padding's width.
        self.counted_dim = cfg.horizon * spec.action_dim
        counted = None
        if self.action_width > spec.action_dim:
            counted = torch.zeros(cfg.horizon, self.action_width, dtype=torch.bool)
            counted[:, : spec.action_dim] = True
            counted = counted.flatten()
        self.register_buffer("counted", counted, persistent=False)  # None: every dimension counts
        self.times = [float(t) for t in torch.linspace(1.0, 0.0, cfg.denoise_steps + 1)]  # t_k = 1 - k/K
        # per step k: t_k, dt_k, sqrt(dt_k), sigma_k, from the Python floats the rollout's
        # _transition uses, so that recomputing a chain's log-prob looks them up per row
        steps = range(cfg.denoise_steps)
        terms = [[self.times[k], self._dt(k), math.sqrt(self._dt(k)), self._sigma(k)] for k in steps]
        self.register_buffer("sde_terms", torch.tensor(terms), persistent=False)
        self.normalizer = RunningNormalizer(spec.state_dim)
        self._build_heads(context_dim or spec.state_dim)
        self.context_dim = context_dim or spec.state_dim
        self.latent_width = self._latent_width()
        self.latent_actor = (
            LatentNoiseActor(self.latent_width, self.dim, cfg.latent_hidden, cfg.latent_bound)
            if cfg.latent_actor
            else None
        )
        # DSRL's critics bootstrap from the next observation's context, images included
        self.needs_next_images = cfg.latent_actor and bool(spec.image_shapes)
        self.register_buffer("low", torch.tensor(spec.action_low, dtype=torch.float32))
        self.register_buffer("high", torch.tensor(spec.action_high, dtype=torch.float32))
        self.register_buffer("frequencies", time_frequencies(cfg.time_features))

    def _action_width(self) -> int:
        """Numbers per action in the denoised chunk: the env's action size, unless a model
        denoises actions padded to a fixed width (pi0); the env's take the first ones."""
        return self.spec.action_dim

    def _build_heads(self, context_dim: int) -> None:
        """The velocity field, the noise head and the critic: MLPs over [context, x, time]."""
        cfg = self.cfg
        inputs = context_dim + self.dim + cfg.time_features
        self.velocity = mlp([inputs, *cfg.hidden, self.dim], nn.SiLU, out_gain=0.01)
        self.noise_head = mlp([inputs, *cfg.hidden, self.dim], nn.SiLU, out_gain=0.01)
        self.critic = mlp([context_dim, *cfg.critic_hidden, 1], nn.Tanh, out_gain=1.0)

    # ---- the flow ---------------------------------------------------------------------------

    def _inputs(self, state: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return torch.cat([state, x, time_embedding(t, self.frequencies)], -1)

    def _field(
        self, context: torch.Tensor, x: torch.Tensor, t: torch.Tensor, noise: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The velocity (B, D) at (x, t) given `context`, and the noise head's logits where `noise`."""
        features = self._inputs(context, x, t)
        return self.velocity(features), self.noise_head(features) if noise else None

    def _value(self, context: torch.Tensor) -> torch.Tensor:
        return self.critic(self._value_input(context)).squeeze(-1)

    def _sigma(self, step: int) -> float:
        t = self.times[max(step, 1)]  # sigma is infinite at t = 1: the first step uses step 1's t
        return self.cfg.noise_level * math.sqrt(t / (1 - t))

    def _transition(
        self, state: torch.Tensor, x: torch.Tensor, step: int, stochastic: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std (B, D) of step `step`'s transition; std 0 where it is deterministic."""
        t, dt = self.times[step], self._dt(step)
        t_batch = torch.full((x.shape[0],), t, device=x.device)
        velocity, noise_logits = self._field(state, x, t_batch, noise=self.cfg.sampler == "flow_noise")
        ode_mean = x - dt * velocity
        if noise_logits is not None:
            squash = torch.sigmoid(noise_logits)
            std = self.cfg.noise_std_min + (self.cfg.noise_std_max - self.cfg.noise_std_min) * squash
            return ode_mean, std
        if self.cfg.sampler == "flow_sde":
            sigma = torch.tensor(self._sigma(step), device=x.device)
            mean, std = sde_step(x, velocity, torch.tensor(t, device=x.device), dt, sigma)
            chosen = stochastic[:, None]
            return torch.where(chosen, mean, ode_mean), torch.where(chosen, std.expand_as(x), torch.zeros_like(x))
        return ode_mean, torch.zeros_like(x)

    def _state(self, observation: Observation) -> torch.Tensor:
        return self.normalizer(observation.state.to(self.low.device, torch.float32))

    def _actions(self, x0: torch.Tensor) -> torch.Tensor:
        """The first C of the H predicted actions, in the env's units."""
        chunk = x0.view(-1, self.cfg.horizon, self.action_width)[:, : self.chunk_size, : self.spec.action_dim]
        return self._to_env(chunk)

    def _to_env(self, chunk: torch.Tensor) -> torch.Tensor:
        """The model's actions (B, C, A) as env actions: from [-1, 1] to the env's bounds."""
        return from_unit(chunk, self.low, self.high)

    def _to_model(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions (B, H, A) in the model's units, the inverse of `_to_env`."""
        return to_unit(actions, self.low, self.high)

    # ---- the policy contract ----------------------------------------------------------------
    def act(
        self,
        observation: Observation,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        prefix: ChunkPrefix | None = None,
    ) -> ActionChunk:
        """`prefix`: sample the chunk by real-time chunking to agree with the actions still
        pending from the last one (deterministic, the guided ODE)."""
        return self._act_on(self._state(observation), deterministic, generator, prefix)

    def _act_on(
        self,
        state: torch.Tensor,
        deterministic: bool,
        generator: torch.Generator | None,
        prefix: ChunkPrefix | None = None,
    ) -> ActionChunk:
        """Sample a chunk conditioned on `state` (the context the flow reads)."""
        if prefix is not None and not self.accepts_prefix(deterministic):
            raise ValueError(
                "real-time chunking samples the guided ODE: ask for deterministic chunks, without DSRL's latent actor"
            )
        if self.latent_actor is not None:
            return self._act_from_latent(state, deterministic, generator)
        batch, device = state.shape[0], state.device
        guide = self._prefix_guide(prefix, batch) if prefix is not None else None
        x = torch.randn(batch, self.dim, generator=generator, device=device)
        chain = [x]
        steps = self.cfg.denoise_steps
        sde_step_index = torch.randint(0, steps, (batch,), generator=generator, device=device)
        for step in range(steps):
            if guide is not None:
                x = self._guided_step(state, x, step, *guide)
            else:
                stochastic = (sde_step_index == step) & (not deterministic)  # deterministic: the plain ODE
                mean, std = self._transition(state, x, step, stochastic)
                noise = torch.randn(batch, self.dim, generator=generator, device=device)
                x = mean if deterministic or self.cfg.sampler == "ode" else mean + std * noise
            chain.append(x)
        record = {"chain": torch.stack(chain, 1), "sde_step": sde_step_index}
        log_prob, terms = self._chain_log_prob(state, record["chain"], sde_step_index)
        if terms is not None:
            record["term_log_prob"] = terms
        return ActionChunk(actions=self._actions(x), log_prob=log_prob, value=self._value(state), record=record)

    # ---- real-time chunking ------------------------------------------------------------------
    def accepts_prefix(self, deterministic: bool) -> bool:
        """Whether `act` takes real-time chunking's pending actions: it samples the guided ODE,
        so deterministic chunks (or the ode sampler), and not through DSRL's latent actor."""
        return self.latent_actor is None and (deterministic or self.cfg.sampler == "ode")

    # The guided chain's log_prob is computed by `_act_on` under the unguided transitions: it
    # means nothing, and nothing reads it (guided chunks are served, not trained on).
    def _guided_step(
        self, state: torch.Tensor, x: torch.Tensor, step: int, target: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """One Euler step of the ODE with real-time chunking's guided velocity."""
        t, dt = self.times[step], self._dt(step)
        t_batch = torch.full((x.shape[0],), t, device=x.device)
        velocity = guided_velocity(
            lambda point: self._field(state, point, t_batch, noise=False)[0], x, t, target, weights, self.cfg.rtc_beta
        )
        return x - dt * velocity

    # ---- DSRL (NoiseSteering): the frozen flow steered through its initial noise -----------
    def _deterministic_step(self, context: torch.Tensor, x: torch.Tensor, step: int) -> torch.Tensor:
        """The ODE's Euler step: x - dt v(x, t)."""
        plain = torch.zeros(len(x), dtype=torch.bool, device=x.device)
        return self._transition(context, x, step, plain)[0]

    def _step_scale(self, context: torch.Tensor, x: torch.Tensor, step: int) -> float:
        return 1.0  # x - dt v(x): the velocity is the only other term

    def _chunk_vector(self, actions: torch.Tensor) -> torch.Tensor:
        x = self._to_model(pad_to_horizon(actions, self.cfg.horizon))
        return nn.functional.pad(x, (0, self.action_width - self.spec.action_dim)).reshape(len(actions), -1)

    def _latent_width(self) -> int:
        return self.context_dim

    def _reduction(self) -> float:
        """What a chunk's summed log-density (and entropy) is divided by."""
        if self.cfg.log_prob_reduction == "sum":
            return 1.0
        terms = 1 if self.cfg.sampler == "flow_sde" else self.cfg.denoise_steps + 1
        return float(terms * self.counted_dim)

    def _chain_log_prob(
        self, state: torch.Tensor, chain: torch.Tensor, sde_step_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The chunk's log-prob and, for flow_noise, its terms (B, K): one per denoising step
        (ReinFlow-style per-step ratios with algo.ratio=term). The N(0, I) start is no term:
        it has no parameters, so it cancels in every ratio."""
        batch, device = chain.shape[0], chain.device
        if self.cfg.sampler == "ode":
            return torch.zeros(batch, device=device), None
        if self.cfg.sampler == "flow_sde":
            # each row's one stochastic step, all rows in one pass of the field: the same terms as
            # the rollout's _transition, with t, dt and sigma looked up per row
            step = sde_step_index.to(device, torch.long)
            rows = torch.arange(batch, device=device)
            t, dt, sqrt_dt, sigma = self.sde_terms.to(device)[step].split(1, dim=-1)  # (B, 1) each
            x = chain[rows, step]
            velocity, _ = self._field(state, x, t[:, 0], noise=False)
            mean, _ = sde_step(x, velocity, t, dt, sigma)
            log_prob = self._log_density(chain[rows, step + 1], mean, (sqrt_dt * sigma).expand_as(mean))
            return log_prob / self._reduction(), None
        start = self._log_density(chain[:, 0], torch.zeros_like(chain[:, 0]), torch.ones_like(chain[:, 0]))
        terms = []
        for step in range(self.cfg.denoise_steps):
            mean, std = self._transition(state, chain[:, step], step, torch.ones(batch, dtype=torch.bool))
            terms.append(self._log_density(chain[:, step + 1], mean, std))
        terms = torch.stack(terms, 1)
        per_term = float(self.counted_dim) if self.cfg.log_prob_reduction == "mean" else 1.0
        return (start + terms.sum(-1)) / self._reduction(), terms / per_term

    def _log_density(self, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """The Gaussian transition's log-density over the counted (the env's) dimensions."""
        if self.counted is None:
            return gaussian_log_prob(x, mean, std)
        return gaussian_log_prob(x[..., self.counted], mean[..., self.counted], std[..., self.counted])

    def recompute(self, observation: Observation, chunk: ActionChunk) -> Recomputed:
        return self._recompute_on(self._state(observation), chunk)

    def _recompute_on(self, state: torch.Tensor, chunk: ActionChunk) -> Recomputed:
        if self.latent_actor is not None:
            raise ConfigError(
                "policy.latent_actor=true steers a frozen flow through its noise: train it with algo=dsrl"
            )
        chain = chunk.record["chain"].to(state.device)
        log_prob, terms = self._chain_log_prob(state, chain, chunk.record["sde_step"].to(state.device))
        entropy = self._entropy(state, chain) / self._reduction()
        return Recomputed(log_prob=log_prob, entropy=entropy, value=self._value(state), term_log_prob=terms)

    def _entropy(self, state: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
        """Entropy of the chunk's stochastic transitions (Gaussian: sum of 0.5 + log(sqrt(2 pi) std))."""
        batch = chain.shape[0]
        if self.cfg.sampler == "flow_noise":
            total = torch.zeros(batch, device=chain.device)
            for step in range(self.cfg.denoise_steps):
                _, std = self._transition(state, chain[:, step], step, torch.ones(batch, dtype=torch.bool))
                std = std if self.counted is None else std[..., self.counted]
                total = total + (0.5 + HALF_LOG_2PI + torch.log(std)).sum(-1)
            return total
        if self.cfg.sampler == "flow_sde":
            # the mean over the uniformly chosen step of that step's (weight-independent) entropy
            entropies = [
                self.counted_dim * (0.5 + HALF_LOG_2PI + math.log(math.sqrt(self._dt(s)) * self._sigma(s)))
                for s in range(self.cfg.denoise_steps)
            ]
            return torch.full((batch,), sum(entropies) / len(entropies), device=chain.device)
        return torch.zeros(batch, device=chain.device)

    def _dt(self, step: int) -> float:
        return self.times[step] - self.times[step + 1]

    def value(self, observation: Observation) -> torch.Tensor:
        return self._value(self._state(observation))

    def _value_input(self, state: torch.Tensor) -> torch.Tensor:
        return state

    def bc_loss(self, observation: Observation, actions: torch.Tensor) -> torch.Tensor:
        return self._flow_matching_loss(self._state(observation), actions)

    def _flow_matching_loss(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Flow matching: regress v = x1 - x0 at a random t on x_t = (1 - t) x0 + t x1. Demos
        shorter than the horizon repeat their last action."""
        x0 = self._to_model(pad_to_horizon(actions.to(state.device), self.cfg.horizon))
        x0 = nn.functional.pad(x0, (0, self.action_width - self.spec.action_dim)).reshape(len(state), -1)
        x1 = torch.randn_like(x0)
        t = self._sft_time(len(state), state.device)
        x_t = (1 - t[:, None]) * x0 + t[:, None] * x1
        return (self._field(state, x_t, t, noise=False)[0] - (x1 - x0)).pow(2).mean()

    def _sft_time(self, batch: int, device: torch.device) -> torch.Tensor:
        if self.cfg.sft_time == "uniform":
            return torch.rand(batch, device=device)
        beta = torch.distributions.Beta(torch.tensor(self.cfg.sft_time_alpha), torch.tensor(self.cfg.sft_time_beta))
        return (beta.sample((batch,)) * 0.999 + 0.001).to(device)  # pi0's: never exactly the data end

    def update_normalization(self, observation: Observation) -> None:
        if self.latent_actor is not None:
            return  # DSRL: the flow is frozen, and its input statistics are part of it
        self.normalizer.update(observation.state.to(self.low.device))


@POLICIES.register("flow", FlowPolicyConfig)
def make_flow_policy(cfg: FlowPolicyConfig, spec: EnvSpec) -> Policy:
    return FlowPolicy(cfg, spec)
