"""What the flow VLAs that load published checkpoints (pi0, pi0.5, SmolVLA) share beyond
`policy=flow`: the normalisation statistics they act with and the cameras they read.

- `normalization=checkpoint` with `pretrained`: the statistics the checkpoint was trained with
  (policies/pretrained/statistics.py), fixed; its image inputs, in its order (policies/pretrained/features.py).
- `normalization=dataset`: fixed statistics that SFT computes from its demonstrations in the
  model's published mode (`published_mode`); the policy refuses to act before.
- `normalization=running`, or no `pretrained`: this run's own (policy=flow's).
The model's actions are unnormalised by the fixed statistics, then clipped to the env's bounds
as the env executes them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.policies.denoising.flow import FlowPolicy, FlowPolicyConfig
from embodied.policies.normalization import StatisticsNormalizer
from embodied.policies.pretrained.features import camera_inputs, checkpoint_inputs, parse_features
from embodied.policies.pretrained.statistics import dataset_feature, read_checkpoint_statistics

NORMALIZATIONS = ("checkpoint", "dataset", "running")
MIN_PERIOD, MAX_PERIOD = 4e-3, 4.0  # the time embedding's shortest and longest periods


def check_normalization(cfg: FlowPolicyConfig) -> None:
    if cfg.normalization not in NORMALIZATIONS:
        raise ConfigError(f"policy.normalization must be one of {NORMALIZATIONS}, got '{cfg.normalization}'")


def time_features(t: torch.Tensor, width: int) -> torch.Tensor:
    """pi0's and SmolVLA's embedding of the flow time: sines then cosines of 2 pi t / period,
    periods spaced geometrically from 4e-3 to 4 (computed in float64, as the reference does,
    then cast to t's dtype)."""
    fraction = torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64, device=t.device)
    period = MIN_PERIOD * (MAX_PERIOD / MIN_PERIOD) ** fraction
    angles = (2 * math.pi / period)[None] * t.to(torch.float64)[:, None]
    return torch.cat([angles.sin(), angles.cos()], 1).to(t.dtype)


def euler_sample(
    velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], noise: torch.Tensor, steps: int
) -> torch.Tensor:
    """The flow ODE from `noise` at t = 1 to actions at t = 0 in `steps` Euler steps of
    `velocity(x, t)`: pi0's and SmolVLA's own inference, for checking a loaded checkpoint."""
    x, dt = noise, 1.0 / steps
    for step in range(steps):
        t = torch.full((len(x),), 1.0 - step * dt, device=x.device)
        x = x - dt * velocity(x, t)
    return x


