"""The policy contract shared by every model family.

- `act(observation)` samples an `ActionChunk` (with log-prob, value and the sampling record);
- `recompute(observation, chunk)` recomputes log-prob, entropy and value of stored samples,
  which is what on-policy RL needs after the weights moved;
- `bc_loss(observation, actions)` is the supervised loss for SFT on demonstrations;
- `update_normalization(observation)` folds a batch into the input statistics, which live in
  the module's buffers so they travel with the weights and the checkpoint;
- `fit_statistics(observation, actions)` sets them from SFT's demonstrations, once.

The contract imports no torch, so the core stays light for env workers and robot clients.
Every policy is also a `torch.nn.Module` (`class MyPolicy(nn.Module, Policy)`): the methods
below that look at parameters rely on that."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from embodied.core.types import ActionChunk, EnvSpec, Observation

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class Recomputed:
    log_prob: torch.Tensor  # (B,)
    entropy: torch.Tensor  # (B,)
    value: torch.Tensor  # (B,)
    # (B, P) where the log-prob is a sum of terms: one per action token (token policies) or per
    # trained denoising step (diffusion, flow_noise); None: the chunk is one term
    term_log_prob: torch.Tensor | None = None


class Policy(ABC):
    chunk_size: int
    spec: EnvSpec
    critic: Any  # the value function's module

    @abstractmethod
    def act(
        self, observation: Observation, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> ActionChunk:
        """Sample (or, deterministic, take the mode of) an action chunk per env; random draws
        come from `generator` (default: torch's global one)."""

    @abstractmethod
    def recompute(self, observation: Observation, chunk: ActionChunk) -> Recomputed:
        """Log-prob, entropy and value of `chunk` under the current weights."""

    @abstractmethod
    def value(self, observation: Observation) -> torch.Tensor:
        """State value (B,), e.g. to bootstrap a truncated episode."""

    @abstractmethod
    def bc_loss(self, observation: Observation, actions: torch.Tensor) -> torch.Tensor:
        """Supervised loss for demonstrated actions (B, C, A)."""

    def frozen_features(self, observation: Observation) -> torch.Tensor | None:
        """What frozen encoders make of `observation` (B, F), for a caller that computes it
        once per sample and passes it to `bc_loss(..., features=)`; None for policies
        without frozen encoders."""
        return None

    def pretrained_frozen(self) -> tuple[str, list[str]] | None:
        """(source, names): the state-dict entries this policy loads from a pretrained `source`
        (a local path or hub id) when it is built and never trains, such as a LoRA run's
        backbone. Checkpoints leave them out (`embodied.runs.checkpoint`); a load rebuilds them from
        the source and checks they are the same. None by default: everything is saved."""
        return None

    def frozen_parameter_names(self) -> list[str]:
        """Every state-dict name of the parameters that do not train: a tied weight is one
        parameter under two names, and a checkpoint that leaves it out must leave out both."""
        return [name for name, p in self.named_parameters(remove_duplicate=False) if not p.requires_grad]

    def fsdp_units(self) -> list[nn.Module]:
        """Submodules to shard as units of their own under `runtime.learner_sharding=fsdp`,
        each gathered only while it runs (its `forward` must be what runs it); the rest of the
        policy is one unit. None by default."""
        return []

    def value_parameters(self) -> list[nn.Parameter]:
        """The parameters of the value function alone (critic warm-up trains only these)."""
        return list(self.critic.parameters())

    def new_modules(self) -> set[str]:
        """Top-level modules this policy adds to weights trained without them (e.g. DSRL's
        latent actor on a flow policy): they start fresh when a run's `init` lacks them."""
        return set()

    def update_normalization(self, observation: Observation) -> None:
        """Fold observations into the input statistics (no-op for policies without any)."""

    def fit_statistics(self, observation: Observation, actions: torch.Tensor) -> None:
        """The statistics of SFT's demonstrations (states and their actions (N, A)), once before
        SFT. By default the states are folded into the input statistics; a policy that
        normalises its actions by a dataset's statistics takes those too."""
        self.update_normalization(observation)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device
