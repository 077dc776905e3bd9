"""lerobot 0.4.4's SmolVLA as the reference: the checkpoint it saves (with its processors in
each normalisation mode) and what its whole pipeline makes of raw inputs, beside what this
project's policy makes of them. Shared by tests/policies/test_smolvla.py and
benchmarks/checkpoint_parity.py; the reference side runs smolvla_reference.py under
.venv-pi0ref."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import torch

from embodied.core.types import EnvSpec, Observation
from embodied.policies.pretrained.smolvla import SmolVLAConfig, SmolVLAPolicy, SmolVLMPrompt, prompts
from tests.policies.checkpoints import save_word_tokenizer
from tests.policies.pi0_parity import NORM_MAPS, PIPELINE_SEED, REFERENCE_PYTHON, dataset_statistics

# lerobot's SmolVLA at test sizes: a 6-layer SmolVLM of which the first 4 are kept, an expert
# 0.75 as wide that attends jointly every second layer and cross-attends in between
TINY_SPEC = {
    "vision": {"width": 32, "depth": 2, "mlp_dim": 64, "num_heads": 2, "patch_size": 8},
    "text": {
        "width": 64,
        "depth": 6,
        "mlp_dim": 128,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
        "rms_eps": 1e-5,
    },
    "image_size": 32,
    "scale_factor": 2,
    "vocab_size": 300,
    "cameras": ["base", "wrist"],
    "num_vlm_layers": 4,
    "num_expert_layers": -1,
    "self_attn_every_n_layers": 2,
    "expert_width_multiplier": 0.75,
    "horizon": 5,
    "max_state_dim": 32,
    "max_action_dim": 32,
    "steps": 4,
    "tokens": 12,
    "state_dim": 5,
    "action_dim": 3,
    "seed": 3,
}
# SmolVLA as published (lerobot/smolvla_base): SmolVLM2-500M's first 16 layers, 50 actions,
# 10 denoising steps, 512 px images (the SmolVLM sizes as its config.json gives them)
PUBLISHED_SPEC = {
    **TINY_SPEC,
    "vision": {"width": 768, "depth": 12, "mlp_dim": 3072, "num_heads": 12, "patch_size": 16},
    "text": {
        "width": 960,
        "depth": 32,
        "mlp_dim": 2560,
        "num_heads": 15,
        "num_kv_heads": 5,
        "head_dim": 64,
        "rms_eps": 1e-5,
    },
    "image_size": 512,
    "scale_factor": 4,
    "vocab_size": 49280,
    "num_vlm_layers": 16,
    "horizon": 50,
    "steps": 10,
    "tokens": 48,
}
INSTRUCTIONS = ["push the cube", "pick it up", "stack"]
WORDS = ["[PAD]", "[UNK]", *sorted({word for text in INSTRUCTIONS for word in text.split()})]


def env_spec(spec: dict, bound: float = 50.0) -> EnvSpec:
    """The env the reference's inputs come from: a square camera and a letterboxed one."""
    size = spec["image_size"]
    return EnvSpec(
        state_dim=spec["state_dim"],
        action_dim=spec["action_dim"],
        action_low=(-bound,) * spec["action_dim"],
        action_high=(bound,) * spec["action_dim"],
        image_shapes={"base": (size, size, 3), "wrist": (size * 3 // 4, size, 3)},
    )


def run_reference(work: Path, spec: dict = TINY_SPEC, processors: bool = True, timed_runs: int = 1) -> Path:
    """lerobot's SmolVLAPolicy at `spec`'s sizes with random weights, saved by its
    save_pretrained, and the chunk its sample_actions made (`reference.npz`); beside it the
    SmolVLM folder it was built on, with a tokenizer. With `processors`, lerobot's pipelines in
    every normalisation mode and what the whole pipeline makes of raw inputs."""
    assert REFERENCE_PYTHON.exists(), f"the reference virtualenv is missing ({REFERENCE_PYTHON}); tools/setup.sh test"
    rng = np.random.default_rng(0)
    batch, horizon, padded, length = 3, spec["horizon"], spec["max_action_dim"], spec["tokens"]
    shapes = env_spec(spec).image_shapes
    inputs = {
        "frame0": rng.integers(0, 256, (batch, *shapes["base"]), dtype=np.uint8),
        "frame1": rng.integers(0, 256, (batch, *shapes["wrist"]), dtype=np.uint8),
        "tokens": rng.integers(1, spec["vocab_size"], (batch, length)),
        "token_mask": np.arange(length)[None] < np.array([[length], [length * 2 // 3], [length // 4]]),
        "state": rng.standard_normal((batch, spec["max_state_dim"])).astype(np.float32),
        "noise": rng.standard_normal((batch, horizon, padded)).astype(np.float32),
    }
    save_word_tokenizer(work / "smolvlm", WORDS)
    spec = {**spec, "timed_runs": timed_runs}
    if processors:
        # raw inputs, the prompt our policy writes with the VLM folder's tokenizer, and the
        # noise its sampler draws
        generator = torch.Generator().manual_seed(5)
        spec["processors"] = {
            "state_dim": spec["state_dim"],
            "action_dim": spec["action_dim"],
            "norm_maps": {name: {"VISUAL": "IDENTITY", **NORM_MAPS[name]} for name in NORM_MAPS},
            "stats": {
                name: dataset_statistics(generator, per_step=horizon if name == "per_step" else 0) for name in NORM_MAPS
            },
        }
        inputs["raw_state"] = (torch.randn(batch, spec["state_dim"], generator=generator) * 3 + 1).numpy()
        inputs["raw_actions"] = torch.randn(batch, horizon, spec["action_dim"], generator=generator).numpy()
        tokens, token_mask = SmolVLMPrompt(str(work / "smolvlm"))(prompts(INSTRUCTIONS), length)
        inputs["pipeline_tokens"], inputs["pipeline_token_mask"] = tokens.numpy(), token_mask.bool().numpy()
        noise = torch.randn(batch, horizon * padded, generator=torch.Generator().manual_seed(PIPELINE_SEED))
        inputs["pipeline_noise"] = noise.view(batch, horizon, padded).numpy()
    (work / "spec.json").write_text(json.dumps(spec))
    np.savez(work / "inputs.npz", **inputs)
    subprocess.run(
        [str(REFERENCE_PYTHON), str(Path(__file__).with_name("smolvla_reference.py")), str(work)],
        check=True,
        timeout=1800,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return work


def loaded(work: Path, spec: dict = TINY_SPEC, **overrides) -> SmolVLAPolicy:
    """Our policy on the reference's checkpoint, with this run's own statistics unless
    overridden."""
    values = {"pretrained": str(work / "checkpoint"), "vlm": str(work / "smolvlm"), "normalization": "running"}
    return SmolVLAPolicy(SmolVLAConfig(**{**values, **overrides}), env_spec(spec))


def pipeline_actions(work: Path, mode: str, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ours, lerobot's) env actions from the pipeline inputs, with the checkpoint's weights and
    the `mode` processors copied into `folder`."""
    inputs = np.load(work / "inputs.npz")
    shutil.copytree(work / "processors" / mode, folder)
    for name in ("model.safetensors", "config.json"):
        shutil.copy(work / "checkpoint" / name, folder / name)
    observation = Observation(
        state=torch.from_numpy(inputs["raw_state"]),
        images={"base": torch.from_numpy(inputs["frame0"]), "wrist": torch.from_numpy(inputs["frame1"])},
        instruction=INSTRUCTIONS,
    )
    spec = json.loads((work / "spec.json").read_text())
    policy = loaded(
        work, spec, pretrained=str(folder), normalization="checkpoint", sampler="ode", chunk_size=spec["horizon"]
    )
    with torch.no_grad():
        chunk = policy.act(observation, deterministic=True, generator=torch.Generator().manual_seed(PIPELINE_SEED))
    return chunk.actions.numpy(), np.load(folder / "reference.npz")["pipeline_actions"]
