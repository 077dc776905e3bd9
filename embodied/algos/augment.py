"""Image augmentation for off-policy learning from pixels."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """DrQ's augmentation: each image (B, H, W, C) padded by `pad` pixels (edges repeated) and
    cropped back to (H, W) at a random integer offset, per image. uint8 stays uint8."""
    if pad <= 0:
        return images
    batch, height, width, _ = images.shape
    padded = F.pad(images.permute(0, 3, 1, 2).float(), (pad, pad, pad, pad), mode="replicate")
    offsets = torch.randint(0, 2 * pad + 1, (batch, 2), generator=generator).to(images.device)
    rows = offsets[:, 0, None] + torch.arange(height, device=images.device)  # (B, H)
    columns = offsets[:, 1, None] + torch.arange(width, device=images.device)  # (B, W)
    batch_index = torch.arange(batch, device=images.device)[:, None, None]
    shifted = padded.permute(0, 2, 3, 1)[batch_index, rows[:, :, None], columns[:, None, :]]
    return shifted.to(images.dtype)
