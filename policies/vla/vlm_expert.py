"""A pi0-style flow VLA on a vision-language backbone: the VLM reads the prefix (each
camera's image tokens, the instruction, one state embedding) once per observation, and an
action expert, a small transformer of its own, predicts the velocity of a chunk of H actions
at every denoising step, its H action tokens attending to the VLM's last hidden states
(cross-attention, so the prefix is computed once for all K steps, as pi0 reuses its KV cache).

Everything else is `policy=flow`: the samplers (Flow-SDE, Flow-Noise, ODE), the recorded
chain and its log-likelihood, per-step terms, the flow-matching SFT loss. Flow-Noise's noise
head reads the expert's action tokens.

The value head (`value_from`):
    prefix   the VLM's hidden state at the state embedding (the prefix's last position)
    expert   the action expert's mean output token for a fixed query (zero actions at t = 1),
             so the value shares the expert's layers
and `detach_value_input` stops the value loss at that input, so it does not move the layers
the actions rely on.

`backbone`: `tiny_vlm` (a small random PaliGemma, runs anywhere) or a local path or hub id of
a vision-language model (PaliGemma, SmolVLM); `freeze_backbone` trains the expert, the
projections and the heads only."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from embodied.core.errors import ConfigError
from embodied.core.registry import POLICIES
from embodied.core.types import EnvSpec, Observation
from embodied.policies.denoising.common import time_embedding
from embodied.policies.denoising.flow import FlowPolicy, FlowPolicyConfig
from embodied.policies.gaussian.mlp import mlp
from embodied.policies.vla.backbones import TINY_BACKBONES, build_backbone, prefix_embeddings, vision_prefix

VALUE_FROM = ("prefix", "expert")


@dataclass
class VLMExpertConfig(FlowPolicyConfig):
    name: str = "vlm_expert"
    backbone: str = "tiny_vlm"  # tiny_vlm | a vision-language model's local path or hub id
    hidden_size: int = 64  # tiny_vlm only
    num_layers: int = 2
    num_heads: int = 4
    vocab_size: int = 1024
    image_size: int = 32
    patch_size: int = 8
    max_instruction_tokens: int = 48
    freeze_backbone: bool = False  # true: train the action expert, projections and heads only
    expert_width: int = 64
    expert_layers: int = 2
    expert_heads: int = 4
    value_from: str = "prefix"  # prefix | expert
    detach_value_input: bool = True  # the value loss does not move what the actions rely on


class ActionExpert(nn.Module):
    """H action tokens ([x_t of one action, time features]) through transformer layers that
    cross-attend to the projected prefix; outputs per token: velocity and noise logits."""

    def __init__(
        self, prefix_dim: int, action_dim: int, horizon: int, time_features: int, width: int, layers: int, heads: int
    ):
        super().__init__()
        self.horizon, self.action_dim = horizon, action_dim
        self.memory = nn.Linear(prefix_dim, width)
        self.action_in = nn.Linear(action_dim + time_features, width)
        self.position = nn.Parameter(torch.zeros(horizon, width))
        layer = nn.TransformerDecoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.decoder = nn.TransformerDecoder(layer, layers)
        self.velocity = nn.Linear(width, action_dim)
        self.noise = nn.Linear(width, action_dim)
        for head in (self.velocity, self.noise):  # start near zero, as the MLP heads do
            nn.init.normal_(head.weight, std=0.01)
            nn.init.zeros_(head.bias)

    def forward(
        self, prefix: torch.Tensor, padding: torch.Tensor, x: torch.Tensor, times: torch.Tensor
    ) -> torch.Tensor:
        """Output tokens (B, H, width) for noisy chunks x (B, H x A) at time features (B, F)."""
        actions = x.view(-1, self.horizon, self.action_dim)
        inputs = torch.cat([actions, times[:, None].expand(-1, self.horizon, -1)], -1)
        return self.decoder(
            self.action_in(inputs) + self.position, self.memory(prefix), memory_key_padding_mask=padding
        )


class VLMExpertPolicy(FlowPolicy):
    accepts_images = True
    steerable = False  # DSRL: no pooled input for its latent actor written yet (see FlowPolicy)

    def __init__(self, cfg: VLMExpertConfig, spec: EnvSpec):
        if cfg.value_from not in VALUE_FROM:
            raise ConfigError(f"policy.value_from must be one of {VALUE_FROM}, got '{cfg.value_from}'")
        backbone, tokenizer = build_backbone(cfg)
        self.prefix_dim = backbone.config.get_text_config().hidden_size
        super().__init__(cfg, spec, context_dim=self.prefix_dim)
        self.backbone, self.instructions = backbone, tokenizer
        self.cameras = sorted(spec.image_shapes)
        self.image_tokens = vision_prefix(backbone, cfg.backbone, self.cameras)
        if self.image_tokens is None:
            raise ConfigError("policy=vlm_expert reads camera images; use an env with cameras (env.obs_mode=rgb)")
        self.state_embedding = nn.Linear(spec.state_dim, self.prefix_dim)
        if cfg.freeze_backbone:
            self.backbone.requires_grad_(False)

    def pretrained_frozen(self) -> tuple[str, list[str]] | None:
        """With `freeze_backbone` on a VLM loaded from a path or hub id, that backbone: a
        checkpoint then holds the action expert, the heads and the statistics."""
        if not self.cfg.freeze_backbone or self.cfg.backbone in TINY_BACKBONES:
            return None  # random tiny weights are saved: nothing could rebuild them
        return self.cfg.backbone, self.frozen_parameter_names()

    def _build_heads(self, context_dim: int) -> None:
        cfg = self.cfg
        self.expert = ActionExpert(
            context_dim,
            self.spec.action_dim,
            cfg.horizon,
            cfg.time_features,
            cfg.expert_width,
            cfg.expert_layers,
            cfg.expert_heads,
        )
        value_dim = context_dim if cfg.value_from == "prefix" else cfg.expert_width
        self.critic = mlp([value_dim, *cfg.critic_hidden, 1], nn.Tanh, out_gain=1.0)

    # The context the flow reads is the prefix's last hidden states with the attention mask
    # as one more channel, (B, L, hidden + 1): one tensor, so every sampler passes it along
    # (and selects rows of it) as it does the state vector of `policy=flow`.
    def _state(self, observation: Observation) -> torch.Tensor:
        state = self.normalizer(observation.state.to(self.low.device, torch.float32))
        embeddings, mask = prefix_embeddings(
            observation,
            self.backbone.get_input_embeddings(),
            self.instructions,
            self.cfg.max_instruction_tokens,
            self.image_tokens,
            self.cameras,
            self.state_embedding(state),
        )
        out = self.backbone(inputs_embeds=embeddings, attention_mask=mask, output_hidden_states=True)
        return torch.cat([out.hidden_states[-1], mask[..., None].to(embeddings.dtype)], -1)

    def _field(
        self, context: torch.Tensor, x: torch.Tensor, t: torch.Tensor, noise: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        tokens = self._expert(context, x, t)
        velocity = self.expert.velocity(tokens).reshape(x.shape)
        return velocity, self.expert.noise(tokens).reshape(x.shape) if noise else None

    def _expert(self, context: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        prefix, mask = context[..., :-1], context[..., -1]
        return self.expert(prefix, mask < 0.5, x, time_embedding(t, self.frequencies))

    def _value(self, context: torch.Tensor) -> torch.Tensor:
        if self.cfg.value_from == "prefix":
            features = context[:, -1, :-1]  # the state embedding's position: it has seen the whole prefix
        else:
            batch = context.shape[0]
            query = torch.zeros(batch, self.dim, device=context.device)
            features = self._expert(context, query, torch.ones(batch, device=context.device)).mean(1)
        return self.critic(features.detach() if self.cfg.detach_value_input else features).squeeze(-1)


@POLICIES.register("vlm_expert", VLMExpertConfig)
def make_vlm_expert(cfg: VLMExpertConfig, spec: EnvSpec) -> VLMExpertPolicy:
    return VLMExpertPolicy(cfg, spec)
