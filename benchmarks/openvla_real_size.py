"""OpenVLA-7B (`policy=openvla`) at its published architecture on a CUDA GPU, with random
weights loaded the way a user's checkpoint is: the model is built on the GPU, saved in the
published HF layout (bfloat16 safetensors, config.json, statistics), and loaded from that
folder with `policy.pretrained`. With LoRA (rank 32) and bfloat16 arithmetic, it measures:

- load: seconds from the folder to a model on the GPU;
- rollout: one `act` over 64 envs (one 224 px camera, LIBERO-length instructions), chunks per
  second, for OpenVLA's causal decoder (7 tokens) and OFT's parallel one (a chunk of 8 x 7);
- training: one GRPO step (`recompute`, the clipped loss, backward, AdamW over the adapters)
  on a minibatch, samples per second, and the peak GPU memory;
- `--fsdp`: the train CLI for 2 GRPO iterations on ManiSkill (rgb) with one learner rank
  unsharded, then FSDP over every GPU of the machine (two or more: ranks do not share a GPU),
  seconds per update and the devices' peak memory.

    python benchmarks/openvla_real_size.py [--fsdp]     # on a machine with a CUDA GPU
    python benchmarks/openvla_real_size.py --smoke      # tiny sizes on a CPU: checks the script

Writes openvla_real_size.json and .md into $OUT (or a temporary folder; --smoke never writes
to benchmarks/results)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from harness.device_memory import DeviceMemory
from harness.openvla_measure import SIZES, measure, save_random_checkpoint
from harness.reports import provenance, provenance_line

NAME = "openvla_real_size"


def train_cli(folder: Path, sharding: str, ranks: int, scratch: Path) -> dict[str, Any]:
    """Two GRPO iterations of the train CLI on ManiSkill rgb, the learner in processes of its own
    (`ranks` of them, one GPU each)."""
    run_dir = scratch / f"cli_{sharding}"
    command = [
        sys.executable, "-m", "embodied.cli", "train", "policy=openvla", f"policy.pretrained={folder}",
        "env.obs_mode=rgb", "env.control_mode=pd_ee_delta_pose", "env.num_envs=16",
        "algo=grpo", "algo.group_size=4", "algo.rollout_steps=8", "algo.success_band=[0.0,1.0]", "algo.outcome=return",
        "runtime=procs", f"runtime.learner_ranks={ranks}", f"runtime.learner_sharding={sharding}",
        "total_env_steps=256", "eval_episodes=0", "eval_every=0", "logger.progress_bar=false", f"run_dir={run_dir}",
    ]  # fmt: skip
    with DeviceMemory() as memory:
        # from the scratch folder: `-m embodied` run from the checkout's root could find its bare embodied/
        # folder before the installed package (on the GPU machine, the package is laid out elsewhere)
        result = subprocess.run(command, capture_output=True, text=True, cwd=scratch, timeout=1200)
    if result.returncode != 0:
        return {"sharding": sharding, "ranks": ranks, "error": result.stderr[-2000:]}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "train/iteration" in row]
    return {
        "sharding": sharding,
        "ranks": ranks,
        "iterations": len(rows),
        "seconds_per_update": (rows[-1]["train/elapsed_s"] - rows[0]["train/elapsed_s"]) / max(len(rows) - 1, 1),
        "device_peak_gb": memory.peak_gb,
    }


def sharding_runs(folder: Path, scratch: Path) -> list[dict[str, Any]]:
    """One learner rank unsharded, then FSDP over every GPU of the machine (it needs two or more:
    ranks do not share a GPU)."""
    gpus = torch.cuda.device_count()
    runs = [train_cli(folder, "replicate", 1, scratch)]
    if gpus >= 2:
        runs.append(train_cli(folder, "fsdp", gpus, scratch))
    else:
        runs.append(
            {"sharding": "fsdp", "ranks": gpus, "error": f"not run: FSDP needs 2 or more GPUs, this machine has {gpus}"}
        )
    return runs


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# OpenVLA-7B at its published architecture (random weights, LoRA, bfloat16)",
        "",
        provenance_line(results),
        "",
        f"Saving the published layout: {results['save_s']:.1f} s.",
        "",
        "| decoder | chunk | load (s) | rollout batch | chunks/s | GRPO minibatch | samples/s | peak GPU (GB) "
        "| trainable |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in results["runs"]:
        peak = "n/a" if row["peak_gb"] is None else f"{row['peak_gb']:.1f}"
        lines.append(
            f"| {row['decoder']} | {row['chunk_size']} | {row['load_s']:.1f} | {row['rollout_batch']} | "
            f"{row['chunks_per_s']:.2f} | {row['minibatch']} | {row['samples_per_s']:.2f} | {peak} | "
            f"{row['trainable'] / 1e6:.1f}M of {row['parameters'] / 1e9:.2f}B |"
        )
    for row in results.get("cli", []):
        lines.append("")
        if "error" in row:
            lines.append(
                f"train CLI, learner_sharding={row['sharding']} over {row['ranks']} ranks: {row['error'][-300:]}"
            )
        else:
            lines.append(
                f"train CLI, learner_sharding={row['sharding']} over {row['ranks']} ranks: "
                f"{row['seconds_per_update']:.1f} s per update, "
                f"device peak {row['device_peak_gb']} GB over {row['iterations']} iterations"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = sys.argv[1:]
    smoke = "--smoke" in args
    cuda = torch.cuda.is_available() and not smoke
    if not cuda and not smoke:
        sys.exit("no CUDA GPU here: run with --smoke to check the script on small sizes")
    device = torch.device("cuda" if cuda else "cpu")
    variant, size, batch, minibatch, runs = SIZES[smoke]
    out = Path(tempfile.mkdtemp()) if smoke else Path(os.environ.get("OUT") or tempfile.mkdtemp())
    results: dict[str, Any] = {
        **provenance("openvla_real_size.py"),
        "smoke": smoke,
    }
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "openvla"
        results["save_s"] = save_random_checkpoint(folder, variant, device, size)
        results["runs"] = []
        for decoder, chunk in (("causal", 1), ("parallel", 8)):
            results["runs"].append(measure(folder, decoder, chunk, batch, minibatch, runs, device, size))
            (out / f"{NAME}.json").write_text(json.dumps(results, indent=2))  # kept as it comes
        if "--fsdp" in args:
            results["cli"] = sharding_runs(folder, Path(scratch))
    (out / f"{NAME}.json").write_text(json.dumps(results, indent=2))
    (out / f"{NAME}.md").write_text(markdown(results))
    print(markdown(results))
    print(f"results: {out / f'{NAME}.json'}")


if __name__ == "__main__":
    main()
