"""The transformers backbones VLA policies run on: a causal LM or a vision-language model
with the instruction tokenizer that goes with it, and the prefix they read.

    prefix = [each camera's image tokens, the instruction's tokens, one state embedding]"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from embodied.core.errors import ConfigError
from embodied.core.types import Observation
from embodied.policies.vla.action_tokens import NUM_BINS
from embodied.policies.vla.vlm import (
    DEFAULT_MEAN,
    DEFAULT_STD,
    ImageTokens,
    image_normalization,
    is_vision_language,
    tiny_paligemma,
)


def left_padded(rows: list[list[int]], length: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows cut to `length` and left-padded, so state and action positions line up."""
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for row, tokens in enumerate(rows):
        tokens = tokens[:length]
        if tokens:
            ids[row, length - len(tokens) :] = torch.tensor(tokens)
            mask[row, length - len(tokens) :] = 1
    return ids, mask


class ByteTokenizer:
    """Instruction text as UTF-8 bytes (ids 1..256; 0 pads), for the built-in tiny backbone."""

    def __call__(self, texts: list[str], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return left_padded([[b + 1 for b in text.encode("utf-8")] for text in texts], length, pad=0)


class PretrainedTokenizer:
    """The backbone's own tokenizer, for backbones loaded from a path or hub."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def __call__(self, texts: list[str], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        for text, row in zip(texts, rows):
            if text.strip() and not row:  # e.g. a tokenizer class that does not match its files
                raise ConfigError(f"the backbone's tokenizer turned the instruction {text!r} into no tokens")
        return left_padded(rows, length, pad=self.pad)


TINY_BACKBONES = ("tiny", "tiny_vlm")  # built with random weights; any other name is loaded pretrained


def build_backbone(cfg: Any) -> tuple[nn.Module, Any]:
    """The causal LM or vision-language model and the instruction tokenizer that goes with it,
    from a policy config's `backbone` (and, for the tiny ones, `vocab_size`, `hidden_size`,
    `num_layers`, `num_heads`, `image_size`, `patch_size`)."""
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoTokenizer,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    if cfg.backbone not in TINY_BACKBONES:
        try:
            vision = hasattr(AutoConfig.from_pretrained(cfg.backbone), "vision_config")
            model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_pretrained(cfg.backbone)
            tokenizer = AutoTokenizer.from_pretrained(cfg.backbone)
        except (OSError, ValueError) as error:
            raise ConfigError(f"policy.backbone '{cfg.backbone}' could not be loaded: {error}") from None
        vocab_size = model.config.get_text_config().vocab_size
        if vocab_size <= NUM_BINS:
            raise ConfigError(f"{cfg.backbone} has a vocabulary of {vocab_size}, too small for actions")
        return model, PretrainedTokenizer(tokenizer)
    if cfg.vocab_size < NUM_BINS + 258:
        raise ConfigError(
            f"policy.vocab_size must hold 258 byte and image ids and {NUM_BINS} action ids, got {cfg.vocab_size}"
        )
    if cfg.backbone == "tiny_vlm":  # id 257, after the bytes, is its (unused) image placeholder token
        return tiny_paligemma(
            cfg.vocab_size,
            cfg.hidden_size,
            cfg.num_layers,
            cfg.num_heads,
            cfg.image_size,
            cfg.patch_size,
            image_token_index=257,
        ), ByteTokenizer()
    config = Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=2 * cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config), ByteTokenizer()


def vision_prefix(backbone: nn.Module, name: str, cameras: list[str]) -> ImageTokens | None:
    """What turns each camera's frames into `backbone`'s image tokens (None without cameras);
    a backbone that reads no images is refused for an env with cameras."""
    if not cameras:
        return None
    if not is_vision_language(backbone):
        raise ConfigError(
            f"the env has cameras ({', '.join(cameras)}) and policy.backbone '{name}' reads no images: "
            f"use policy.backbone=tiny_vlm or a vision-language checkpoint (PaliGemma, SmolVLM), or "
            f"state observations"
        )
    mean, std = (DEFAULT_MEAN, DEFAULT_STD) if name == "tiny_vlm" else image_normalization(name)
    return ImageTokens(backbone, mean, std)


def prefix_embeddings(
    observation: Observation,
    token_embeddings: nn.Module,
    tokenizer: Any,
    max_tokens: int,
    image_tokens: ImageTokens | None,
    cameras: list[str],
    state_embedding: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefix's input embeddings (B, L, hidden) and attention mask (B, L); instruction
    tokens are left-padded, so the state is always the last position."""
    device = state_embedding.device
    texts = observation.instruction or [""] * observation.state.shape[0]
    ids, mask = tokenizer(texts, max_tokens)
    images = [image_tokens(observation.images[name]) for name in cameras] if image_tokens is not None else []
    embeddings = torch.cat([*images, token_embeddings(ids.to(device)), state_embedding[:, None]], 1)
    seen = torch.ones(len(ids), sum(tokens.shape[1] for tokens in images), dtype=torch.long)
    return embeddings, torch.cat([seen, mask, torch.ones(len(ids), 1, dtype=torch.long)], 1).to(device)
