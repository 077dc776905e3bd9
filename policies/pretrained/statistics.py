"""The normalisation a pretrained checkpoint was trained with, read from the checkpoint.

A VLA fine-tuned on a dataset expects its state normalised by that dataset's statistics and
emits normalised actions; loading its weights without them gives actions in the wrong units
(the most reported cause of 0% success). So the statistics and their mode come from the
checkpoint, never from a default, and a checkpoint without them, or with a mode not
implemented here, is refused with the file and key named.

Two layouts:
- lerobot: `policy_preprocessor.json` (its `normalizer_processor` step: per feature type
  MEAN_STD, MIN_MAX, QUANTILES, QUANTILE10 or IDENTITY) and `policy_postprocessor.json` (its
  `unnormalizer_processor`), each with the statistics in the safetensors file the step names
  (keys `<feature>.<statistic>`).
- openpi: `assets/<asset_id>/norm_stats.json` (`norm_stats.state` / `.actions`: mean, std,
  q01, q99). openpi chooses the mode by model: pi0 z-score, pi0.5 quantiles.

SFT on a new dataset computes the statistics from it instead (`dataset_feature`), in the mode
the model was published with.

Every mode is an affine map per element, `normalised = (x - offset) / scale_in` and
`x = normalised * scale_out + offset`, with each library's own epsilon where it puts it, so
statistics of any shape (per dimension, or per horizon step and dimension) apply as they did
in training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.core.errors import ConfigError

LEROBOT_EPS = 1e-8  # NormalizerProcessorStep's default eps
OPENPI_EPS = 1e-6  # openpi's transforms.Normalize / Unnormalize
LEROBOT_FILES = ("policy_preprocessor.json", "policy_postprocessor.json")
LEROBOT_RANGES = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}


@dataclass(frozen=True)
class FeatureStatistics:
    """How one feature (the state, or the actions) was normalised in training."""

    mode: str  # e.g. "lerobot MEAN_STD", "openpi quantiles": for messages and the record
    source: str  # the file and key the statistics came from
    offset: np.ndarray
    scale_in: np.ndarray  # normalise: (x - offset) / scale_in
    scale_out: np.ndarray  # unnormalise: y * scale_out + offset

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.offset.shape)


@dataclass(frozen=True)
class CheckpointStatistics:
    state: FeatureStatistics | None  # None: the checkpoint feeds the state as it is
    action: FeatureStatistics | None


def read_checkpoint_statistics(path: str | Path, quantiles: bool, asset_id: str = "") -> CheckpointStatistics:
    """The statistics of the checkpoint at `path` (a folder, or a file inside it), in
    lerobot's layout or openpi's; `quantiles` is openpi's choice for this model (lerobot's
    files name their own modes)."""
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    if any((folder / name).is_file() for name in LEROBOT_FILES):
        return read_lerobot_statistics(folder)
    if (folder / "assets").is_dir():
        return read_openpi_statistics(folder, quantiles, asset_id)
    raise ConfigError(
        f"{folder} holds no normalisation statistics: a lerobot checkpoint has {' and '.join(LEROBOT_FILES)}, "
        f"an openpi one assets/<asset_id>/norm_stats.json. To fine-tune with statistics of this run's own "
        f"instead, set policy.normalization=running"
    )


# ---- lerobot ------------------------------------------------------------------------------------
def read_lerobot_statistics(folder: Path) -> CheckpointStatistics:
    return CheckpointStatistics(
        state=_lerobot_step(folder, LEROBOT_FILES[0], "normalizer_processor", "STATE"),
        action=_lerobot_step(folder, LEROBOT_FILES[1], "unnormalizer_processor", "ACTION"),
    )


def _lerobot_step(folder: Path, name: str, registry_name: str, feature_type: str) -> FeatureStatistics | None:
    """The statistics of the one `feature_type` feature of the pipeline `name`'s
    `registry_name` step; None where its mode is IDENTITY."""
    file = folder / name
    if not file.is_file():
        raise ConfigError(f"{file} is missing: the checkpoint's {feature_type.lower()} statistics live there")
    pipeline = _read_json(file)
    steps = [s for s in pipeline.get("steps", []) if s.get("registry_name") == registry_name]
    if len(steps) != 1:
        raise ConfigError(f"{file}: expected one '{registry_name}' step, found {len(steps)}")
    step = steps[0]
    config = step.get("config", {})
    norm_map, features = config.get("norm_map", {}), config.get("features", {})
    for other, mode in norm_map.items():
        if other == "VISUAL" and mode != "IDENTITY":
            raise ConfigError(f"{file}: norm_map.VISUAL is {mode}; images normalised by statistics are not supported")
    keys = [key for key, feature in features.items() if feature.get("type") == feature_type]
    if len(keys) != 1:
        raise ConfigError(f"{file}: step '{registry_name}' has {len(keys)} {feature_type} features ({keys}), not one")
    key = keys[0]
    observed = config.get("normalize_observation_keys")
    mode = norm_map.get(feature_type, "IDENTITY")
    if mode == "IDENTITY" or (feature_type != "ACTION" and observed is not None and key not in observed):
        return None
    if mode != "MEAN_STD" and mode not in LEROBOT_RANGES:
        raise ConfigError(f"{file}: norm_map.{feature_type} is '{mode}', a mode not implemented here")
    if "state_file" not in step:
        raise ConfigError(f"{file}: step '{registry_name}' names no state_file with its statistics")
    stats = _read_safetensors(folder / step["state_file"], key)
    source = f"{folder / step['state_file']}:{key}"
    statistics = lerobot_feature(mode, stats, source, float(config.get("eps", LEROBOT_EPS)))
    _check_shape(statistics, features[key].get("shape"), file, key)
    return statistics


def lerobot_feature(
    mode: str, stats: dict[str, np.ndarray], source: str, eps: float = LEROBOT_EPS
) -> FeatureStatistics:
    """A feature normalised as lerobot's (un)normaliser steps do in `mode`."""
    if mode == "MEAN_STD":
        mean, std = _need(stats, ("mean", "std"), source)
        return FeatureStatistics(f"lerobot {mode}", source, mean, std + eps, std)
    low, high = _need(stats, LEROBOT_RANGES[mode], source)
    width = np.where(high - low == 0, eps, high - low)  # lerobot's guard for a constant feature
    return _range_feature(f"lerobot {mode}", source, low, width)


