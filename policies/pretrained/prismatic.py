"""The vision side of OpenVLA (the Prismatic VLM): two ViT towers read each image, their patch
features are concatenated per patch and projected into the language model's width.

    DINOv2 ViT-L/14 with 4 registers  ->  (B, 256, 1024) ┐
                                                          ├ concat -> (B, 256, 2176) -> MLP -> (B, 256, 4096)
    SigLIP so400m/14                 ->  (B, 256, 1152) ┘

Each tower's features are its second-to-last block's output, before the final norm, with the
prefix tokens (DINOv2's class token and registers) dropped, as Prismatic takes them. The
towers are transformers' DINOv2-with-registers and SigLIP vision models; the published
checkpoints name their tensors as timm does, and `policies/pretrained/openvla_checkpoint.py` maps
between the two. Two differences are bridged: timm's DINOv2 adds position embeddings to the
patches only (its embeddings are computed here as timm does, so the class token's position
that transformers keeps is never read and stays zero), and timm keeps the attention's query,
key and value in one matrix (joined and split by the mapping).

An image's pixels are the two towers' inputs stacked on the channel axis (B, 6, H, W): the
first three channels for DINOv2 (ImageNet's mean and std), the last three for SigLIP (0.5,
0.5). Frames are resized to the towers' size with a bicubic filter and rounded to 8 bits, as
the published image processor does with PIL."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from embodied.core.errors import ConfigError

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIGLIP_MEAN, SIGLIP_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class TowerSpec:
    family: str  # dinov2 | siglip
    width: int
    depth: int
    heads: int
    mlp: int
    patch: int
    image_size: int
    registers: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch) ** 2


# By the timm model id a checkpoint's config names; the tiny ones are test sizes of the same
# structure (a DINOv2 MLP is 4x its width, as transformers builds it).
TOWERS = {
    "vit_large_patch14_reg4_dinov2.lvd142m": TowerSpec(
        "dinov2", 1024, 24, 16, 4096, 14, 224, 4, IMAGENET_MEAN, IMAGENET_STD
    ),
    "vit_so400m_patch14_siglip_224": TowerSpec("siglip", 1152, 27, 16, 4304, 14, 224, 0, SIGLIP_MEAN, SIGLIP_STD),
    "tiny_dinov2_reg4": TowerSpec("dinov2", 32, 3, 2, 128, 14, 56, 4, IMAGENET_MEAN, IMAGENET_STD),
    "tiny_siglip": TowerSpec("siglip", 48, 3, 2, 80, 14, 56, 0, SIGLIP_MEAN, SIGLIP_STD),
}


def tower_spec(timm_id: str) -> TowerSpec:
    if timm_id not in TOWERS:
        raise ConfigError(f"vision tower '{timm_id}' is not one this policy builds: one of {sorted(TOWERS)}")
    return TOWERS[timm_id]


class VisionTower(nn.Module):
    """One ViT: pixels (B, 3, S, S) -> its second-to-last block's patch tokens (B, N, width)."""

    def __init__(self, spec: TowerSpec):
        super().__init__()
        self.spec = spec
        if spec.family == "dinov2":
            from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

            if spec.mlp != 4 * spec.width:
                raise ConfigError(f"a DINOv2 tower's MLP is 4x its width, got {spec.mlp} for {spec.width}")
            self.model = Dinov2WithRegistersModel(
                Dinov2WithRegistersConfig(
                    hidden_size=spec.width,
                    num_hidden_layers=spec.depth,
                    num_attention_heads=spec.heads,
                    mlp_ratio=4,
                    image_size=spec.image_size,
                    patch_size=spec.patch,
                    num_register_tokens=spec.registers,
                    layerscale_value=1.0,
                    hidden_act="gelu",
                    layer_norm_eps=1e-6,
                )
            )
            self.model.embeddings.mask_token.requires_grad_(False)  # masked pretraining only
            with torch.no_grad():  # the class token's position: never read (`_dinov2_embeddings`)
                self.model.embeddings.position_embeddings[:, 0].zero_()
            self.prefix = 1 + spec.registers
        elif spec.family == "siglip":
            from transformers import SiglipVisionConfig, SiglipVisionModel

            model = SiglipVisionModel(
                SiglipVisionConfig(
                    hidden_size=spec.width,
                    intermediate_size=spec.mlp,
                    num_hidden_layers=spec.depth,
                    num_attention_heads=spec.heads,
                    image_size=spec.image_size,
                    patch_size=spec.patch,
                    hidden_act="gelu",  # timm's so400m uses the exact GELU, not the tanh approximation
                    layer_norm_eps=1e-6,
                )
            )
            # transformers before 5.0 keeps the tower one level down; 5.x flattened it
            self.model = getattr(model, "vision_model", model)
            self.prefix = 0
        else:
            raise ConfigError(f"unknown vision tower family '{spec.family}'")

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.encoder.layer if self.spec.family == "dinov2" else self.model.encoder.layers

    def _dinov2_embeddings(self, pixels: torch.Tensor) -> torch.Tensor:
        """timm's order: position embeddings on the patches, then the class token and the
        registers in front, without positions."""
        embeddings = self.model.embeddings
        patches = embeddings.patch_embeddings(pixels) + embeddings.position_embeddings[:, 1:]
        batch = patches.shape[0]
        prefix = [embeddings.cls_token.expand(batch, -1, -1), embeddings.register_tokens.expand(batch, -1, -1)]
        return torch.cat([*prefix, patches], 1)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.spec.family == "dinov2":
            tokens = self._dinov2_embeddings(pixels)
        else:
            tokens = self.model.embeddings(pixels)
        for block in self.blocks[:-1]:  # the last block's output is not used
            # SigLIP's layers require a mask argument; DINOv2's take none in some transformers releases
            tokens = block(tokens) if self.spec.family == "dinov2" else block(tokens, None)
        return tokens[:, self.prefix :]


