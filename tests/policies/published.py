"""Checkpoints in the layout lerobot publishes its policies in (`model.safetensors` under
lerobot's names, `config.json` with the input and output features, the pre/post-processor
pipelines with their statistics), written here at tiny sizes with random weights, as a user
has them on disk. test_pi0.py checks the same layout against lerobot's own writing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file
from safetensors.torch import save_file as save_torch_file

from embodied.policies.pretrained.pi0 import RENAMES, Pi0Config, Pi0Model, Pi05Config, resolve_architecture

# the tiny sizes, which a checkpoint's config.json cannot all name: `policy.vocab_size` is given
TINY = {"paligemma_variant": "tiny", "expert_variant": "tiny_expert", "vocab_size": 300}

# lerobot's LIBERO checkpoints: the agent view, then the wrist camera
LIBERO_LEROBOT_CAMERAS = ("observation.images.image", "observation.images.image2")


def save_lerobot_processors(
    folder: Path, features: dict[str, dict], norm_map: dict[str, str], stats: dict[str, np.ndarray]
) -> None:
    """The normaliser and unnormaliser steps as lerobot's pipelines save them."""
    folder.mkdir(parents=True, exist_ok=True)
    for pipeline, step in (
        ("policy_preprocessor", "normalizer_processor"),
        ("policy_postprocessor", "unnormalizer_processor"),
    ):
        state_file = f"{pipeline}_step_0_{step}.safetensors"
        save_file(stats, str(folder / state_file))
        config = {"eps": 1e-8, "features": features, "norm_map": norm_map}
        entry = {"registry_name": step, "config": config, "state_file": state_file}
        (folder / f"{pipeline}.json").write_text(json.dumps({"name": pipeline, "steps": [entry]}))


def dataset_like_statistics(width: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Statistics far from zero mean and unit spread, so a mode mixed up shows."""
    mean, std = rng.normal(0, 0.5, width), rng.uniform(0.2, 0.6, width)
    return {
        "mean": mean,
        "std": std,
        "min": mean - 3 * std,
        "max": mean + 3 * std,
        "q01": mean - 2.3 * std,
        "q99": mean + 2.4 * std,
    }


def save_published_pi0(
    folder: Path,
    model: str,
    cameras: tuple[str, ...],
    state_dim: int,
    action_dim: int,
    horizon: int = 4,
    seed: int = 0,
) -> Path:
    """A tiny pi0 / pi0.5 with random weights, saved as lerobot publishes a fine-tuned one:
    reading `cameras` (in that order), a `state_dim` state, writing `action_dim` actions, with
    its normalisation statistics in the model's published mode (pi0 mean/std, pi0.5
    quantiles)."""
    torch.manual_seed(seed)
    cfg = resolve_architecture((Pi05Config if model == "pi05" else Pi0Config)(**TINY, horizon=horizon))
    weights = {}
    for key, tensor in Pi0Model(cfg).state_dict().items():
        for ours, theirs in ((new, old) for old, new in RENAMES):
            if key.startswith(ours):
                key = theirs + key[len(ours) :]
                break
        weights[f"model.{key}"] = tensor.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_torch_file(weights, str(folder / "model.safetensors"))
    features = {name: {"type": "VISUAL", "shape": [3, 256, 256]} for name in cameras}
    features["observation.state"] = {"type": "STATE", "shape": [state_dim]}
    output = {"action": {"type": "ACTION", "shape": [action_dim]}}
    mode = "QUANTILES" if model == "pi05" else "MEAN_STD"
    (folder / "config.json").write_text(
        json.dumps(
            {
                "type": model,
                "input_features": features,
                "output_features": output,
                "paligemma_variant": cfg.paligemma_variant,
                "action_expert_variant": cfg.expert_variant,
                "max_state_dim": cfg.max_state_dim,
                "max_action_dim": cfg.max_action_dim,
                "chunk_size": horizon,
                "n_action_steps": horizon,
                "empty_cameras": 0,
                "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode},
            }
        )
    )
    rng = np.random.default_rng(seed)
    stats = {
        f"{feature}.{name}": values.astype(np.float32)
        for feature, width in (("observation.state", state_dim), ("action", action_dim))
        for name, values in dataset_like_statistics(width, rng).items()
    }
    save_lerobot_processors(
        folder, {**features, **output}, {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode}, stats
    )
    return folder
