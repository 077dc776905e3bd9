"""Diffusion policy (DDPM or DDIM, epsilon prediction) with a likelihood for every denoising
step, for DPPO.

A denoiser (an MLP or a small transformer over the chunk's actions) predicts the noise eps in
x_t for a chunk of H actions (C <= H are executed), conditioned on the normalised state.
diffusers' schedulers give the noise schedule (abar_t) and the K inference timesteps; the
transitions are written out here so they are differentiable in the denoiser's output. From
timestep t to the next one s (abar_s = 1 after the last step):

    x0_hat = clip((x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t), -1, 1)
    alpha = abar_t / abar_s,  beta = 1 - alpha
    ddpm:  mean = sqrt(abar_s) beta / (1 - abar_t) x0_hat + sqrt(alpha) (1 - abar_s) / (1 - abar_t) x_t
           var  = (1 - abar_s) / (1 - abar_t) beta
    ddim:  eps_hat = (x_t - sqrt(abar_t) x0_hat) / sqrt(1 - abar_t)
           var  = eta^2 (1 - abar_s) / (1 - abar_t) beta
           mean = sqrt(abar_s) x0_hat + sqrt(1 - abar_s - var) eps_hat

With `min_std` = 0 these are diffusers' DDPMScheduler.step and DDIMScheduler.step (tested).
For RL each step's std is max(sqrt(var), `min_std`) (DPPO's floor): it keeps every step's
likelihood finite (DDPM's last step has variance 0) and keeps the policy exploring.

DPPO treats each denoising step as a step of a Gaussian policy. The chunk's log-likelihood is
the sum of the trained steps' Gaussians, and each step is also one term of `term_log_prob`
(B, k), so `algo.ratio=term` clips one ratio per step and `algo.denoise_discount` weights
earlier steps' advantages less. `finetune_steps` = k < K fine-tunes only the last k steps:
the first K - k run a frozen copy of the denoiser (the weights RL started from), and their
transitions are not part of the likelihood. That copy is kept in buffers, so it travels with
every weight update and checkpoint; it is taken from the denoiser whenever weights that do
not carry a pinned copy are loaded (an SFT checkpoint), and pinned by RL's first `recompute`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call

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
from embodied.policies.denoising.realtime import SCHEDULES, PrefixGuided, guided_noise
from embodied.policies.gaussian.latent_noise import LatentNoiseActor, NoiseSteering
from embodied.policies.gaussian.mlp import mlp
from embodied.policies.normalization import RunningNormalizer

SCHEDULERS = ("ddpm", "ddim")
DENOISERS = ("mlp", "transformer")


@dataclass
class DiffusionPolicyConfig:
    name: str = "diffusion"
    chunk_size: int = 1  # C actions executed per env step
    horizon: int = 4  # H actions predicted per chunk
    scheduler: str = "ddpm"  # ddpm | ddim
    train_timesteps: int = 100  # T, the noise schedule's length (SFT samples t in [0, T))
    denoise_steps: int = 10  # K timesteps at sampling, evenly spaced over T
    beta_schedule: str = "squaredcos_cap_v2"  # any of diffusers' (linear, scaled_linear, ...)
    ddim_eta: float = 1.0  # DDIM's stochasticity (0: its deterministic sampler)
    min_std: float = 0.1  # floor on each step's std, in the [-1, 1] action space
    finetune_steps: int = 0  # k: RL trains only the last k denoising steps (0: all K)
    denoiser: str = "mlp"  # mlp | transformer (one token per action of the chunk)
    hidden: list[int] = field(default_factory=lambda: [256, 256])  # mlp
    width: int = 64  # transformer
    layers: int = 2
    heads: int = 4
    critic_hidden: list[int] = field(default_factory=lambda: [256, 256])
    time_features: int = 16
    # sum: the chunk's log-density over the trained steps; mean: averaged over steps and
    # dimensions (a per-action scale, so the PPO ratio does not grow with H and k).
    log_prob_reduction: str = "sum"
    # DSRL (algo=dsrl): a small actor chooses the initial noise within [-latent_bound,
    # latent_bound] per dimension; the policy's deterministic sampler maps it to the chunk
    latent_actor: bool = False
    latent_hidden: list[int] = field(default_factory=lambda: [256, 256])
    latent_bound: float = 1.5
    # Real-time chunking (policies/denoising/realtime.py), where a chunk is asked for with the
    # actions still pending from the last one: the cap on the guidance weight and the decay of
    # the weights over the overlap after the delay (exp or linear)
    rtc_beta: float = 5.0
    rtc_schedule: str = "exp"


class MLPDenoiser(nn.Module):
    def __init__(self, condition_dim: int, chunk_dim: int, hidden: list[int]):
        super().__init__()
        self.net = mlp([condition_dim + chunk_dim, *hidden, chunk_dim], nn.Mish, out_gain=0.01)

    def forward(self, condition: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([condition, x], -1))


class TransformerDenoiser(nn.Module):
    """One token per action of the chunk plus one for the condition (state and time)."""

    def __init__(self, condition_dim: int, horizon: int, action_dim: int, width: int, layers: int, heads: int):
        super().__init__()
        self.horizon, self.action_dim = horizon, action_dim
        self.condition = nn.Linear(condition_dim, width)
        self.action_in = nn.Linear(action_dim, width)
        self.position = nn.Parameter(torch.zeros(horizon + 1, width))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.action_out = nn.Linear(width, action_dim)

    def forward(self, condition: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        tokens = torch.cat(
            [self.condition(condition)[:, None], self.action_in(x.view(-1, self.horizon, self.action_dim))], 1
        )
        return self.action_out(self.encoder(tokens + self.position)[:, 1:]).reshape(x.shape)


def make_scheduler(cfg: DiffusionPolicyConfig):
    """diffusers' scheduler for the noise schedule and the K inference timesteps."""
    from diffusers import DDIMScheduler, DDPMScheduler

    kind = DDPMScheduler if cfg.scheduler == "ddpm" else DDIMScheduler
    scheduler = kind(
        num_train_timesteps=cfg.train_timesteps,
        beta_schedule=cfg.beta_schedule,
        clip_sample=True,
        prediction_type="epsilon",
    )
    scheduler.set_timesteps(cfg.denoise_steps)
    return scheduler


