"""SmolVLA's network, written from its equations on this project's blocks: lerobot's
flow-matching VLA on SmolVLM (a SigLIP-style vision encoder, a pixel-shuffle connector and the
first layers of a Llama-style language model), with a narrower Llama action expert.

    prefix = [each camera: connector(pixel_shuffle(vision(image))) x sqrt(width),
              the instruction's token embeddings x sqrt(width), state_proj(state)]
    suffix = [for each of the H actions: MLP([action_in_proj(x_t), time(t)])]

The prefix's image and instruction tokens see each other; the state token sees them and itself.
The VLM runs over the prefix once per observation and keeps each layer's (rotated) keys and
values. The expert runs over the suffix at every denoising step, its action tokens seeing
each other causally. Every `self_attn_every` layers the expert attends jointly to the cached
prefix and to its own tokens (positions continuing the prefix's); in the layers between, it
cross-attends to the prefix alone, through its own key and value projections of the VLM's
cached (rotated) keys and values, its queries at positions counted from 0. The velocity is
action_out_proj of the action tokens' outputs; t runs from 1 (noise) to 0 (actions).

Llama layer: h = rms(x) w (no offset, unlike Gemma), grouped-query attention with rotary
positions (base 10000), x += o(attn); x += down(silu(gate(h')) up(h')), h' = rms(x) w'.

Parameter names follow lerobot's SmolVLA checkpoints up to a rename of prefixes (RENAMES)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from embodied.core.errors import ConfigError
from embodied.policies.pretrained.gemma import (
    SiglipSize,
    SiglipVision,
    attend,
    attention_bias,
    rotary,
    rotate,
    split_heads,
)
from embodied.policies.pretrained.pretrained_flow import assign_weights, euler_sample, time_features


@dataclass(frozen=True)
class LlamaSize:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float = 1e-5


@dataclass(frozen=True)
class SmolVLMSize:
    vision: SiglipSize
    image_size: int
    scale_factor: int  # the connector's pixel shuffle: scale_factor^2 patches per token
    text: LlamaSize
    vocab_size: int


# A SmolVLM small enough for tests; real sizes come from the VLM's own config.json.
TINY_SMOLVLM = SmolVLMSize(
    vision=SiglipSize(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8),
    image_size=32,
    scale_factor=2,
    text=LlamaSize(width=64, depth=4, mlp_dim=128, num_heads=4, num_kv_heads=2, head_dim=16),
    vocab_size=300,
)

# lerobot's SmolVLA checkpoint names -> this module's
RENAMES = (
    ("model.vlm_with_expert.vlm.model.vision_model.", "vision."),
    ("model.vlm_with_expert.vlm.model.connector.modality_projection.proj.", "connector."),
    ("model.vlm_with_expert.vlm.model.text_model.embed_tokens.", "embed_tokens."),
    ("model.vlm_with_expert.vlm.model.text_model.layers.", "text_layers."),
    ("model.vlm_with_expert.vlm.model.text_model.norm.", "text_norm."),
    ("model.vlm_with_expert.lm_expert.layers.", "expert_layers."),
    ("model.vlm_with_expert.lm_expert.norm.", "expert_norm."),
    ("model.", ""),
)
LM_HEAD = "model.vlm_with_expert.vlm.lm_head.weight"  # SmolVLA predicts actions, never tokens


def read_smolvlm_size(folder: str) -> SmolVLMSize:
    """The sizes a SmolVLM's config.json gives (transformers' defaults where it is silent)."""
    file = Path(folder) / "config.json"
    if not file.is_file():
        raise ConfigError(f"policy.vlm: no {file} (a SmolVLM's config.json, e.g. SmolVLM2-500M-Video-Instruct's)")
    try:
        saved = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{file} is not valid JSON: {error}") from None
    vision, text = saved.get("vision_config", {}), saved.get("text_config", {})
    width, heads = text.get("hidden_size", 4096), text.get("num_attention_heads", 32)
    return SmolVLMSize(
        vision=SiglipSize(
            width=vision.get("hidden_size", 1152),
            depth=vision.get("num_hidden_layers", 12),
            mlp_dim=vision.get("intermediate_size", 3072),
            num_heads=vision.get("num_attention_heads", 16),
            patch_size=vision.get("patch_size", 32),
        ),
        image_size=vision.get("image_size", 224),
        scale_factor=saved.get("scale_factor", 2),
        text=LlamaSize(
            width=width,
            depth=text.get("num_hidden_layers", 32),
            mlp_dim=text.get("intermediate_size", 11008),
            num_heads=heads,
            num_kv_heads=text.get("num_key_value_heads", heads),
            head_dim=text.get("head_dim") or width // heads,
            rms_eps=text.get("rms_norm_eps", 1e-5),
        ),
        vocab_size=text.get("vocab_size", 32000),
    )


def expert_size(text: LlamaSize, width_multiplier: float) -> LlamaSize:
    """lerobot's action expert: the VLM's text config at a fraction of its width, its MLP
    width from Llama's rule (2/3 x 4 x width, rounded up to a multiple of 256), the VLM's heads."""
    width = int(text.width * width_multiplier)
    mlp_dim = 256 * ((4 * int(2 * width / 3) + 255) // 256)
    return LlamaSize(width, text.depth, mlp_dim, text.num_heads, text.num_kv_heads, text.head_dim, text.rms_eps)


class LlamaRMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)).to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, size: LlamaSize, kv_input: int | None = None):
        super().__init__()
        kv_input = kv_input or size.width  # a cross-attending expert layer projects the VLM's keys
        self.q_proj = nn.Linear(size.width, size.num_heads * size.head_dim, bias=False)
        self.k_proj = nn.Linear(kv_input, size.num_kv_heads * size.head_dim, bias=False)
        self.v_proj = nn.Linear(kv_input, size.num_kv_heads * size.head_dim, bias=False)
        self.o_proj = nn.Linear(size.num_heads * size.head_dim, size.width, bias=False)


class LlamaMLP(nn.Module):
    def __init__(self, size: LlamaSize):
        super().__init__()
        self.gate_proj = nn.Linear(size.width, size.mlp_dim, bias=False)
        self.up_proj = nn.Linear(size.width, size.mlp_dim, bias=False)
        self.down_proj = nn.Linear(size.mlp_dim, size.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, size: LlamaSize, kv_input: int | None = None):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(size.width, size.rms_eps)
        self.self_attn = LlamaAttention(size, kv_input)
        self.post_attention_layernorm = LlamaRMSNorm(size.width, size.rms_eps)
        self.mlp = LlamaMLP(size)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual after attention, then the MLP's."""
        x = x + self.self_attn.o_proj(attended)
        return x + self.mlp(self.post_attention_layernorm(x))


