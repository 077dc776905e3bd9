"""Vision-language backbones from transformers (PaliGemma, SmolVLM, ...) as the prefix of a
VLA: camera images become the model's own image tokens (its vision tower and projector,
`get_image_features`), placed in front of the instruction's token embeddings, and the whole
prefix runs through the model as `inputs_embeds`.

`tiny_paligemma` builds a small random PaliGemma (SigLIP vision tower, Gemma language model)
that runs anywhere; real checkpoints load from a local path or the hub on a user's machine."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# SigLIP's and Idefics3's / SmolVLM's image normalisation: pixels scaled to [-1, 1].
DEFAULT_MEAN, DEFAULT_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
PER_IMAGE_AXIS = ("smolvlm", "idefics3")  # these take pixel_values (B, images, C, H, W)


def is_vision_language(model: nn.Module) -> bool:
    return hasattr(model.config, "vision_config") and hasattr(model, "get_image_features")


def tiny_paligemma(
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    image_size: int,
    patch_size: int,
    image_token_index: int,
) -> nn.Module:
    from transformers import GemmaConfig, PaliGemmaConfig, PaliGemmaForConditionalGeneration, SiglipVisionConfig

    vision = SiglipVisionConfig(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        image_size=image_size,
        patch_size=patch_size,
    )
    text = GemmaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads,
    )
    config = PaliGemmaConfig(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        projection_dim=hidden_size,
        image_token_index=image_token_index,
    )
    return PaliGemmaForConditionalGeneration(config)


class ImageTokens(nn.Module):
    """Camera frames uint8 (B, H, W, 3) -> the backbone's image tokens (B, N, hidden): resized
    to the vision tower's input size and normalised as its image processor does."""

    def __init__(self, backbone: nn.Module, mean: Any = DEFAULT_MEAN, std: Any = DEFAULT_STD):
        super().__init__()
        object.__setattr__(self, "backbone", backbone)  # not a submodule: the policy owns it
        size = backbone.config.vision_config.image_size
        self.size = tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))
        self.per_image_axis = backbone.config.model_type in PER_IMAGE_AXIS
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        pixels = images.to(self.mean.device).permute(0, 3, 1, 2).float() / 255.0
        if tuple(pixels.shape[-2:]) != self.size:
            pixels = nn.functional.interpolate(
                pixels, size=self.size, mode="bilinear", antialias=True, align_corners=False
            )
        pixels = (pixels - self.mean) / self.std
        if self.per_image_axis:
            pixels = pixels[:, None]
        features = self.backbone.get_image_features(pixel_values=pixels)
        tokens = getattr(features, "pooler_output", features)
        if isinstance(tokens, (list, tuple)):  # one (N, hidden) per sample
            tokens = torch.stack(list(tokens))
        return tokens.reshape(images.shape[0], -1, tokens.shape[-1])


def image_normalization(path: str) -> tuple[Any, Any]:
    """The image processor's mean and std for a checkpoint at `path` (the defaults without one)."""
    try:
        from transformers import AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained(path)
    except (OSError, ValueError):
        return DEFAULT_MEAN, DEFAULT_STD
    return getattr(processor, "image_mean", DEFAULT_MEAN), getattr(processor, "image_std", DEFAULT_STD)