class VisionBackbone(nn.Module):
    """The featurizer (and, fused, a second tower): pixels (B, 3 or 6, S, S) -> (B, N, widths)."""

    def __init__(self, timm_ids: list[str]):
        super().__init__()
        specs = [tower_spec(name) for name in timm_ids]
        if len(specs) not in (1, 2) or len({(s.image_size, s.patch) for s in specs}) != 1:
            raise ConfigError(f"one or two vision towers of one image and patch size, got {timm_ids}")
        self.specs = specs
        self.featurizer = VisionTower(specs[0])
        self.fused_featurizer = VisionTower(specs[1]) if len(specs) == 2 else None

    @property
    def width(self) -> int:
        return sum(spec.width for spec in self.specs)

    @property
    def patches(self) -> int:
        return self.specs[0].patches

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        features = self.featurizer(pixels[:, :3])
        if self.fused_featurizer is None:
            return features
        return torch.cat([features, self.fused_featurizer(pixels[:, 3:])], -1)


class Projector(nn.Module):
    """Patch features -> the language model's width: fused, fc1 (4x the vision width), GELU,
    fc2, GELU, fc3; one tower, fc1, GELU, fc2."""

    def __init__(self, vision_width: int, llm_width: int, fused: bool):
        super().__init__()
        self.fused = fused
        if fused:
            self.fc1 = nn.Linear(vision_width, 4 * vision_width)
            self.fc2 = nn.Linear(4 * vision_width, llm_width)
            self.fc3 = nn.Linear(llm_width, llm_width)
        else:
            self.fc1 = nn.Linear(vision_width, llm_width)
            self.fc2 = nn.Linear(llm_width, llm_width)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        hidden = self.fc2(nn.functional.gelu(self.fc1(features)))
        return self.fc3(nn.functional.gelu(hidden)) if self.fused else hidden


class ImagePixels(nn.Module):
    """Camera frames uint8 (B, H, W, 3) -> the towers' inputs (B, 3 x towers, S, S).

    `center_crop` first keeps the central 90% of the frame's area (a side of sqrt(0.9)), as
    OpenVLA's evaluations do for checkpoints trained with random-crop augmentation."""

    def __init__(self, specs: list[TowerSpec], center_crop: bool = False, normalization: list[tuple] | None = None):
        super().__init__()
        self.size = specs[0].image_size
        self.center_crop = center_crop
        normalization = normalization or [(spec.mean, spec.std) for spec in specs]  # (mean, std) per tower
        mean = torch.tensor([value for pair in normalization for value in pair[0]], dtype=torch.float32)
        std = torch.tensor([value for pair in normalization for value in pair[1]], dtype=torch.float32)
        self.register_buffer("mean", mean.view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", std.view(1, -1, 1, 1), persistent=False)
        self.towers = len(specs)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        pixels = torch.as_tensor(frames).permute(0, 3, 1, 2)
        if self.center_crop:
            height, width = pixels.shape[-2:]
            side_h, side_w = round(height * math.sqrt(0.9)), round(width * math.sqrt(0.9))
            top, left = (height - side_h) // 2, (width - side_w) // 2
            pixels = pixels[..., top : top + side_h, left : left + side_w]
        if tuple(pixels.shape[-2:]) != (self.size, self.size):
            # uint8 on the CPU: torch's antialiased bicubic on 8-bit images is PIL's filter (within
            # one level on under 1% of pixels; on float input up to 18 levels apart)
            pixels = nn.functional.interpolate(
                pixels.cpu().to(torch.uint8).contiguous(),
                size=(self.size, self.size),
                mode="bicubic",
                antialias=True,
                align_corners=False,
            )
        pixels = pixels.to(self.mean.device).float().repeat(1, self.towers, 1, 1) / 255.0
        return (pixels - self.mean) / self.std