class SmolVLMVision(SiglipVision):
    """SigLIP with SmolVLM's patch positions: the patch grid's fractional coordinates,
    shrunk by 1e-6, bucketed into the position table's grid. For a full image at the table's
    size that gives each row (and column) 0, 0, 1, ..., n - 2, not 0 ... n - 1: the first two
    share a position and the last is never used. transformers computes it so, and lerobot's
    SmolVLA with it, so a checkpoint was trained so."""

    def __init__(self, size: SiglipSize, image_size: int):
        super().__init__(size, image_size)
        self.side = image_size // size.patch_size
        self.set_positions()

    def set_positions(self) -> None:
        """The patch positions, a buffer not in checkpoints (computed again after a model built
        on the meta device is loaded)."""
        side = self.side
        fractions = torch.arange(side, dtype=torch.float32, device="cpu") / side * (1 - 1e-6)
        buckets = torch.bucketize(fractions, torch.arange(1 / side, 1.0, 1 / side, device="cpu"), right=True)
        positions = (buckets[:, None] * side + buckets[None]).flatten()
        device = self.embeddings.position_embedding.weight.device
        self.register_buffer("positions", positions.to("cpu" if device.type == "meta" else device), persistent=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        embeddings = self.embeddings
        x = embeddings.patch_embedding(pixels).flatten(2).transpose(1, 2)
        x = x + embeddings.position_embedding(self.positions)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


def pixel_shuffle(x: torch.Tensor, factor: int) -> torch.Tensor:
    """(B, S*S, C) patch tokens -> (B, S*S / factor^2, C * factor^2): each factor x factor
    block of patches becomes one token, as SmolVLM's connector folds them."""
    batch, count, width = x.shape
    side = int(math.isqrt(count))
    x = x.view(batch, side, side // factor, width * factor).permute(0, 2, 1, 3)
    x = x.reshape(batch, side // factor, side // factor, width * factor * factor).permute(0, 2, 1, 3)
    return x.reshape(batch, count // factor**2, width * factor * factor)


def prefix_lm_mask(valid: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """(B, N, N): token i sees token j where j is valid, i is valid, and j's block (the count
    of block starts up to it, `blocks` (B, N) marking starts) is not after i's."""
    order = blocks.long().cumsum(1)
    return (order[:, None, :] <= order[:, :, None]) & valid[:, None, :] & valid[:, :, None]


class SmolVLAModel(nn.Module):
    def __init__(
        self,
        vlm: SmolVLMSize,
        num_vlm_layers: int,
        expert_width_multiplier: float,
        self_attn_every: int,
        max_state_dim: int,
        max_action_dim: int,
    ):
        super().__init__()
        if not 0 < num_vlm_layers <= vlm.text.depth:
            raise ConfigError(f"policy.num_vlm_layers must be in [1, {vlm.text.depth}], got {num_vlm_layers}")
        if self_attn_every < 1:
            raise ConfigError(f"policy.self_attn_every must be >= 1, got {self_attn_every}")
        text = LlamaSize(**{**vlm.text.__dict__, "depth": num_vlm_layers})
        expert = expert_size(text, expert_width_multiplier)
        self.text_size, self.expert_size, self.self_attn_every = text, expert, self_attn_every
        self.scale_factor = vlm.scale_factor
        self.vision = SmolVLMVision(vlm.vision, vlm.image_size)
        self.connector = nn.Linear(vlm.vision.width * vlm.scale_factor**2, text.width, bias=False)
        self.embed_tokens = nn.Embedding(vlm.vocab_size, text.width)
        self.text_layers = nn.ModuleList(LlamaLayer(text) for _ in range(num_vlm_layers))
        self.text_norm = LlamaRMSNorm(text.width, text.rms_eps)
        kv_width = text.num_kv_heads * text.head_dim
        self.expert_layers = nn.ModuleList(
            LlamaLayer(expert, None if self.joint(i) else kv_width) for i in range(num_vlm_layers)
        )
        self.expert_norm = LlamaRMSNorm(expert.width, expert.rms_eps)
        self.state_proj = nn.Linear(max_state_dim, text.width)
        self.action_in_proj = nn.Linear(max_action_dim, expert.width)
        self.action_out_proj = nn.Linear(expert.width, max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * expert.width, expert.width)
        self.action_time_mlp_out = nn.Linear(expert.width, expert.width)

    def joint(self, layer: int) -> bool:
        """Whether the expert attends to the prefix and itself in this layer (else it
        cross-attends to the prefix alone)."""
        return layer % self.self_attn_every == 0

    # ---- prefix ----------------------------------------------------------------------------
    def embed_prefix(
        self,
        images: list[torch.Tensor],
        image_masks: list[torch.Tensor],
        tokens: torch.Tensor,
        token_mask: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Images (B, 3, S, S) in [-1, 1], whether each is there (B,), instruction tokens and
        mask (B, T), padded state (B, max_state_dim) -> embeddings (B, L, width), which are
        valid (B, L) and where a new attention block starts (B, L): at the state token."""
        scale = math.sqrt(self.text_size.width)
        embeddings, valid = [], []
        for pixels, present in zip(images, image_masks):
            image = self.connector(pixel_shuffle(self.vision(pixels), self.scale_factor)) * scale
            embeddings.append(image)
            valid.append(present[:, None].expand(-1, image.shape[1]))
        embeddings += [self.embed_tokens(tokens) * scale, self.state_proj(state)[:, None]]
        valid += [token_mask.bool(), torch.ones_like(token_mask[:, :1], dtype=torch.bool)]
        valid = torch.cat(valid, 1)
        starts = torch.zeros_like(valid)
        starts[:, -1] = True
        return torch.cat(embeddings, 1), valid, starts

    def encode_prefix(
        self, embeddings: torch.Tensor, valid: torch.Tensor, starts: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The VLM over the prefix: its final-normed outputs and every layer's rotated keys
        and values (B, kv_heads, L, head_dim)."""
        cos, sin = rotary(valid.long().cumsum(1) - 1, self.text_size.head_dim)
        bias = attention_bias(prefix_lm_mask(valid, starts), embeddings.dtype)
        x, cache = embeddings, []
        for layer in self.text_layers:
            h = layer.input_layernorm(x)
            attention = layer.self_attn
            q, k, v = (
                split_heads(p(h), self.text_size.head_dim)
                for p in (attention.q_proj, attention.k_proj, attention.v_proj)
            )
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            cache.append((k, v))
            x = layer.finish(x, attend(q, k, v, bias))
        return self.text_norm(x), cache

    # ---- suffix ----------------------------------------------------------------------------
    def embed_suffix(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        actions = self.action_in_proj(x)
        times = time_features(t, actions.shape[-1])[:, None].expand_as(actions)
        return self.action_time_mlp_out(F.silu(self.action_time_mlp_in(torch.cat([actions, times], -1))))

    def run_suffix(
        self, suffix: torch.Tensor, prefix_valid: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """The expert over the action tokens (B, H, expert width) -> its final-normed outputs."""
        batch, length = suffix.shape[:2]
        head_dim = self.text_size.head_dim
        causal = torch.ones(length, length, dtype=torch.bool, device=suffix.device).tril()
        seen_prefix = prefix_valid[:, None, :].expand(-1, length, -1)
        joint_bias = attention_bias(torch.cat([seen_prefix, causal.expand(batch, -1, -1)], 2), suffix.dtype)
        cross_bias = attention_bias(seen_prefix, suffix.dtype)
        steps = torch.arange(length, device=suffix.device)[None].expand(batch, -1)
        joint_rotary = rotary(prefix_valid.long().sum(1, keepdim=True) + steps, head_dim)
        cross_rotary = rotary(steps, head_dim)
        x = suffix
        for index, layer in enumerate(self.expert_layers):
            attention = layer.self_attn
            h = layer.input_layernorm(x)
            q = split_heads(attention.q_proj(h), head_dim)
            prefix_k, prefix_v = cache[index]
            if self.joint(index):
                k, v = split_heads(attention.k_proj(h), head_dim), split_heads(attention.v_proj(h), head_dim)
                q, k = rotate(q, *joint_rotary), rotate(k, *joint_rotary)
                attended = attend(q, torch.cat([prefix_k, k], 2), torch.cat([prefix_v, v], 2), joint_bias)
            else:
                k = split_heads(attention.k_proj(prefix_k.transpose(1, 2).flatten(2)), head_dim)
                v = split_heads(attention.v_proj(prefix_v.transpose(1, 2).flatten(2)), head_dim)
                attended = attend(rotate(q, *cross_rotary), k, v, cross_bias)
            x = layer.finish(x, attended)
        return self.expert_norm(x)

    def velocity(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        prefix_valid: torch.Tensor,
        cache: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The velocity (B, H, max_action_dim) of noisy chunks x at times t, and the action
        tokens' outputs (B, H, expert width)."""
        out = self.run_suffix(self.embed_suffix(x, t), prefix_valid, cache)
        return self.action_out_proj(out), out

    @torch.no_grad()
    def sample(
        self,
        images: list[torch.Tensor],
        image_masks: list[torch.Tensor],
        tokens: torch.Tensor,
        token_mask: torch.Tensor,
        state: torch.Tensor,
        noise: torch.Tensor,
        steps: int,
    ) -> torch.Tensor:
        """The ODE from `noise` at t = 1 to actions at t = 0 in `steps` Euler steps:
        SmolVLA's own inference, for checking a loaded checkpoint."""
        embeddings, valid, starts = self.embed_prefix(images, image_masks, tokens, token_mask, state)
        _, cache = self.encode_prefix(embeddings, valid, starts)
        return euler_sample(lambda x, t: self.velocity(x, t, valid, cache)[0], noise, steps)


def load_smolvla_checkpoint(model: SmolVLAModel, path: str) -> None:
    """Load a SmolVLA checkpoint's weights into `model` (which may be on the meta device),
    refusing any mismatch by name: every parameter at its shape, nothing left over but the
    language head."""
    from safetensors.torch import load_file

    file = Path(path) / "model.safetensors" if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise ConfigError(f"policy.pretrained: no {file}")
    renamed = {}
    for key, tensor in load_file(str(file)).items():
        if key == LM_HEAD:
            continue
        for old, new in RENAMES:
            if key.startswith(old):
                key = new + key[len(old) :]
                break
        renamed[key] = tensor.float() if tensor.is_floating_point() else tensor
    assign_weights(model, renamed, file, "policy=smolvla with policy.vlm and its layer counts as given")
    model.vision.set_positions()


def resize_with_pad(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 frames (B, H, W, 3) -> (B, 3, size, size) in [-1, 1], as SmolVLA prepares them:
    resized keeping the aspect ratio (bilinear), padded with black on the left and top."""
    pixels = images.permute(0, 3, 1, 2).float() / 255.0
    height, width = pixels.shape[-2:]
    ratio = max(width / size, height / size)
    new_height, new_width = int(height / ratio), int(width / ratio)
    pixels = F.interpolate(pixels, size=(new_height, new_width), mode="bilinear", align_corners=False)
    pixels = F.pad(pixels, (max(0, size - new_width), 0, max(0, size - new_height), 0), value=0.0)
    return pixels * 2.0 - 1.0