def dataset_feature(values: np.ndarray, mode: str, source: str) -> FeatureStatistics:
    """A feature's statistics computed from a dataset's rows (N, D), in `mode` (MEAN_STD or
    QUANTILES), as lerobot computes and applies them."""
    values = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
    stats = {"mean": values.mean(0), "std": values.std(0)}
    stats["q01"], stats["q99"] = np.quantile(values, [0.01, 0.99], axis=0)
    return lerobot_feature(mode, stats, source)


def _read_safetensors(file: Path, key: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    if not file.is_file():
        raise ConfigError(f"{file} is missing: the statistics of '{key}' live there")
    prefix = key + "."
    return {
        name[len(prefix) :]: array.astype(np.float64)
        for name, array in load_file(str(file)).items()
        if name.startswith(prefix)
    }


# ---- openpi -------------------------------------------------------------------------------------
def read_openpi_statistics(folder: Path, quantiles: bool, asset_id: str = "") -> CheckpointStatistics:
    assets = sorted(p.parent.name for p in (folder / "assets").glob("*/norm_stats.json"))
    if asset_id:
        if asset_id not in assets:
            raise ConfigError(f"{folder}/assets/{asset_id}/norm_stats.json is missing (found: {assets})")
    elif len(assets) == 1:
        asset_id = assets[0]
    else:
        raise ConfigError(
            f"{folder}/assets holds {len(assets)} norm_stats.json ({assets}): name one with policy.asset_id"
        )
    file = folder / "assets" / asset_id / "norm_stats.json"
    norm_stats = _read_json(file).get("norm_stats")
    if not isinstance(norm_stats, dict):
        raise ConfigError(f"{file}: no 'norm_stats' map")
    return CheckpointStatistics(
        state=_openpi_feature(norm_stats, "state", quantiles, file),
        action=_openpi_feature(norm_stats, "actions", quantiles, file),
    )


def _openpi_feature(norm_stats: dict[str, Any], key: str, quantiles: bool, file: Path) -> FeatureStatistics:
    source = f"{file}:norm_stats.{key}"
    if key not in norm_stats:
        raise ConfigError(f"{source} is missing")
    stats = {name: np.asarray(value, dtype=np.float64) for name, value in norm_stats[key].items() if value is not None}
    if quantiles:
        low, high = _need(stats, ("q01", "q99"), source)
        return _range_feature("openpi quantiles", source, low, high - low + OPENPI_EPS)
    mean, std = _need(stats, ("mean", "std"), source)
    return FeatureStatistics("openpi z-score", source, mean, std + OPENPI_EPS, std + OPENPI_EPS)


# ---- shared -------------------------------------------------------------------------------------
def _range_feature(mode: str, source: str, low: np.ndarray, width: np.ndarray) -> FeatureStatistics:
    """[low, low + width] onto [-1, 1], both ways."""
    half = width / 2
    return FeatureStatistics(mode, source, low + half, half, half)


def _read_json(file: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"{file} cannot be read: {error}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{file} is not a JSON object")
    return loaded


def _need(stats: dict[str, np.ndarray], names: tuple[str, ...], source: str) -> list[np.ndarray]:
    missing = [n for n in names if n not in stats]
    if missing:
        raise ConfigError(f"{source}: statistics {missing} are missing (found: {sorted(stats)})")
    arrays = [stats[n] for n in names]
    if len({a.shape for a in arrays}) != 1:
        raise ConfigError(f"{source}: {names} differ in shape ({[a.shape for a in arrays]})")
    return arrays


def _check_shape(statistics: FeatureStatistics, declared: Any, file: Path, key: str) -> None:
    if declared is not None and statistics.shape[-1:] != tuple(declared)[-1:]:
        raise ConfigError(f"{file}: the statistics of '{key}' have shape {statistics.shape}, the feature {declared}")


class StatisticsNormalizer(nn.Module):
    """A feature's fixed training normalisation, as module buffers (saved with the weights,
    so a served checkpoint's `normalization_id` changes when they do)."""

    def __init__(self, statistics: FeatureStatistics):
        super().__init__()
        self.mode, self.source = statistics.mode, statistics.source
        for name in ("offset", "scale_in", "scale_out"):
            self.register_buffer(name, torch.as_tensor(getattr(statistics, name), dtype=torch.float32))

    @classmethod
    def unfitted(cls, dim: int) -> StatisticsNormalizer:
        """A normaliser whose statistics are still to come (`set`); NaN until then, so nothing
        can act on them by mistake."""
        nan = np.full(dim, np.nan)
        return cls(FeatureStatistics("not set yet", "SFT's demonstrations", nan, nan, nan))

    @property
    def fitted(self) -> bool:
        return not bool(torch.isnan(self.scale_in).any())

    @torch.no_grad()
    def set(self, statistics: FeatureStatistics) -> None:
        self.mode, self.source = statistics.mode, statistics.source
        for name in ("offset", "scale_in", "scale_out"):
            getattr(self, name).copy_(torch.as_tensor(getattr(statistics, name)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offset, scale_in, _ = self._for(x)
        return (x - offset) / scale_in

    def unnormalize(self, y: torch.Tensor) -> torch.Tensor:
        offset, _, scale_out = self._for(y)
        return y * scale_out + offset

    def _for(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The buffers for `x`: per-horizon statistics (H, A) cut to its first steps (..., C, A)."""
        buffers = (self.offset, self.scale_in, self.scale_out)
        if self.offset.dim() == 2:
            return tuple(b[: x.shape[-2]] for b in buffers)
        return buffers

    def require_width(self, dim: int, horizon: int | None = None) -> None:
        """Refuse statistics of another width than the env's `dim` (or, per horizon step, of
        more or fewer steps than `horizon`), naming where they came from."""
        shape = tuple(self.offset.shape)
        per_step = len(shape) == 2 and horizon is not None and shape[0] == horizon
        if shape[-1:] != (dim,) or not (len(shape) == 1 or per_step):
            wanted = f"({dim},)" + (f" or ({horizon}, {dim})" if horizon else "")
            raise ConfigError(f"{self.source}: statistics of shape {shape} do not fit the env's {wanted}")
