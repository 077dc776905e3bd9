"""The transformer blocks pi0 is made of, written from their equations: Gemma decoder layers
(the VLM and the action expert) and the SigLIP vision encoder.

Gemma layer, for tokens x at positions p attending to keys K and values V:
    h = rms(x) (1 + w)                       rms(x) = x / sqrt(mean(x^2) + eps), in float32
    q, k, v = h Wq, h Wk, h Wv               k, v: num_kv_heads heads shared by the query heads
    q, k = rope(q, p), rope(k, p)            rotary positions, base 10000, halves rotated
    x = x + softmax(q K^T / sqrt(d) + mask) V  Wo     K, V: cached keys/values, then this k, v
    x = x + W_down(gelu_tanh(h' W_gate) * h' W_up)    h' = rms(x) (1 + w')

pi0.5's action expert conditions its norms on the denoising time instead (adaptive RMSNorm):
(scale, shift, gate) = W c + b for a condition c, h = rms(x) (1 + scale) + shift, and each
residual branch is multiplied by its norm's gate before it is added.

Parameter names follow the layout of pi0 checkpoints (q_proj, input_layernorm, mlp.gate_proj,
...), so loading one is a rename of prefixes (policies/pretrained/pi0.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

ROPE_BASE = 10000.0
RMS_EPS = 1e-6
LAYER_NORM_EPS = 1e-6


@dataclass(frozen=True)
class GemmaSize:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class SiglipSize:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch_size: int


class RMSNorm(nn.Module):
    """Gemma's RMSNorm, scaled by (1 + weight); or, with `cond_dim`, the adaptive one whose
    scale, shift and residual gate come from a condition (B, cond_dim)."""

    def __init__(self, width: int, cond_dim: int | None = None):
        super().__init__()
        if cond_dim:
            self.dense = nn.Linear(cond_dim, 3 * width)
        else:
            self.weight = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The normed x and the gate for the residual branch it feeds (None: not gated)."""
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        if not hasattr(self, "dense"):
            return (normed * (1.0 + self.weight.float())).to(x.dtype), None
        scale, shift, gate = self.dense(cond)[:, None].chunk(3, -1)
        return (normed * (1.0 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


def gated(residual: torch.Tensor, branch: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return residual + (branch if gate is None else branch * gate)


class GemmaAttention(nn.Module):
    def __init__(self, size: GemmaSize):
        super().__init__()
        self.size = size
        self.q_proj = nn.Linear(size.width, size.num_heads * size.head_dim, bias=False)
        self.k_proj = nn.Linear(size.width, size.num_kv_heads * size.head_dim, bias=False)
        self.v_proj = nn.Linear(size.width, size.num_kv_heads * size.head_dim, bias=False)
        self.o_proj = nn.Linear(size.num_heads * size.head_dim, size.width, bias=False)


class GemmaMLP(nn.Module):
    def __init__(self, size: GemmaSize):
        super().__init__()
        self.gate_proj = nn.Linear(size.width, size.mlp_dim, bias=False)
        self.up_proj = nn.Linear(size.width, size.mlp_dim, bias=False)
        self.down_proj = nn.Linear(size.mlp_dim, size.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaLayer(nn.Module):
    def __init__(self, size: GemmaSize, cond_dim: int | None):
        super().__init__()
        self.input_layernorm = RMSNorm(size.width, cond_dim)
        self.self_attn = GemmaAttention(size)
        self.post_attention_layernorm = RMSNorm(size.width, cond_dim)
        self.mlp = GemmaMLP(size)


class GemmaStack(nn.Module):
    """Gemma decoder layers and the final norm, run over input embeddings (the token
    embedding, where there is one, is the caller's: pi0 scales it itself). `adaptive`: every
    norm is conditioned (on a vector of the stack's width)."""

    def __init__(self, size: GemmaSize, vocab_size: int = 0, adaptive: bool = False):
        super().__init__()
        self.size = size
        if vocab_size:
            self.embed_tokens = nn.Embedding(vocab_size, size.width)
        cond_dim = size.width if adaptive else None
        self.layers = nn.ModuleList(GemmaLayer(size, cond_dim) for _ in range(size.depth))
        self.norm = RMSNorm(size.width, cond_dim)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        cond: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """x (B, N, width) at `positions` (B, N); `mask` (B, N, M + N) says which of the M cached
        and N own keys each token sees; `cond` (B, width) for an adaptive stack. Returns the
        final-normed outputs and each layer's own (rotated) keys and values,
        (B, kv_heads, N, head_dim), for later tokens to attend to."""
        cos, sin = rotary(positions, self.size.head_dim)
        bias = attention_bias(mask, x.dtype)
        own = []
        for index, layer in enumerate(self.layers):
            attention = layer.self_attn
            h, gate = layer.input_layernorm(x, cond)
            q, k, v = (
                split_heads(projection(h), self.size.head_dim)
                for projection in (attention.q_proj, attention.k_proj, attention.v_proj)
            )
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            own.append((k, v))
            if past is not None:
                k = torch.cat([past[index][0], k], 2)
                v = torch.cat([past[index][1], v], 2)
            x = gated(x, attention.o_proj(attend(q, k, v, bias)), gate)
            h, gate = layer.post_attention_layernorm(x, cond)
            x = gated(x, layer.mlp(h), gate)
        return self.norm(x, cond)[0], own


def split_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, N, heads x head_dim) -> (B, heads, N, head_dim)."""
    return x.view(*x.shape[:2], -1, head_dim).transpose(1, 2)


def rotary(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (B, 1, N, head_dim) of rotary embeddings at integer `positions` (B, N)."""
    inverse = 1.0 / ROPE_BASE ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.float()[..., None] * inverse
    angles = torch.cat([angles, angles], -1)[:, None]
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, -1)
    return (x * cos + torch.cat([-second, first], -1) * sin).to(x.dtype)


def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, N, M) booleans -> an additive bias (B, 1, N, M): 0 where seen, the dtype's lowest
    finite value elsewhere (finite, so a padding row of all-unseen keys stays a number)."""
    return torch.where(mask[:, None], 0.0, torch.finfo(dtype).min).to(dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention: q (B, H, N, d) over k, v (B, kv, M, d) -> (B, N, H x d)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    out = torch.softmax(scores.float(), -1).to(q.dtype) @ v
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


# ---- SigLIP ---------------------------------------------------------------------------------


class SiglipAttention(nn.Module):
    def __init__(self, size: SiglipSize):
        super().__init__()
        self.heads = size.num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(size.width, size.width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head_dim = x.shape[-1] // self.heads
        q, k, v = (split_heads(projection(x), head_dim) for projection in (self.q_proj, self.k_proj, self.v_proj))
        # every patch sees every patch: torch's fused kernel (SmolVLA's 1024 patches per image)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(x.shape))


class SiglipMLP(nn.Module):
    def __init__(self, size: SiglipSize):
        super().__init__()
        self.fc1 = nn.Linear(size.width, size.mlp_dim)
        self.fc2 = nn.Linear(size.mlp_dim, size.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SiglipLayer(nn.Module):
    def __init__(self, size: SiglipSize):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(size.width, eps=LAYER_NORM_EPS)
        self.self_attn = SiglipAttention(size)
        self.layer_norm2 = nn.LayerNorm(size.width, eps=LAYER_NORM_EPS)
        self.mlp = SiglipMLP(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEmbeddings(nn.Module):
    def __init__(self, size: SiglipSize, image_size: int):
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, size.width, size.patch_size, stride=size.patch_size)
        self.position_embedding = nn.Embedding((image_size // size.patch_size) ** 2, size.width)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels).flatten(2).transpose(1, 2)
        return patches + self.position_embedding.weight


class SiglipEncoder(nn.Module):
    def __init__(self, size: SiglipSize):
        super().__init__()
        self.layers = nn.ModuleList(SiglipLayer(size) for _ in range(size.depth))


class SiglipVision(nn.Module):
    """Pixels (B, 3, S, S) in [-1, 1] -> patch tokens (B, (S / patch)^2, width), without a
    pooling head (PaliGemma reads every patch)."""

    def __init__(self, size: SiglipSize, image_size: int):
        super().__init__()
        self.image_size = image_size
        self.embeddings = SiglipEmbeddings(size, image_size)
        self.encoder = SiglipEncoder(size)
        self.post_layernorm = nn.LayerNorm(size.width, eps=LAYER_NORM_EPS)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)
