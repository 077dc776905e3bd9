"""The built-in VLA: a flow-matching action expert conditioned on camera images, the
instruction and the robot state, with real pretrained encoders that install offline
(`embodied.policies.encoders`: EfficientNet-Lite0 for images, all-MiniLM-L6-v2 for language).

    context = [normalised state, LayerNorm(W_img f_img) per camera, LayerNorm(W_txt f_txt)]
    flow / noise head / critic: as `policy=flow`, conditioned on the context

The encoders are frozen feature extractors. Their outputs for each sample are stored in the
chunk's sampling record at act time, so PPO's epochs over a batch re-run only the trainable
part; the critic reads the context detached by default (`detach_value_input`), so value
errors do not move the projections the action expert relies on."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from embodied.core.errors import ConfigError
from embodied.core.policy import Recomputed
from embodied.core.registry import POLICIES
from embodied.core.types import ActionChunk, ChunkPrefix, EnvSpec, Observation
from embodied.policies.denoising.flow import FlowPolicy, FlowPolicyConfig
from embodied.policies.encoders import EfficientNetLite0, SentenceEncoder


@dataclass
class FlowVLAConfig(FlowPolicyConfig):
    name: str = "flow_vla"
    feature_dim: int = 64  # each camera's and the instruction's projection
    detach_value_input: bool = True  # the critic reads the context without moving it


class FlowVLA(FlowPolicy):
    accepts_images = True

    def __init__(self, cfg: FlowVLAConfig, spec: EnvSpec):
        if not spec.image_shapes:
            raise ConfigError("policy=flow_vla reads camera images; use an env with cameras (e.g. env.obs_mode=rgb)")
        self.cameras = sorted(spec.image_shapes)
        context_dim = spec.state_dim + (len(self.cameras) + 1) * cfg.feature_dim
        super().__init__(cfg, spec, context_dim=context_dim)
        self.image_encoder = EfficientNetLite0.pretrained()
        # Not a submodule: its 22M frozen weights come from its package, not from our
        # checkpoints, and it runs on the CPU (each instruction is encoded once).
        object.__setattr__(self, "text_encoder", SentenceEncoder())
        self.image_projection = nn.ModuleDict(
            {
                name: nn.Sequential(
                    nn.Linear(EfficientNetLite0.feature_dim, cfg.feature_dim), nn.LayerNorm(cfg.feature_dim)
                )
                for name in self.cameras
            }
        )
        self.text_projection = nn.Sequential(
            nn.Linear(SentenceEncoder.feature_dim, cfg.feature_dim), nn.LayerNorm(cfg.feature_dim)
        )

    def train(self, mode: bool = True) -> "FlowVLA":
        super().train(mode)
        self.image_encoder.eval()  # frozen: batch statistics never replace the pretrained ones
        return self

    @torch.no_grad()
    def _features(self, observation: Observation) -> torch.Tensor:
        """The frozen encoders' outputs (B, cameras x 1280 + 384)."""
        device = self.low.device
        if len(observation.instruction) != observation.batch_size:
            raise ConfigError("policy=flow_vla needs one instruction per observation")
        images = [self.image_encoder.features(observation.images[name].to(device)) for name in self.cameras]
        return torch.cat([*images, self.text_encoder(list(observation.instruction)).to(device)], -1)

    def _context(self, observation: Observation, features: torch.Tensor) -> torch.Tensor:
        sizes = [EfficientNetLite0.feature_dim] * len(self.cameras) + [SentenceEncoder.feature_dim]
        parts = features.to(self.low.device).split(sizes, -1)
        projected = [self.image_projection[name](part) for name, part in zip(self.cameras, parts)]
        return torch.cat([super()._state(observation), *projected, self.text_projection(parts[-1])], -1)

    def _state(self, observation: Observation) -> torch.Tensor:
        return self._context(observation, self._features(observation))

    def act(
        self,
        observation: Observation,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        prefix: ChunkPrefix | None = None,
    ) -> ActionChunk:
        features = self._features(observation)
        chunk = self._act_on(self._context(observation, features), deterministic, generator, prefix)
        chunk.record["features"] = features
        return chunk

    def recompute(self, observation: Observation, chunk: ActionChunk) -> Recomputed:
        features = chunk.record.get("features")
        if features is None:
            return super().recompute(observation, chunk)
        return self._recompute_on(self._context(observation, features), chunk)

    def frozen_features(self, observation: Observation) -> torch.Tensor:
        return self._features(observation)

    def bc_loss(
        self, observation: Observation, actions: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`features`: the frozen encoders' outputs for `observation`, where the caller keeps
        them (SFT computes them once per frame instead of once per step)."""
        features = self._features(observation) if features is None else features
        return self._flow_matching_loss(self._context(observation, features), actions)

    def _value_input(self, state: torch.Tensor) -> torch.Tensor:
        return state.detach() if self.cfg.detach_value_input else state


@POLICIES.register("flow_vla", FlowVLAConfig)
def make_flow_vla(cfg: FlowVLAConfig, spec: EnvSpec) -> FlowVLA:
    return FlowVLA(cfg, spec)
