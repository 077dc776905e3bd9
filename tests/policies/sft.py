"""Behaviour cloning on a fixed tiny dataset, for the policies' SFT tests."""

import torch

from embodied.core.policy import Policy
from embodied.core.types import Observation


def bc_losses(policy: Policy, observation: Observation, actions: torch.Tensor, steps: int, lr: float) -> list[float]:
    """`steps` Adam steps on the policy's own `bc_loss` (trainable parameters); each step's loss."""
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=lr)
    losses = []
    for _ in range(steps):
        loss = policy.bc_loss(observation, actions)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses
