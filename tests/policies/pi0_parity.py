"""lerobot 0.4.4's pi0 and pi0.5 as the reference: the tiny checkpoints it saves (with its
processors in each normalisation mode) and what its whole pipeline makes of raw inputs,
beside what this project's policy makes of them. Shared by tests/policies/test_pi0.py and
benchmarks/checkpoint_parity.py; the reference side runs pi0_reference.py under
.venv-pi0ref."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from embodied.core.types import EnvSpec, Observation
from embodied.policies.normalization import StatisticsNormalizer
from embodied.policies.pretrained.pi0 import (
    GEMMA_SIZES,
    TINY_SIGLIP,
    Pi0Config,
    Pi0Policy,
    Pi05Config,
    prompts,
    resize_with_pad,
    resolve_architecture,
)
from embodied.policies.pretrained.statistics import lerobot_feature
from embodied.policies.vla.backbones import ByteTokenizer

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_PYTHON = Path(os.environ.get("EMBODIED_PI0_REFERENCE_VENV", ROOT / ".venv-pi0ref")) / "bin" / "python"
TINY = dict(paligemma_variant="tiny", expert_variant="tiny_expert", vocab_size=300)
# The reference checkpoint's sizes: room for ManiSkill's state and actions in the PPO test.
REFERENCE = dict(TINY, max_state_dim=64, max_action_dim=8, horizon=5, denoise_steps=4)
SPEC = EnvSpec(
    state_dim=5,
    action_dim=3,
    action_low=(-1.0,) * 3,
    action_high=(2.0,) * 3,
    image_shapes={"wrist": (24, 32, 3), "base": (32, 32, 3)},
)


CONFIGS = {"pi0": Pi0Config, "pi05": Pi05Config}
PIPELINE_INSTRUCTIONS = ["push the cube", "pick it up", "stack"]
PIPELINE_SEED = 4  # the generator our policy acts with, whose first draw is the initial noise
# Square frames, of another size than the model's: resized, never padded. lerobot 0.4.4 pads a
# non-square frame with -1 while its pixels are still in [0, 1], which becomes -3 in the
# model's [-1, 1]; openpi (and this project) pad with black, -1 (see docs/flow-rl.md).
PIPELINE_FRAME = (40, 40, 3)


# lerobot's normalisation modes, as norm_maps of the saved processors; each fixture's first is
# what its checkpoint carries (lerobot's defaults: pi0 MEAN_STD, pi0.5 QUANTILES).
NORM_MAPS = {
    "mean_std": {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
    "quantiles": {"STATE": "QUANTILES", "ACTION": "QUANTILES"},
    "min_max": {"STATE": "MIN_MAX", "ACTION": "MIN_MAX"},
    "quantile10": {"STATE": "QUANTILE10", "ACTION": "QUANTILE10"},
    "identity_state": {"STATE": "IDENTITY", "ACTION": "QUANTILES"},
    "per_step": {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"},  # action statistics per horizon step
}
PROCESSOR_MODES = {"pi0": list(NORM_MAPS), "pi05": ["quantiles", *(name for name in NORM_MAPS if name != "quantiles")]}


def dataset_statistics(generator: torch.Generator, per_step: int = 0) -> dict[str, dict[str, list]]:
    """Statistics as a dataset's, far from zero mean and unit spread, so a mode mixed up or
    left out shows; `per_step`: action statistics of shape (per_step, A)."""
    stats = {}
    for feature, shape in (
        ("observation.state", (SPEC.state_dim,)),
        ("action", (per_step, SPEC.action_dim) if per_step else (SPEC.action_dim,)),
    ):
        mean = torch.randn(shape, generator=generator) * 2
        std = torch.rand(shape, generator=generator) + 0.5
        spread = {"min": -3.0, "max": 3.2, "q01": -2.3, "q99": 2.4, "q10": -1.3, "q90": 1.2}
        stats[feature] = {"mean": mean.tolist(), "std": std.tolist()} | {
            name: (mean + z * std).tolist() for name, z in spread.items()
        }
    return stats


def run_reference(work: Path, model: str) -> Path:
    """lerobot's PI0Policy / PI05Policy at the tiny sizes, random weights, saved by its
    save_pretrained; with the inputs given to its sample_actions and the chunk that came out."""
    assert REFERENCE_PYTHON.exists(), (
        f"the reference virtualenv is missing ({REFERENCE_PYTHON}); tools/setup.sh test makes it"
    )
    cfg = resolve_architecture(CONFIGS[model](**REFERENCE))
    spec = {
        "model": model,
        "vlm": asdict(GEMMA_SIZES["tiny"]),
        "expert": asdict(GEMMA_SIZES["tiny_expert"]),
        "vision": asdict(TINY_SIGLIP),
        "vocab_size": cfg.vocab_size,
        "image_size": 32,
        "cameras": sorted(SPEC.image_shapes),  # image0, image1: the env's cameras by name
        "horizon": cfg.horizon,
        "max_state_dim": cfg.max_state_dim,
        "max_action_dim": cfg.max_action_dim,
        "steps": cfg.denoise_steps,
        "tokens": 6,
        "tokenizer_max_length": cfg.max_instruction_tokens,  # the pipeline's prompts
        "seed": 3,
    }
    generator = torch.Generator().manual_seed(0)
    batch = 3
    frames = torch.randint(0, 256, (batch, 24, 32, 3), dtype=torch.uint8, generator=generator)
    inputs = {
        "image0": resize_with_pad(frames, 32).numpy(),  # letterboxed: also checks the padding rows
        "image1": (torch.rand(batch, 3, 32, 32, generator=generator) * 2 - 1).numpy(),
        "image_mask0": np.ones(batch, dtype=bool),
        "image_mask1": np.array([True, False, True]),  # a camera missing on one row
        "tokens": torch.randint(1, cfg.vocab_size, (batch, spec["tokens"]), generator=generator).numpy(),
        "token_mask": np.array([[1] * 6, [1] * 3 + [0] * 3, [1] * 5 + [0]], dtype=bool),
        "state": torch.randn(batch, cfg.max_state_dim, generator=generator).numpy(),
        "noise": torch.randn(batch, cfg.horizon, cfg.max_action_dim, generator=generator).numpy(),
    }
    modes = PROCESSOR_MODES[model]
    spec["processors"] = {
        "state_dim": SPEC.state_dim,
        "action_dim": SPEC.action_dim,
        "norm_maps": {name: {"VISUAL": "IDENTITY", **NORM_MAPS[name]} for name in modes},
        "stats": {
            name: dataset_statistics(generator, per_step=cfg.horizon if name == "per_step" else 0) for name in modes
        },
    }
    inputs["raw_state"] = (torch.randn(batch, SPEC.state_dim, generator=generator) * 3 + 1).numpy()
    inputs["raw_actions"] = torch.randn(batch, cfg.horizon, SPEC.action_dim, generator=generator).numpy()
    # the whole pipeline: raw frames, the prompt our policy writes, the noise its sampler draws
    for i in range(len(spec["cameras"])):
        inputs[f"frame{i}"] = torch.randint(0, 256, (batch, *PIPELINE_FRAME), generator=generator).numpy()
        inputs[f"frame{i}"] = inputs[f"frame{i}"].astype(np.uint8)
    tokens, token_mask = ByteTokenizer()(prompts(PIPELINE_INSTRUCTIONS, None), cfg.max_instruction_tokens)
    inputs["pipeline_tokens"], inputs["pipeline_token_mask"] = tokens.numpy(), token_mask.bool().numpy()
    if model == "pi05":  # its prompt carries the state as each mode's statistics normalise it
        for name in modes:
            state = torch.from_numpy(inputs["raw_state"])
            mode = NORM_MAPS[name]["STATE"]
            if mode != "IDENTITY":
                stats = spec["processors"]["stats"][name]["observation.state"]
                state = StatisticsNormalizer(lerobot_feature(mode, {k: np.array(v) for k, v in stats.items()}, ""))(
                    state
                )
            unit_state = torch.nn.functional.pad(state, (0, cfg.max_state_dim - SPEC.state_dim))
            tokens, token_mask = ByteTokenizer()(prompts(PIPELINE_INSTRUCTIONS, unit_state), cfg.max_instruction_tokens)
            inputs[f"pipeline_tokens_{name}"] = tokens.numpy()
            inputs[f"pipeline_token_mask_{name}"] = token_mask.bool().numpy()
    noise = torch.randn(batch, cfg.horizon * cfg.max_action_dim, generator=torch.Generator().manual_seed(PIPELINE_SEED))
    inputs["pipeline_noise"] = noise.view(batch, cfg.horizon, cfg.max_action_dim).numpy()
    (work / "spec.json").write_text(json.dumps(spec))
    np.savez(work / "inputs.npz", **inputs)
    subprocess.run(
        [str(REFERENCE_PYTHON), str(Path(__file__).with_name("pi0_reference.py")), str(work)],
        check=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return work


def pipeline_actions(work: Path, model: str, mode: str, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ours, lerobot's) env actions from the pipeline inputs of `work` (run_reference's),
    with the checkpoint's weights and the `mode` processors copied into `folder`: raw state
    and frames -> our policy -> env actions, and lerobot's preprocessor -> its image
    preprocessing and sample_actions -> its postprocessor."""
    inputs = np.load(work / "inputs.npz")
    shutil.copytree(work / "processors" / mode, folder)
    for name in ("model.safetensors", "config.json"):
        shutil.copy(work / "checkpoint" / name, folder / name)
    wide = EnvSpec(
        state_dim=5, action_dim=3, action_low=(-50.0,) * 3, action_high=(50.0,) * 3, image_shapes=SPEC.image_shapes
    )
    observation = Observation(
        state=torch.from_numpy(inputs["raw_state"]),
        images={camera: torch.from_numpy(inputs[f"frame{i}"]) for i, camera in enumerate(sorted(SPEC.image_shapes))},
        instruction=PIPELINE_INSTRUCTIONS,
    )
    config = CONFIGS[model](**REFERENCE, sampler="ode", chunk_size=REFERENCE["horizon"], pretrained=str(folder))
    with torch.no_grad():
        chunk = Pi0Policy(config, wide).act(
            observation, deterministic=True, generator=torch.Generator().manual_seed(PIPELINE_SEED)
        )
    return chunk.actions.numpy(), np.load(folder / "reference.npz")["pipeline_actions"]