def check_config(cfg: DiffusionPolicyConfig) -> None:
    if cfg.scheduler not in SCHEDULERS:
        raise ConfigError(f"policy.scheduler must be one of {SCHEDULERS}, got '{cfg.scheduler}'")
    if cfg.denoiser not in DENOISERS:
        raise ConfigError(f"policy.denoiser must be one of {DENOISERS}, got '{cfg.denoiser}'")
    if not 1 <= cfg.chunk_size <= cfg.horizon:
        raise ConfigError(f"policy.chunk_size must be in [1, policy.horizon={cfg.horizon}], got {cfg.chunk_size}")
    if not 1 <= cfg.denoise_steps <= cfg.train_timesteps:
        raise ConfigError(
            f"policy.denoise_steps must be in [1, policy.train_timesteps={cfg.train_timesteps}], "
            f"got {cfg.denoise_steps}"
        )
    if not 0 <= cfg.finetune_steps <= cfg.denoise_steps:
        raise ConfigError(
            f"policy.finetune_steps must be in [0, policy.denoise_steps={cfg.denoise_steps}] "
            f"(0: all), got {cfg.finetune_steps}"
        )
    if cfg.min_std <= 0:
        raise ConfigError(f"policy.min_std must be > 0 (a step without noise has no likelihood), got {cfg.min_std}")
    if cfg.ddim_eta < 0:
        raise ConfigError(f"policy.ddim_eta must be >= 0, got {cfg.ddim_eta}")
    if cfg.log_prob_reduction not in ("sum", "mean"):
        raise ConfigError(f"policy.log_prob_reduction must be 'sum' or 'mean', got '{cfg.log_prob_reduction}'")
    if cfg.rtc_beta < 0 or cfg.rtc_schedule not in SCHEDULES:
        raise ConfigError(
            f"policy.rtc_beta must be >= 0 and policy.rtc_schedule one of {SCHEDULES}, "
            f"got {cfg.rtc_beta} and '{cfg.rtc_schedule}'"
        )


