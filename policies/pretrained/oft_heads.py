"""OpenVLA-OFT's heads beside the language model, with the parameter names of its checkpoint
files (`action_head--<step>_checkpoint.pt`, `proprio_projector--<step>_checkpoint.pt`)."""

from __future__ import annotations

import torch
from torch import nn


class ResidualMLP(nn.Module):
    """OFT's L1 head (`MLPResNet`): LayerNorm, fc1, ReLU, blocks of (LayerNorm, Linear, ReLU)
    added to their input, LayerNorm, fc2."""

    def __init__(self, inputs: int, hidden: int, outputs: int, blocks: int = 2):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(inputs)
        self.fc1 = nn.Linear(inputs, hidden)
        self.mlp_resnet_blocks = nn.ModuleList(
            nn.ModuleDict({"ffn": nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.ReLU())})
            for _ in range(blocks)
        )
        self.layer_norm2 = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block["ffn"](x) + x
        return self.fc2(self.layer_norm2(x))


class ProprioProjector(nn.Module):
    """OFT's state token: fc1, GELU, fc2 into the language model's width."""

    def __init__(self, state_dim: int, width: int):
        super().__init__()
        self.fc1 = nn.Linear(state_dim, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(state)))
