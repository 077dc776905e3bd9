"""Normalisation statistics read from pretrained checkpoints: openpi's norm_stats.json against
its equations in float64, and every refusal naming its file and key. (lerobot's layout is
checked against lerobot's own processors in test_pi0.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.core.errors import ConfigError
from embodied.policies.normalization import StatisticsNormalizer
from embodied.policies.pretrained.statistics import read_checkpoint_statistics
from tests.policies.published import save_lerobot_processors

RNG = np.random.default_rng(0)
STATE = {"mean": RNG.normal(0, 2, 5), "std": RNG.uniform(0.5, 1.5, 5)}
ACTIONS = {"mean": RNG.normal(0, 2, 3), "std": RNG.uniform(0.5, 1.5, 3)}
for stats in (STATE, ACTIONS):
    stats["q01"], stats["q99"] = stats["mean"] - 2.3 * stats["std"], stats["mean"] + 2.4 * stats["std"]


def openpi_checkpoint(folder: Path, asset_id: str = "libero", drop: str = "") -> Path:
    """openpi's layout: assets/<asset_id>/norm_stats.json beside the weights."""
    norm_stats = {
        key: {name: value.tolist() for name, value in stats.items() if name != drop}
        for key, stats in (("state", STATE), ("actions", ACTIONS))
    }
    (folder / "assets" / asset_id).mkdir(parents=True)
    (folder / "assets" / asset_id / "norm_stats.json").write_text(json.dumps({"norm_stats": norm_stats}))
    return folder


def lerobot_checkpoint(folder: Path, norm_map: dict[str, str], stats: dict[str, np.ndarray] | None = None) -> Path:
    """lerobot's layout, as its pipelines save it (test_pi0 checks the same files from lerobot)."""
    features = {
        "observation.state": {"type": "STATE", "shape": [5]},
        "action": {"type": "ACTION", "shape": [3]},
        "observation.images.top": {"type": "VISUAL", "shape": [3, 32, 32]},
    }
    stats = stats or {
        f"{feature}.{name}": values[name].astype(np.float32)
        for feature, values in (("observation.state", STATE), ("action", ACTIONS))
        for name in ("mean", "std", "q01", "q99")
    }
    save_lerobot_processors(folder, features, norm_map, stats)
    return folder


def test_openpi_statistics_follow_its_equations_and_the_mode_of_the_model(tmp_path):
    folder = openpi_checkpoint(tmp_path / "pi05_libero")
    state, actions = RNG.normal(0, 3, (4, 5)), RNG.normal(0, 1, (4, 2, 3))
    quantile = read_checkpoint_statistics(folder, quantiles=True)  # pi0.5
    z_score = read_checkpoint_statistics(folder, quantiles=False)  # pi0
    assert quantile.action.mode == "openpi quantiles" and z_score.action.mode == "openpi z-score"

    def applied(statistics, x, inverse):
        normalizer = StatisticsNormalizer(statistics).double()
        x = torch.from_numpy(x)
        return (normalizer.unnormalize(x) if inverse else normalizer(x)).numpy()

    eps = 1e-6  # openpi's, in both directions
    close = lambda ours, theirs: np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)  # noqa: E731 float32 buffers
    q01, q99 = STATE["q01"], STATE["q99"]
    close(applied(quantile.state, state, False), (state - q01) / (q99 - q01 + eps) * 2 - 1)
    close(applied(z_score.state, state, False), (state - STATE["mean"]) / (STATE["std"] + eps))
    q01, q99 = ACTIONS["q01"], ACTIONS["q99"]
    close(applied(quantile.action, actions, True), (actions + 1) / 2 * (q99 - q01 + eps) + q01)
    np.testing.assert_allclose(
        applied(z_score.action, actions, True), actions * (ACTIONS["std"] + eps) + ACTIONS["mean"]
    )
    # the flag flipped (openpi #849) moves every action visibly, it cannot pass unnoticed
    assert np.abs(applied(quantile.action, actions, True) - applied(z_score.action, actions, True)).min() > 1e-2


def test_each_refusal_names_the_file_and_the_key(tmp_path):
    with pytest.raises(ConfigError, match="holds no normalisation statistics"):
        read_checkpoint_statistics(tmp_path, quantiles=False)
    with pytest.raises(ConfigError, match=r"norm_stats.json:norm_stats.state: statistics \['q01'\] are missing"):
        read_checkpoint_statistics(openpi_checkpoint(tmp_path / "no_quantiles", drop="q01"), quantiles=True)
    several = openpi_checkpoint(tmp_path / "several")
    openpi_checkpoint(several, asset_id="droid")
    with pytest.raises(
        ConfigError, match=r"2 norm_stats.json \(\['droid', 'libero'\]\): name one with policy.statistics_key"
    ):
        read_checkpoint_statistics(several, quantiles=True)
    assert read_checkpoint_statistics(several, quantiles=True, key="droid").action is not None

    with pytest.raises(ConfigError, match="norm_map.ACTION is 'LOG_STD', a mode not implemented here"):
        read_checkpoint_statistics(
            lerobot_checkpoint(tmp_path / "log", {"STATE": "MEAN_STD", "ACTION": "LOG_STD"}), False
        )
    with pytest.raises(ConfigError, match="norm_map.VISUAL is MEAN_STD"):
        read_checkpoint_statistics(
            lerobot_checkpoint(tmp_path / "img", {"VISUAL": "MEAN_STD", "STATE": "MEAN_STD"}), False
        )
    no_std = {"observation.state.mean": STATE["mean"], "action.mean": ACTIONS["mean"]}
    with pytest.raises(ConfigError, match=r"normalizer_processor.safetensors:observation.state: statistics \['std'\]"):
        read_checkpoint_statistics(lerobot_checkpoint(tmp_path / "no_std", {"STATE": "MEAN_STD"}, no_std), False)
    half = lerobot_checkpoint(tmp_path / "half", {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
    (half / "policy_postprocessor.json").unlink()
    with pytest.raises(ConfigError, match="policy_postprocessor.json is missing"):
        read_checkpoint_statistics(half, False)
    fine = read_checkpoint_statistics(
        lerobot_checkpoint(tmp_path / "fine", {"STATE": "IDENTITY", "ACTION": "QUANTILES"}), True
    )
    assert fine.state is None and fine.action.mode == "lerobot QUANTILES"
    wide = read_checkpoint_statistics(openpi_checkpoint(tmp_path / "wide"), False)
    with pytest.raises(ConfigError, match=r"norm_stats.state: statistics of shape \(5,\) do not fit the env's \(4,\)"):
        wide.state.require_width(4)
