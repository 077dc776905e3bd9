"""The normalisation a pretrained checkpoint was trained with, read from the checkpoint: the
one place pi0, pi0.5, SmolVLA and OpenVLA take their state and action statistics from.

A VLA fine-tuned on a dataset expects its state normalised by that dataset's statistics and
emits normalised actions; loading its weights without them gives actions in the wrong units
(the most reported cause of 0% success). So the statistics and their mode come from the
checkpoint, never from a default, and a checkpoint without them, or with a mode not
implemented here, is refused with the file and key named.

Three layouts:
- lerobot: `policy_preprocessor.json` (its `normalizer_processor` step: per feature type
  MEAN_STD, MIN_MAX, QUANTILES, QUANTILE10 or IDENTITY) and `policy_postprocessor.json` (its
  `unnormalizer_processor`), each with the statistics in the safetensors file the step names
  (keys `<feature>.<statistic>`).
- openpi: `assets/<asset_id>/norm_stats.json` (`norm_stats.state` / `.actions`: mean, std,
  q01, q99). openpi chooses the mode by model: pi0 z-score, pi0.5 quantiles.
- OpenVLA: `dataset_statistics.json` (a fine-tune's), else `config.json`'s `norm_stats`, one
  entry per dataset (`<key>.action` / `.proprio`: q01, q99, and a `mask` that leaves
  dimensions such as the gripper as they are). Its bounds map [q01, q99] onto [-1, 1], the
  proprio's with OFT's epsilon of 1e-8 in the width, the actions' without one.

Where a checkpoint holds several datasets' statistics, `policy.statistics_key` names whose
(openpi's asset id, OpenVLA's unnorm_key).

SFT on a new dataset computes the statistics from it instead (`dataset_feature`), in the mode
the model was published with. Every mode becomes one affine map per element
(`policies/normalization.py`'s `FeatureStatistics`), applied by `StatisticsNormalizer`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodied.core.errors import ConfigError
from embodied.policies.normalization import FeatureStatistics, range_feature

LEROBOT_EPS = 1e-8  # NormalizerProcessorStep's default eps
OPENPI_EPS = 1e-6  # openpi's transforms.Normalize / Unnormalize
OFT_PROPRIO_EPS = 1e-8  # OpenVLA-OFT's normalize_proprio
OPENVLA_FILE = "dataset_statistics.json"
LEROBOT_FILES = ("policy_preprocessor.json", "policy_postprocessor.json")
LEROBOT_RANGES = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}


@dataclass(frozen=True)
class CheckpointStatistics:
    state: FeatureStatistics | None  # None: the checkpoint feeds the state as it is
    action: FeatureStatistics | None
    key: str = ""  # whose statistics, as found (openpi's asset id, OpenVLA's dataset key)
    published: dict | None = None  # OpenVLA: its entry as the file holds it, to be written back


def read_checkpoint_statistics(path: str | Path, quantiles: bool, key: str = "") -> CheckpointStatistics:
    """The statistics of the checkpoint at `path` (a folder, or a file inside it), in
    lerobot's layout, openpi's or OpenVLA's; `quantiles` is openpi's choice for this model
    (the other layouts name their own modes); `key` is `policy.statistics_key`."""
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    if any((folder / name).is_file() for name in LEROBOT_FILES):
        return read_lerobot_statistics(folder)
    if (folder / "assets").is_dir():
        return read_openpi_statistics(folder, quantiles, key)
    config = _config_of(folder)
    if (folder / OPENVLA_FILE).is_file() or "norm_stats" in config:
        return read_openvla_statistics(folder, key, config)
    raise ConfigError(
        f"{folder} holds no normalisation statistics: a lerobot checkpoint has {' and '.join(LEROBOT_FILES)}, "
        f"an openpi one assets/<asset_id>/norm_stats.json, an OpenVLA one {OPENVLA_FILE} or norm_stats in "
        f"config.json. Without them its actions would be in the wrong units. To fine-tune with "
        f"statistics of this run's own instead, set policy.normalization=running"
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
    return range_feature(f"lerobot {mode}", source, low, width)


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
            f"{folder}/assets holds {len(assets)} norm_stats.json ({assets}): name one with policy.statistics_key"
        )
    file = folder / "assets" / asset_id / "norm_stats.json"
    norm_stats = _read_json(file).get("norm_stats")
    if not isinstance(norm_stats, dict):
        raise ConfigError(f"{file}: no 'norm_stats' map")
    return CheckpointStatistics(
        state=_openpi_feature(norm_stats, "state", quantiles, file),
        action=_openpi_feature(norm_stats, "actions", quantiles, file),
        key=asset_id,
    )


def _openpi_feature(norm_stats: dict[str, Any], key: str, quantiles: bool, file: Path) -> FeatureStatistics:
    source = f"{file}:norm_stats.{key}"
    if key not in norm_stats:
        raise ConfigError(f"{source} is missing")
    stats = {name: np.asarray(value, dtype=np.float64) for name, value in norm_stats[key].items() if value is not None}
    if quantiles:
        low, high = _need(stats, ("q01", "q99"), source)
        return range_feature("openpi quantiles", source, low, high - low + OPENPI_EPS)
    mean, std = _need(stats, ("mean", "std"), source)
    return FeatureStatistics("openpi z-score", source, mean, std + OPENPI_EPS, std + OPENPI_EPS)


# ---- OpenVLA ------------------------------------------------------------------------------------
def read_openvla_statistics(folder: Path, key: str = "", config: dict | None = None) -> CheckpointStatistics:
    """The action (and, where the fine-tune has one, proprio) statistics of the dataset `key`:
    `dataset_statistics.json`, else config.json's `norm_stats`. `key` may be omitted where
    there is one dataset; `libero_spatial` finds `libero_spatial_no_noops`, as the LIBERO
    fine-tunes name their datasets."""
    file = folder / OPENVLA_FILE
    config = _config_of(folder) if config is None else config  # its config.json, where the caller read it
    if not file.is_file() and "norm_stats" not in config:
        raise ConfigError(
            f"policy.pretrained {folder} has no normalisation statistics (neither {OPENVLA_FILE} nor norm_stats "
            f"in config.json): its actions cannot be put back in the robot's units"
        )
    if file.is_file():
        stats, where = _read_json(file), str(file)
    else:
        stats, where = config["norm_stats"], f"{folder / 'config.json'}:norm_stats"
    if not isinstance(stats, dict) or not stats:
        raise ConfigError(f"{where} holds no dataset's statistics")
    if not key:
        if len(stats) != 1:
            raise ConfigError(
                f"{folder} was trained on several datasets: choose whose statistics to use with "
                f"policy.statistics_key=<one of {sorted(stats)}>"
            )
        key = next(iter(stats))
    if key not in stats and f"{key}_no_noops" in stats:
        key = f"{key}_no_noops"
    if key not in stats:
        raise ConfigError(f"policy.statistics_key '{key}' is not in {where}: one of {sorted(stats)}")
    entry = stats[key]
    action = _openvla_bounds(entry, "action", f"{where}[{key}].action", eps=0.0)
    if action is None:
        raise ConfigError(f"{where}[{key}] has no action statistics: OpenVLA unnormalises with q01 and q99")
    state = _openvla_bounds(entry, "proprio", f"{where}[{key}].proprio", eps=OFT_PROPRIO_EPS)
    return CheckpointStatistics(state=state, action=action, key=key, published=entry)


def _openvla_bounds(entry: dict, name: str, source: str, eps: float) -> FeatureStatistics | None:
    """[q01, q99 + eps] onto [-1, 1] where `mask` is true (every dimension without one); a
    masked dimension passes as it is. None where the entry has no `name`."""
    if name not in entry:
        return None
    stats = {k: np.asarray(v, dtype=np.float64) for k, v in entry[name].items() if k in ("q01", "q99", "mask")}
    low, high = _need(stats, ("q01", "q99"), source)
    mask = stats.get("mask", np.ones(low.shape)).astype(bool)
    if mask.shape != low.shape:
        raise ConfigError(f"{source}: mask has shape {mask.shape}, q01 and q99 {low.shape}")
    flat = np.flatnonzero(mask & (high - low + eps <= 0))
    if len(flat):
        raise ConfigError(f"{source}: every scaled dimension's q99 must exceed its q01: not dimensions {flat.tolist()}")
    scaled, one = range_feature("OpenVLA q01/q99", source, low, high - low + eps), np.ones(low.shape)
    return FeatureStatistics(
        scaled.mode,
        source,
        np.where(mask, scaled.offset, 0.0),
        np.where(mask, scaled.scale_in, one),
        np.where(mask, scaled.scale_out, one),
    )


# ---- shared -------------------------------------------------------------------------------------
def _config_of(folder: Path) -> dict[str, Any]:
    """The checkpoint's config.json, {} where it has none."""
    file = folder / "config.json"
    return _read_json(file) if file.is_file() else {}


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