def pooled(hidden: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The mean of a prefix's hidden states (B, L, W) over its valid tokens: (B, W)."""
    weights = valid[..., None].to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def published_config(path: str) -> dict:
    """The config.json beside a published checkpoint (lerobot's, or an openpi conversion's),
    {} where there is none."""
    folder = Path(path)
    if not folder.exists():
        raise ConfigError(f"policy.pretrained {path} does not exist")
    config = (folder if folder.is_dir() else folder.parent) / "config.json"
    if not config.is_file():
        return {}
    try:
        return json.loads(config.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{config} is not valid JSON: {error}") from None


def assign_weights(model: nn.Module, weights: dict[str, torch.Tensor], file: Path, what: str) -> None:
    """A checkpoint's `weights`, renamed to `model`'s names, become its parameters (`model` may
    be on the meta device); any mismatch by name is refused: every parameter must be there, at
    its shape, and nothing left over. `what` names the model the file was meant to fit."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong = [
        f"{k} {tuple(weights[k].shape)} (the model's: {tuple(expected[k].shape)})"
        for k in expected
        if k in weights and weights[k].shape != expected[k].shape
    ]
    if missing or unexpected or wrong:
        problems = [
            f"{len(missing)} missing (e.g. {missing[:3]})" if missing else "",
            f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})" if unexpected else "",
            f"{len(wrong)} of another shape (e.g. {wrong[:2]})" if wrong else "",
        ]
        raise ConfigError(f"{file} does not match {what}: " + "; ".join(p for p in problems if p))
    model.load_state_dict(weights, assign=True)


class PretrainedFlowVLA(FlowPolicy):
    accepts_images = True
    published_mode = "MEAN_STD"  # how the model's publishers normalise a new dataset

    def _use_normalization(self, cfg: FlowPolicyConfig, spec: EnvSpec, saved_config: dict) -> None:
        """Set the statistics and the cameras from `cfg.normalization` (after FlowPolicy's
        init, whose running normaliser they replace where fixed)."""
        acts_as_trained = bool(cfg.pretrained) and cfg.normalization == "checkpoint"
        self.fixed_statistics = acts_as_trained or cfg.normalization == "dataset"
        self.action_normalizer: StatisticsNormalizer | None = None
        if cfg.normalization == "dataset":  # set by fit_statistics
            self.normalizer = StatisticsNormalizer.unfitted(spec.state_dim)
            self.action_normalizer = StatisticsNormalizer.unfitted(spec.action_dim)
        elif acts_as_trained:
            self._use_statistics_of(cfg.pretrained, quantiles=self.published_mode == "QUANTILES")
        # a checkpoint acting as trained reads the inputs it was trained on; on a new robot
        # (running or dataset statistics) the env's cameras are the inputs, as lerobot's
        # fine-tuning takes its dataset's features
        inputs = checkpoint_inputs(cfg.pretrained, saved_config) if acts_as_trained else None
        self.cameras = camera_inputs(inputs, parse_features(cfg.features), spec)

    def _use_statistics_of(self, pretrained: str, quantiles: bool) -> None:
        """The checkpoint's own normalisation replaces this run's: fixed state statistics
        (none: the state as it is) and actions unnormalised by its action statistics."""
        statistics = read_checkpoint_statistics(pretrained, quantiles, self.cfg.statistics_key)
        self.normalizer = nn.Identity()
        if statistics.state is not None:
            statistics.state.require_width(self.spec.state_dim)
            self.normalizer = StatisticsNormalizer(statistics.state)
        if statistics.action is not None:
            statistics.action.require_width(self.spec.action_dim, self.cfg.horizon)
            self.action_normalizer = StatisticsNormalizer(statistics.action)

    def _normalized_state(self, observation: Observation) -> torch.Tensor:
        if self.cfg.normalization == "dataset" and not self.normalizer.fitted:
            raise ConfigError(
                "policy.normalization=dataset: the statistics come from SFT's demonstrations; run "
                "`embodied sft` first (an RL run takes them with init=<the SFT run>)"
            )
        return self.normalizer(observation.state.to(self.low.device, torch.float32))

    def _to_env(self, chunk: torch.Tensor) -> torch.Tensor:
        if not self.fixed_statistics:
            return super()._to_env(chunk)
        if self.action_normalizer is not None:
            chunk = self.action_normalizer.unnormalize(chunk)
        return torch.maximum(torch.minimum(chunk, self.high), self.low)  # as the env executes it

    def _to_model(self, actions: torch.Tensor) -> torch.Tensor:
        if not self.fixed_statistics:
            return super()._to_model(actions)
        return actions if self.action_normalizer is None else self.action_normalizer(actions)

    def update_normalization(self, observation: Observation) -> None:
        if not self.fixed_statistics:  # a checkpoint's or a dataset's statistics stay as they are
            super().update_normalization(observation)

    def fit_statistics(self, observation: Observation, actions: torch.Tensor) -> None:
        if self.cfg.normalization != "dataset":
            return super().fit_statistics(observation, actions)
        for normalizer, values in ((self.normalizer, observation.state), (self.action_normalizer, actions)):
            normalizer.set(
                dataset_feature(
                    values.detach().cpu().numpy(), self.published_mode, f"SFT's {len(values)} demonstrated frames"
                )
            )

    def pretrained_frozen(self) -> tuple[str, list[str]] | None:
        """What is frozen of a model loaded from `pretrained`: a checkpoint of the run then holds
        what trains (gigabytes less at the real sizes). Without `pretrained` the frozen weights
        are random and are saved."""
        names = self.frozen_parameter_names() if self.cfg.pretrained else []
        return (self.cfg.pretrained, names) if names else None
