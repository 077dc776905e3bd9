"""Tanh-squashed Gaussian actor over the state vector, and over camera images where the env
has cameras: the actor of SAC/RLPD.

Its action lives in [-1, 1]^A (`squashed`) and is mapped affinely onto the env's bounds. The
log-probability is the squashed action's density (change of variables through tanh, in
the stable form log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))); the constant of the
affine map to the env's bounds is left out, so the entropy target is defined in [-1, 1]^A.
The critics live with the algorithm (`embodied/algos/sac_rlpd.py`): only this actor is
published to rollouts and served.

From pixels (HIL-SERL's recipe) each camera goes through a frozen pretrained backbone
(`policies/image_backbones.py`) and a small trainable projection (Linear, LayerNorm, tanh).
The learner works on the *input* vector [state, frozen features of each camera]: its frozen
part can be computed once per stored frame, and the actor and each critic project it with
their own trainable heads (`PixelProjection`; `new_projection` gives the critics theirs), or
the critics train the actor's head and the actor reads it detached (`detach_projection`, set
by algo=sac_rlpd's `actor_projection: critics`, as HIL-SERL's actor reads its encoder).
With spatial features, `spatial_embeddings` puts HIL-SERL's learned spatial embeddings in
front of each head (`SpatialEmbeddings`).

With `gripper_commands` the last action dimension is a gripper that picks one of those env
commands by its own Q-values, as HIL-SERL's grasp critic does: the Gaussian covers the arm's
dimensions only, and `GripperCritic` (trained by algo=sac_rlpd with double DQN) is part of the
policy, so rollouts and `embodied serve` act with it. The gripper then does not explore by
noise: demos, corrections and its Q-values decide it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from embodied.core.errors import ConfigError
from embodied.core.policy import Policy, Recomputed
from embodied.core.registry import POLICIES
from embodied.core.types import ActionChunk, EnvSpec, Observation
from embodied.policies.gaussian.mlp import ACTIVATIONS
from embodied.policies.image_backbones import frozen_backbone

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
EDGE = 1 - 1e-6  # stored actions at the bounds are pulled in by this much before atanh


@dataclass
class SquashedGaussianConfig:
    name: str = "squashed_gaussian"
    chunk_size: int = 1
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    activation: str = "relu"
    layer_norm: bool = True
    log_std_min: float = -5.0
    log_std_max: float = 2.0
    # from pixels, the frozen backbone: efficientnet_lite0 | random_cnn | timm:<model> | torchvision:<model>
    image_backbone: str = "efficientnet_lite0"
    # its features: pooled (averaged over space) | spatial (its feature map flattened: where things are survives)
    image_features: str = "pooled"
    image_projection: int = 64  # each camera's trainable projection width
    # with image_features=spatial: K learned weightings of the map's positions per channel before
    # the projection (HIL-SERL's learned spatial embeddings, K=8 there); 0: it reads the whole map
    spatial_embeddings: int = 0
    cameras: Optional[list[str]] = None  # the env cameras it reads: None every one, [] none (state only)
    # the env commands a discrete gripper (the last action dimension) chooses among, e.g. [-1, 1]
    # for ManiSkill's Panda (closed, open); empty: the gripper is continuous like the arm
    gripper_commands: list[float] = field(default_factory=list)
    gripper_hidden: list[int] = field(default_factory=lambda: [128, 128])  # the gripper critic's MLP


def layer_norm_mlp(sizes: list[int], activation: type[nn.Module], layer_norm: bool) -> nn.Sequential:
    """Linear layers, each hidden one followed by LayerNorm (RLPD's fix for critic blow-up)
    and the activation."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            if layer_norm:
                layers.append(nn.LayerNorm(sizes[i + 1]))
            layers.append(activation())
    return nn.Sequential(*layers)


def squash_log_prob(u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log density of tanh(u) for u ~ N(mean, exp(log_std)^2), summed over action dimensions."""
    gaussian = -0.5 * ((u - mean) * torch.exp(-log_std)).pow(2) - log_std - HALF_LOG_2PI
    jacobian = 2 * (math.log(2) - u - F.softplus(-2 * u))
    return (gaussian - jacobian).sum(-1)


def squashed_sample(
    mean: torch.Tensor,
    log_std: torch.Tensor,
    deterministic: bool = False,
    generator: torch.Generator | None = None,
    samples: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """tanh of a reparameterised Normal(mean, exp(log_std)) draw (of the mean where
    `deterministic`), and its log-probability. With `samples` > 1, that many draws per row,
    row i's at i * samples onwards: what the rows repeated in place would give, with whatever
    computed `mean` and `log_std` run once per row."""
    if samples > 1:
        mean, log_std = mean.repeat_interleave(samples, dim=0), log_std.repeat_interleave(samples, dim=0)
    u = mean
    if not deterministic:
        u = mean + torch.exp(log_std) * torch.randn(
            mean.shape, generator=generator, dtype=mean.dtype, device=mean.device
        )
    return torch.tanh(u), squash_log_prob(u, mean, log_std)


class SpatialEmbeddings(nn.Module):
    """A (C, H, W) feature map, flattened -> (C x K): for each channel, K learned weighted sums
    over the map's positions (HIL-SERL's learned spatial embeddings). Where a feature fires
    survives, at far fewer weights than a linear layer over the whole map."""

    def __init__(self, map_shape: tuple[int, int, int], count: int):
        super().__init__()
        self.map_shape = map_shape
        self.kernel = nn.Parameter(torch.empty(*map_shape, count))
        nn.init.normal_(self.kernel, std=1.0 / math.sqrt(math.prod(map_shape)))  # LeCun's scale

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        channels, height, width = self.map_shape
        # (C, B, H x W) @ (C, H x W, K): one small product per channel, batched; on a CPU about
        # twice as fast, forward and backward, as the same einsum ("bchw,chwk->bck")
        maps = features.reshape(-1, channels, height * width).transpose(0, 1).contiguous()
        return torch.bmm(maps, self.kernel.view(channels, height * width, -1)).transpose(0, 1).flatten(1)


class PixelProjection(nn.Module):
    """[state, frozen features of each camera] -> [state, tanh(LayerNorm(W features)) of each
    camera]: the trainable part of the image encoder. Identity without cameras. With
    `map_shapes` (each camera's (C, H, W)) and `embeddings` K > 0, each camera's map first
    goes through SpatialEmbeddings, and W reads its C x K values."""

    def __init__(
        self,
        state_dim: int,
        feature_dims: list[int],
        width: int,
        map_shapes: list[tuple[int, int, int]] | None = None,
        embeddings: int = 0,
    ):
        super().__init__()
        self.state_dim, self.feature_dims = state_dim, feature_dims  # one width per camera

        def head(dim: int, map_shape: tuple[int, int, int] | None) -> nn.Sequential:
            if not embeddings:
                return nn.Sequential(nn.Linear(dim, width), nn.LayerNorm(width), nn.Tanh())
            assert map_shape is not None
            return nn.Sequential(
                SpatialEmbeddings(map_shape, embeddings),
                nn.Linear(map_shape[0] * embeddings, width),
                nn.LayerNorm(width),
                nn.Tanh(),
            )

        shapes = map_shapes if embeddings else [None] * len(feature_dims)
        self.heads = nn.ModuleList(head(dim, shape) for dim, shape in zip(feature_dims, shapes))
        self.output_dim = state_dim + len(feature_dims) * width

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if not self.feature_dims:
            return inputs
        state, *parts = inputs.split([self.state_dim, *self.feature_dims], dim=-1)
        return torch.cat([state, *(head(part) for head, part in zip(self.heads, parts))], dim=-1)


class GripperCritic(nn.Module):
    """Q-values of each gripper command (B, commands) from the input vector, through its own
    projection of the frozen image features."""

    def __init__(self, projection: PixelProjection, hidden: list[int], commands: int, activation: type[nn.Module]):
        super().__init__()
        self.projection = projection
        self.net = layer_norm_mlp([projection.output_dim, *hidden, commands], activation, layer_norm=True)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(self.projection(inputs))


class SquashedGaussianPolicy(nn.Module, Policy):
    def __init__(self, cfg: SquashedGaussianConfig, spec: EnvSpec):
        super().__init__()
        if cfg.chunk_size != 1:
            raise ConfigError(
                f"policy '{cfg.name}' acts one step at a time: policy.chunk_size must be 1, got {cfg.chunk_size}"
            )
        if cfg.activation not in ACTIVATIONS:
            raise ConfigError(f"policy.activation must be one of {sorted(ACTIVATIONS)}, got '{cfg.activation}'")
        if not cfg.log_std_min < cfg.log_std_max:
            raise ConfigError(f"policy.log_std_min ({cfg.log_std_min}) must be below log_std_max ({cfg.log_std_max})")
        if cfg.image_projection < 1:
            raise ConfigError(f"policy.image_projection must be >= 1, got {cfg.image_projection}")
        self.spec = spec
        self.chunk_size = 1
        self.cfg = cfg
        self.cameras = sorted(spec.image_shapes if cfg.cameras is None else cfg.cameras)
        unknown = [camera for camera in self.cameras if camera not in spec.image_shapes]
        if unknown:
            raise ConfigError(
                f"policy.cameras names {unknown}, which the env does not have "
                f"(it has {sorted(spec.image_shapes) or 'none'})"
            )
        # the learner stores the next observation's frames too: its targets bootstrap from them
        self.needs_next_images = bool(self.cameras)
        self.backbone = frozen_backbone(cfg.image_backbone, cfg.image_features) if self.cameras else None
        # each camera's feature width (spatial features grow with the image)
        self.feature_dims = [self.backbone.output_dim(spec.image_shapes[c]) for c in self.cameras]
        self.map_shapes = self._map_shapes(cfg) if cfg.spatial_embeddings else None
        self.input_dim = spec.state_dim + sum(self.feature_dims)
        low = torch.tensor(spec.action_low, dtype=torch.float32)
        high = torch.tensor(spec.action_high, dtype=torch.float32)
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise ConfigError(
                f"policy '{cfg.name}' needs finite action bounds; the env has {spec.action_low} to {spec.action_high}"
            )
        self.register_buffer("action_center", (high + low) / 2)
        self.register_buffer("action_scale", (high - low) / 2)
        self.discrete_gripper = bool(cfg.gripper_commands)
        self.arm_dim = spec.action_dim - 1 if self.discrete_gripper else spec.action_dim  # the Gaussian's
        self.projection = self.new_projection()
        # set by algo=sac_rlpd with actor_projection=critics: the critics train the projection
        # and the actor's gradient stops at it
        self.detach_projection = False
        self.net = layer_norm_mlp(
            [self.projection.output_dim, *cfg.hidden, 2 * self.arm_dim], ACTIVATIONS[cfg.activation], cfg.layer_norm
        )
        self.gripper_critic: GripperCritic | None = None
        if self.discrete_gripper:
            check_gripper_commands(cfg.gripper_commands, float(low[-1]), float(high[-1]), spec.action_dim)
            self.register_buffer("gripper_commands", torch.tensor(cfg.gripper_commands, dtype=torch.float32))
            self.gripper_critic = GripperCritic(
                self.new_projection(), cfg.gripper_hidden, len(cfg.gripper_commands), ACTIVATIONS[cfg.activation]
            )

    # ---- inputs: the state and the frozen image features -------------------------------------
    def _map_shapes(self, cfg: SquashedGaussianConfig) -> list[tuple[int, int, int]]:
        """Each camera's (C, H, W) feature map, for spatial embeddings (which need one)."""
        if cfg.spatial_embeddings < 0:
            raise ConfigError(f"policy.spatial_embeddings must be >= 0, got {cfg.spatial_embeddings}")
        if cfg.image_features != "spatial" or self.backbone is None:
            raise ConfigError(
                "policy.spatial_embeddings weights the positions of a feature map: it needs cameras and "
                f"policy.image_features=spatial (got image_features={cfg.image_features}, cameras={self.cameras})"
            )
        shapes = [self.backbone.map_shape(self.spec.image_shapes[c]) for c in self.cameras]
        if any(len(shape) != 3 for shape in shapes):
            raise ConfigError(
                f"policy.spatial_embeddings needs (channels, height, width) feature maps; "
                f"{cfg.image_backbone} gives {shapes}"
            )
        return shapes  # type: ignore[return-value]

    def new_projection(self) -> PixelProjection:
        """A fresh trainable projection of the input vector (the actor's own, or a critic's)."""
        return PixelProjection(
            self.spec.state_dim,
            self.feature_dims,
            self.cfg.image_projection,
            self.map_shapes,
            self.cfg.spatial_embeddings,
        )

    @torch.no_grad()
    def image_features(self, images: dict[str, torch.Tensor]) -> torch.Tensor:
        """The frozen backbone's features of each camera, concatenated: (B, cameras x D)."""
        device = self.action_scale.device
        missing = [name for name in self.cameras if name not in images]
        if missing:
            raise ConfigError(f"policy '{self.cfg.name}' reads cameras {self.cameras}; the observation lacks {missing}")
        frames = [images[name].to(device) for name in self.cameras]
        if len({f.shape for f in frames}) > 1 or not len(frames[0]):  # cameras of different sizes: a pass each
            return torch.cat([self.backbone.features(f) for f in frames], dim=-1)
        # one pass over every camera's frames: a CPU encodes a few frames at a time far below its rate
        return torch.cat(self.backbone.features(torch.cat(frames)).split(len(frames[0])), dim=-1)

    def inputs(self, observation: Observation) -> torch.Tensor:
        """The input vector (B, input_dim): the state, then each camera's frozen features."""
        state = torch.as_tensor(observation.state).to(self.action_scale.device, torch.float32)
        if self.backbone is None:
            return state
        return torch.cat([state, self.image_features(observation.images)], dim=-1)

    def train(self, mode: bool = True) -> "SquashedGaussianPolicy":
        super().train(mode)
        if self.backbone is not None:
            self.backbone.eval()
        return self

    # ---- the squashed space the critics see (on input vectors) ---------------------------------
    def distribution(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        projected = self.projection(inputs.to(self.action_scale.device, torch.float32))
        if self.detach_projection:
            projected = projected.detach()
        mean, log_std = self.net(projected).chunk(2, dim=-1)
        log_std = self.cfg.log_std_min + 0.5 * (self.cfg.log_std_max - self.cfg.log_std_min) * (torch.tanh(log_std) + 1)
        return mean, log_std

    def sample(
        self,
        inputs: torch.Tensor,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        samples: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised squashed action in [-1, 1]^A and its log-probability (see
        `squashed_sample` for `samples`)."""
        return squashed_sample(*self.distribution(inputs), deterministic, generator, samples)

    def log_prob(self, inputs: torch.Tensor, squashed: torch.Tensor) -> torch.Tensor:
        """Of the arm's part of a squashed action (all of it with a continuous gripper)."""
        mean, log_std = self.distribution(inputs)
        return squash_log_prob(torch.atanh(squashed[..., : self.arm_dim].clamp(-EDGE, EDGE)), mean, log_std)

    def gripper_index(self, squashed: torch.Tensor) -> torch.Tensor:
        """The gripper command nearest each squashed action's last entry (B,): which of the
        discrete gripper's Q-values a stored action (a demo's, an operator's) chose."""
        command = self.action_center[-1] + self.action_scale[-1] * squashed[..., -1]
        return (command.unsqueeze(-1) - self.gripper_commands).abs().argmin(-1)

    def to_env(self, squashed: torch.Tensor) -> torch.Tensor:
        return self.action_center + self.action_scale * squashed

    def to_squashed(self, action: torch.Tensor) -> torch.Tensor:
        return ((action.to(self.action_scale.device) - self.action_center) / self.action_scale).clamp(-1, 1)

    # ---- the Policy contract ------------------------------------------------------------------
    def act(
        self, observation: Observation, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> ActionChunk:
        inputs = self.inputs(observation)
        squashed, log_prob = self.sample(inputs, deterministic, generator)
        actions = self.action_center[: self.arm_dim] + self.action_scale[: self.arm_dim] * squashed
        if self.gripper_critic is not None:  # the command of highest Q, sampled or not (HIL-SERL)
            choice = self.gripper_critic(inputs.to(self.action_scale.device, torch.float32)).argmax(-1)
            actions = torch.cat([actions, self.gripper_commands[choice].unsqueeze(-1)], dim=-1)
        return ActionChunk(actions=actions.unsqueeze(1), log_prob=log_prob, value=torch.zeros_like(log_prob))

    def refuse_without_likelihood(self, what: str) -> None:
        if self.discrete_gripper:
            raise ConfigError(
                f"{what} needs a policy whose every action dimension has a likelihood; with policy.gripper_commands "
                "the gripper acts by its Q-values, which only algo=sac_rlpd trains"
            )

    def recompute(self, observation: Observation, chunk: ActionChunk) -> Recomputed:
        self.refuse_without_likelihood("an on-policy algorithm")
        log_prob = self.log_prob(self.inputs(observation), self.to_squashed(chunk.actions[:, 0]))
        return Recomputed(log_prob=log_prob, entropy=-log_prob, value=torch.zeros_like(log_prob))

    def value(self, observation: Observation) -> torch.Tensor:
        """No state value here: SAC's targets come from the critics and the stored next state."""
        return torch.zeros(observation.state.shape[0], device=self.action_scale.device)

    def bc_loss(self, observation: Observation, actions: torch.Tensor) -> torch.Tensor:
        self.refuse_without_likelihood("behaviour cloning")
        return -self.log_prob(self.inputs(observation), self.to_squashed(actions.reshape(actions.shape[0], -1))).mean()


def check_gripper_commands(commands: list[float], low: float, high: float, action_dim: int) -> None:
    if action_dim < 2 or len(commands) < 2 or len(set(commands)) != len(commands):
        raise ConfigError(
            "policy.gripper_commands lists at least two different env commands for the last action dimension of an "
            f"env with an arm besides it; got {commands} for {action_dim} action dimensions"
        )
    outside = [c for c in commands if not low <= c <= high]
    if outside:
        raise ConfigError(f"policy.gripper_commands {outside} lie outside the gripper's bounds [{low}, {high}]")


@POLICIES.register("squashed_gaussian", SquashedGaussianConfig)
def make_squashed_gaussian(cfg: SquashedGaussianConfig, spec: EnvSpec) -> Policy:
    return SquashedGaussianPolicy(cfg, spec)