class DiffusionPolicy(nn.Module, NoiseSteering, PrefixGuided, Policy):
    def __init__(self, cfg: DiffusionPolicyConfig, spec: EnvSpec):
        super().__init__()
        check_config(cfg)
        if spec.image_shapes:
            raise ConfigError("policy=diffusion reads only the state vector; use state observations")
        self.cfg, self.spec, self.chunk_size = cfg, spec, cfg.chunk_size
        self.action_width = spec.action_dim  # the chunk's width per action (a flow's may be wider)
        self.dim = cfg.horizon * spec.action_dim
        scheduler = make_scheduler(cfg)
        self.timesteps = [int(t) for t in scheduler.timesteps]
        abar = scheduler.alphas_cumprod.double()
        abar_next = [float(abar[t]) for t in self.timesteps[1:]] + [1.0]
        self.register_buffer("abar", abar.float(), persistent=False)  # (T,), for SFT's noising
        self.register_buffer("abar_step", abar[self.timesteps].float(), persistent=False)  # (K,)
        self.register_buffer("abar_next", torch.tensor(abar_next), persistent=False)  # (K,)
        unfloored = [
            denoising_step(
                torch.zeros(1), torch.zeros(1), self.abar_step[k], self.abar_next[k], cfg.scheduler, cfg.ddim_eta
            )[1]
            for k in range(cfg.denoise_steps)
        ]
        self.register_buffer("step_std", torch.stack(unfloored).reshape(-1).clamp(min=cfg.min_std), persistent=False)
        self.trained_from = cfg.denoise_steps - (cfg.finetune_steps or cfg.denoise_steps)  # the first trained step

        self.normalizer = RunningNormalizer(spec.state_dim)
        condition_dim = spec.state_dim + cfg.time_features
        if cfg.denoiser == "mlp":
            self.denoiser: nn.Module = MLPDenoiser(condition_dim, self.dim, cfg.hidden)
        else:
            self.denoiser = TransformerDenoiser(
                condition_dim, cfg.horizon, spec.action_dim, cfg.width, cfg.layers, cfg.heads
            )
        self.critic = mlp([spec.state_dim, *cfg.critic_hidden, 1], nn.Tanh, out_gain=1.0)
        self.register_buffer("low", torch.tensor(spec.action_low, dtype=torch.float32))
        self.register_buffer("high", torch.tensor(spec.action_high, dtype=torch.float32))
        self.register_buffer("frequencies", time_frequencies(cfg.time_features))
        self.base_names = [name for name, _ in self.denoiser.named_parameters()] if self.trained_from else []
        for name, parameter in self.denoiser.named_parameters():
            if self.trained_from:
                self.register_buffer(_base_key(name), parameter.detach().clone())
        self.register_buffer("base_pinned", torch.tensor(False))
        self.register_load_state_dict_pre_hook(self._base_from_denoiser)
        if cfg.latent_actor and cfg.latent_bound <= 0:
            raise ConfigError(f"policy.latent_bound must be > 0, got {cfg.latent_bound}")
        self.latent_width = spec.state_dim
        self.latent_actor = (
            LatentNoiseActor(spec.state_dim, self.dim, cfg.latent_hidden, cfg.latent_bound)
            if cfg.latent_actor
            else None
        )

    # ---- the frozen copy for the untrained early steps --------------------------------------

    def _base_from_denoiser(self, module: nn.Module, state_dict: dict, prefix: str, *_) -> None:
        """Weights without a pinned base (an SFT checkpoint, one trained on all steps) set the
        base to their denoiser; a base this policy does not use is dropped."""
        base_keys = [key for key in state_dict if key.startswith(prefix + "base__")]
        if not self.base_names:
            for key in base_keys:
                del state_dict[key]
            return
        pinned = state_dict.get(prefix + "base_pinned")
        if pinned is not None and bool(pinned) and base_keys:
            return
        for name in self.base_names:
            if prefix + "denoiser." + name in state_dict:
                state_dict[prefix + _base_key(name)] = state_dict[prefix + "denoiser." + name]
        state_dict[prefix + "base_pinned"] = torch.tensor(False)

    def _denoise(self, step: int, condition: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if step >= self.trained_from:
            return self.denoiser(condition, x)
        base = {name: getattr(self, _base_key(name)) for name in self.base_names}
        return functional_call(self.denoiser, base, (condition, x))

    # ---- the transitions ----------------------------------------------------------------------

    def _transition(self, state: torch.Tensor, x: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and floored std (B, D) of denoising step `step` (see the module docstring)."""
        mean = self._mean(x, self._eps(state, x, step), step)
        return mean, self.step_std[step].expand_as(mean)

    def _eps(self, state: torch.Tensor, x: torch.Tensor, step: int) -> torch.Tensor:
        t = torch.full((x.shape[0],), self.timesteps[step] / self.cfg.train_timesteps, device=x.device)
        return self._denoise(step, torch.cat([state, time_embedding(t, self.frequencies)], -1), x)

    def _mean(self, x: torch.Tensor, eps: torch.Tensor, step: int) -> torch.Tensor:
        return denoising_step(
            x, eps, self.abar_step[step], self.abar_next[step], self.cfg.scheduler, self.cfg.ddim_eta
        )[0]

    def _state(self, observation: Observation) -> torch.Tensor:
        return self.normalizer(observation.state.to(self.low.device, torch.float32))

    # ---- the policy contract ----------------------------------------------------------------

    def act(
        self,
        observation: Observation,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        prefix: ChunkPrefix | None = None,
    ) -> ActionChunk:
        """`prefix`: sample the chunk by real-time chunking to agree with the actions still
        pending from the last one (deterministic: each step's guided mean)."""
        state = self._state(observation)
        if prefix is not None and not self.accepts_prefix(deterministic):
            raise ValueError(
                "real-time chunking guides the denoising means: ask for deterministic chunks, without DSRL's "
                "latent actor"
            )
        if self.latent_actor is not None:
            return self._act_from_latent(state, deterministic, generator)
        batch, device = state.shape[0], state.device
        guide = self._prefix_guide(prefix, batch) if prefix is not None else None
        x = torch.randn(batch, self.dim, generator=generator, device=device)
        chain = [x]
        for step in range(self.cfg.denoise_steps):
            if guide is not None:
                x = self._mean(x, self._guided_eps(state, x, step, *guide), step)
                chain.append(x)
                continue
            mean, std = self._transition(state, x, step)
            x = mean if deterministic else mean + std * torch.randn(batch, self.dim, generator=generator, device=device)
            chain.append(x)
        chain = torch.stack(chain, 1)
        terms = self._terms(state, chain)
        return ActionChunk(
            actions=self._actions(x),
            log_prob=self._total(terms),
            value=self.critic(state).squeeze(-1),
            record={"chain": chain, "term_log_prob": terms},
        )

    def _actions(self, x0: torch.Tensor) -> torch.Tensor:
        """The first C of the H denoised actions, in the env's units."""
        return from_unit(x0.view(-1, self.cfg.horizon, self.spec.action_dim)[:, : self.chunk_size], self.low, self.high)

    # ---- real-time chunking ------------------------------------------------------------------
    def accepts_prefix(self, deterministic: bool) -> bool:
        """Whether `act` takes real-time chunking's pending actions: deterministic chunks
        (the guided means), not through DSRL's latent actor."""
        return self.latent_actor is None and deterministic

    # The guided chain's log_prob is computed by `act` under the unguided transitions: it means
    # nothing, and nothing reads it (guided chunks are served, not trained on).
    def _guided_eps(
        self, state: torch.Tensor, x: torch.Tensor, step: int, target: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """The step's predicted noise with real-time chunking's guidance."""
        return guided_noise(
            lambda point: self._eps(state, point, step),
            x,
            float(self.abar_step[step]),
            target,
            weights,
            self.cfg.rtc_beta,
        )

    # ---- DSRL (NoiseSteering): the frozen sampler steered through its initial noise ----------
    def _deterministic_step(self, context: torch.Tensor, x: torch.Tensor, step: int) -> torch.Tensor:
        """The step's mean: DDIM with ddim_eta=0 is its deterministic sampler; otherwise the
        sampler's noise left out."""
        return self._transition(context, x, step)[0]

    def _step_scale(self, context: torch.Tensor, x: torch.Tensor, step: int) -> torch.Tensor:
        """How the step's mean moves with each element of x, the predicted noise held fixed: the
        mean is elementwise in x then, and piecewise linear (the x0 estimate is clipped). Where
        the clip leaves it flat (the last step maps to the clipped x0 alone), the slope of
        the unclipped piece, which leads back into it."""
        eps, nudge = self._eps(context, x, step), 1e-3
        slope = (self._mean(x + nudge, eps, step) - self._mean(x, eps, step)) / nudge
        zero = torch.zeros_like(x[:1])
        unclipped = (self._mean(zero + nudge, zero, step) - self._mean(zero, zero, step)) / nudge
        return torch.where(slope.abs() > 1e-6, slope, unclipped)

    def _chunk_vector(self, actions: torch.Tensor) -> torch.Tensor:
        return to_unit(pad_to_horizon(actions, self.cfg.horizon), self.low, self.high).reshape(len(actions), -1)

    def _terms(self, state: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
        """(B, k) log-likelihoods of the trained steps' transitions."""
        terms = []
        for step in range(self.trained_from, self.cfg.denoise_steps):
            mean, std = self._transition(state, chain[:, step], step)
            terms.append(gaussian_log_prob(chain[:, step + 1], mean, std))
        terms = torch.stack(terms, 1)
        return terms / self.dim if self.cfg.log_prob_reduction == "mean" else terms

    def _total(self, terms: torch.Tensor) -> torch.Tensor:
        return terms.mean(-1) if self.cfg.log_prob_reduction == "mean" else terms.sum(-1)

    def recompute(self, observation: Observation, chunk: ActionChunk) -> Recomputed:
        if self.latent_actor is not None:
            raise ConfigError(
                "policy.latent_actor=true steers a frozen sampler through its noise: train it with algo=dsrl"
            )
        if self.base_names and not self.base_pinned:
            self.base_pinned.fill_(True)  # RL has begun: from now on the base is what it started from
        state = self._state(observation)
        terms = self._terms(state, chunk.record["chain"].to(state.device))
        return Recomputed(
            log_prob=self._total(terms),
            entropy=self._entropy(state),
            value=self.critic(state).squeeze(-1),
            term_log_prob=terms,
        )

    def _entropy(self, state: torch.Tensor) -> torch.Tensor:
        """The trained steps' Gaussian entropies: their stds follow the schedule (and the
        floor), not the weights, so this is a constant to log, not a bonus to train."""
        per_step = self.dim * (0.5 + HALF_LOG_2PI + torch.log(self.step_std[self.trained_from :]))
        total = per_step.mean() / self.dim if self.cfg.log_prob_reduction == "mean" else per_step.sum()
        return total.expand(state.shape[0])

    def value(self, observation: Observation) -> torch.Tensor:
        return self.critic(self._state(observation)).squeeze(-1)

    def bc_loss(self, observation: Observation, actions: torch.Tensor) -> torch.Tensor:
        """Epsilon prediction at a uniformly drawn training timestep (the DDPM loss)."""
        state = self._state(observation)
        x0 = to_unit(pad_to_horizon(actions.to(state.device), self.cfg.horizon), self.low, self.high).reshape(
            len(state), -1
        )
        t = torch.randint(0, self.cfg.train_timesteps, (len(state),), device=state.device)
        eps = torch.randn_like(x0)
        abar = self.abar[t][:, None]
        x_t = abar.sqrt() * x0 + (1 - abar).sqrt() * eps
        condition = torch.cat([state, time_embedding(t / self.cfg.train_timesteps, self.frequencies)], -1)
        return (self.denoiser(condition, x_t) - eps).pow(2).mean()

    def update_normalization(self, observation: Observation) -> None:
        if self.latent_actor is not None:
            return  # DSRL: the policy is frozen, and its input statistics are part of it
        self.normalizer.update(observation.state.to(self.low.device))


def denoising_step(
    x_t: torch.Tensor, eps: torch.Tensor, abar_t: torch.Tensor, abar_next: torch.Tensor, scheduler: str, eta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and (unfloored) std of one DDPM or DDIM step (see the module docstring)."""
    x0_hat = ((x_t - (1 - abar_t).sqrt() * eps) / abar_t.sqrt()).clamp(-1, 1)
    beta = 1 - abar_t / abar_next
    variance = (1 - abar_next) / (1 - abar_t) * beta
    if scheduler == "ddpm":
        mean = (
            abar_next.sqrt() * beta / (1 - abar_t) * x0_hat + (1 - beta).sqrt() * (1 - abar_next) / (1 - abar_t) * x_t
        )
        return mean, variance.clamp(min=1e-20).sqrt()
    variance = eta**2 * variance
    eps_hat = (x_t - abar_t.sqrt() * x0_hat) / (1 - abar_t).sqrt()
    mean = abar_next.sqrt() * x0_hat + (1 - abar_next - variance).clamp(min=0).sqrt() * eps_hat
    return mean, variance.sqrt()


def _base_key(name: str) -> str:
    return "base__" + name.replace(".", "__")


@POLICIES.register("diffusion", DiffusionPolicyConfig)
def make_diffusion_policy(cfg: DiffusionPolicyConfig, spec: EnvSpec) -> Policy:
    return DiffusionPolicy(cfg, spec)
