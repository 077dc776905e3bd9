"""Small MLP Gaussian actor-critic over the state vector, predicting C actions at once.

Separate actor and critic networks with orthogonal initialisation (the PPO reference setup);
a state-independent log-std per action dimension; inputs normalised by running statistics."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from embodied.core.errors import ConfigError
from embodied.core.policy import Policy, Recomputed
from embodied.core.registry import POLICIES
from embodied.core.types import ActionChunk, EnvSpec, Observation
from embodied.policies.normalization import RunningNormalizer

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


@dataclass
class MLPPolicyConfig:
    name: str = "mlp_gaussian"
    chunk_size: int = 1  # actions predicted and executed per env step
    actor_hidden: list[int] = field(default_factory=lambda: [64, 64])
    critic_hidden: list[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"
    init_log_std: float = 0.0
    normalize_observation: bool = True


def mlp(sizes: list[int], activation: type[nn.Module], out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        linear = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(linear.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(activation())
    return nn.Sequential(*layers)


class MLPGaussianPolicy(nn.Module, Policy):
    def __init__(self, cfg: MLPPolicyConfig, spec: EnvSpec):
        super().__init__()
        if cfg.activation not in ACTIVATIONS:
            raise ConfigError(f"policy.activation must be one of {sorted(ACTIVATIONS)}, got '{cfg.activation}'")
        if spec.image_shapes:
            raise ConfigError(
                f"policy '{cfg.name}' reads only the state vector, but the env sends images "
                f"{sorted(spec.image_shapes)}: use state observations (env.obs_mode=state; for LIBERO "
                f"env.cameras=[]) or an image policy"
            )
        if cfg.chunk_size < 1:
            raise ConfigError(f"policy.chunk_size must be >= 1, got {cfg.chunk_size}")
        self.spec = spec
        self.chunk_size = cfg.chunk_size
        out = cfg.chunk_size * spec.action_dim
        activation = ACTIVATIONS[cfg.activation]
        self.normalizer = RunningNormalizer(spec.state_dim) if cfg.normalize_observation else None
        self.actor = mlp([spec.state_dim, *cfg.actor_hidden, out], activation, out_gain=0.01)
        self.critic = mlp([spec.state_dim, *cfg.critic_hidden, 1], activation, out_gain=1.0)
        self.log_std = nn.Parameter(torch.full((out,), float(cfg.init_log_std)))

    def _features(self, observation: Observation) -> torch.Tensor:
        state = observation.state.to(self.log_std.device, torch.float32)
        return self.normalizer(state) if self.normalizer is not None else state

    def _log_prob(self, mean: torch.Tensor, flat_actions: torch.Tensor) -> torch.Tensor:
        """Diagonal Gaussian log-density written out: torch.distributions' argument checks
        cost more than the math at the batch sizes of single-env rollouts."""
        z = (flat_actions - mean) * torch.exp(-self.log_std)
        return (-0.5 * z.pow(2) - self.log_std - HALF_LOG_2PI).sum(-1)

    def _entropy(self, batch: int) -> torch.Tensor:
        return (0.5 + HALF_LOG_2PI + self.log_std).sum().expand(batch)

    def act(
        self, observation: Observation, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> ActionChunk:
        features = self._features(observation)
        mean = self.actor(features)
        if deterministic:
            flat = mean
        else:
            noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
            flat = mean + noise * self.log_std.exp()
        return ActionChunk(
            actions=flat.view(-1, self.chunk_size, self.spec.action_dim),
            log_prob=self._log_prob(mean, flat),
            value=self.critic(features).squeeze(-1),
        )

    def recompute(self, observation: Observation, chunk: ActionChunk) -> Recomputed:
        features = self._features(observation)
        flat = chunk.actions.reshape(features.shape[0], -1)
        return Recomputed(
            log_prob=self._log_prob(self.actor(features), flat),
            entropy=self._entropy(features.shape[0]),
            value=self.critic(features).squeeze(-1),
        )

    def value(self, observation: Observation) -> torch.Tensor:
        return self.critic(self._features(observation)).squeeze(-1)

    def bc_loss(self, observation: Observation, actions: torch.Tensor) -> torch.Tensor:
        mean = self.actor(self._features(observation))
        return -self._log_prob(mean, actions.reshape(actions.shape[0], -1)).mean()

    def update_normalization(self, observation: Observation) -> None:
        if self.normalizer is not None:
            self.normalizer.update(observation.state.to(self.log_std.device))


@POLICIES.register("mlp_gaussian", MLPPolicyConfig)
def make_mlp_policy(cfg: MLPPolicyConfig, spec: EnvSpec) -> Policy:
    return MLPGaussianPolicy(cfg, spec)
