"""pi0 and pi0.5 at their real sizes (PaliGemma 2B with SigLIP So400m/14 at 224 px, the 300M
action expert), side by side with lerobot 0.4.4's implementation: one action chunk (50
actions, 10 denoising steps, 2 cameras, batch 1) from the same random weights, inputs and
noise, on this machine's CPU.

For each model, lerobot builds the model with random weights and saves it with its own
`save_pretrained` (tests/policies/pi0_reference.py, under .venv-pi0ref); then this project's
`policy=pi0` / `pi05` loads that checkpoint in a process of its own. Each side times its
chunk `--runs` times and reports its peak memory; the chunks are compared.

    python benchmarks/pi0_real_size.py              # both models (about 13 GB of disk each, freed after)
    python benchmarks/pi0_real_size.py report       # rebuild the summary from the runs"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from harness.reports import save_with_summary
from harness.runs import RESULTS, RUNS

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_PYTHON = ROOT / ".venv-pi0ref" / "bin" / "python"
MODELS = {"pi0": 48, "pi05": 200}  # instruction tokens: pi0.5's prompt carries the state
CAMERAS, IMAGE_SIZE, HORIZON, STEPS, PADDED = 2, 224, 50, 10, 32


def make_inputs(work: Path, model: str, runs: int) -> None:
    generator = np.random.default_rng(0)
    tokens = MODELS[model]
    spec = {
        "model": model,
        "sizes": "real",
        "vocab_size": 257152,
        "image_size": IMAGE_SIZE,
        "cameras": [f"camera{i}" for i in range(CAMERAS)],
        "horizon": HORIZON,
        "max_state_dim": PADDED,
        "max_action_dim": PADDED,
        "steps": STEPS,
        "tokens": tokens,
        "seed": 0,
        "timed_runs": runs,
    }
    inputs = {
        f"image{i}": generator.uniform(-1, 1, (1, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32) for i in range(CAMERAS)
    }
    inputs.update({f"image_mask{i}": np.ones(1, dtype=bool) for i in range(CAMERAS)})
    inputs["tokens"] = generator.integers(1, 257152, (1, tokens))
    inputs["token_mask"] = np.ones((1, tokens), dtype=bool)
    inputs["state"] = generator.standard_normal((1, PADDED)).astype(np.float32)
    inputs["noise"] = generator.standard_normal((1, HORIZON, PADDED)).astype(np.float32)
    (work / "spec.json").write_text(json.dumps(spec))
    np.savez(work / "inputs.npz", **inputs)


def ours(work: Path, model: str, runs: int) -> None:
    """This project's side, in a process of its own: load lerobot's checkpoint, time the chunk."""
    import torch

    from embodied.policies.pretrained.pi0 import Pi0Config, Pi0Model, Pi05Config, load_checkpoint, resolve_architecture

    config = (Pi0Config if model == "pi0" else Pi05Config)(
        pretrained=str(work / "checkpoint"), horizon=HORIZON, denoise_steps=STEPS
    )
    config = resolve_architecture(config)
    started = time.perf_counter()
    with torch.device("meta"):
        network = Pi0Model(config)
    load_checkpoint(network, config.pretrained)
    load_s = time.perf_counter() - started
    t = {name: torch.from_numpy(value) for name, value in np.load(work / "inputs.npz").items()}
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        with torch.inference_mode():
            actions = network.sample(
                [t[f"image{i}"] for i in range(CAMERAS)],
                [t[f"image_mask{i}"] for i in range(CAMERAS)],
                t["tokens"],
                t["token_mask"],
                t["state"],
                t["noise"],
                STEPS,
            )
        seconds.append(time.perf_counter() - started)
    np.savez(
        work / "ours.npz",
        actions=actions.numpy(),
        seconds=np.array(seconds),
        load_s=load_s,
        peak_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        parameters=sum(p.numel() for p in network.parameters()),
    )


def run(models: list[str], runs: int) -> None:
    if not REFERENCE_PYTHON.exists():
        sys.exit(f"{REFERENCE_PYTHON} is missing: bash tools/setup.sh test makes it")
    for model in models:
        work = RUNS / f"{model}-real-size"
        if (work / "ours.npz").is_file():
            continue
        work.mkdir(parents=True, exist_ok=True)
        make_inputs(work, model, runs)
        print(f"[{model}] lerobot: random weights, save_pretrained, {runs} chunks", flush=True)
        subprocess.run(
            [str(REFERENCE_PYTHON), str(ROOT / "tests" / "policies" / "pi0_reference.py"), str(work)],
            check=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        print(f"[{model}] ours: load the checkpoint, {runs} chunks", flush=True)
        subprocess.run([sys.executable, __file__, "ours", str(work), model, str(runs)], check=True, cwd=ROOT)
        shutil.rmtree(work / "checkpoint")  # about 13 GB


def report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {}
    for model in MODELS:
        work = RUNS / f"{model}-real-size"
        if not (work / "ours.npz").is_file():
            continue
        theirs, mine = np.load(work / "reference.npz"), np.load(work / "ours.npz")
        # the first chunk pays for one-time allocations on both sides: the later ones are timed
        rows[model] = {
            "parameters": {"ours": int(mine["parameters"]), "lerobot": int(theirs["parameters"])},
            "chunk_s": {
                "ours": float(np.median(mine["seconds"][1:])),
                "lerobot": float(np.median(theirs["seconds"][1:])),
            },
            "peak_gb": {"ours": float(mine["peak_bytes"]) / 1e9, "lerobot": float(theirs["peak_bytes"]) / 1e9},
            "checkpoint_load_s": float(mine["load_s"]),
            "max_abs_difference": float(np.abs(mine["actions"] - theirs["actions"]).max()),
            "max_abs_action": float(np.abs(theirs["actions"]).max()),
        }
    if not rows:
        sys.exit("no runs yet: python benchmarks/pi0_real_size.py")
    summary = {
        "setup": {
            "cameras": [f"camera{i}" for i in range(CAMERAS)],
            "image_size": IMAGE_SIZE,
            "horizon": HORIZON,
            "denoising_steps": STEPS,
            "batch": 1,
            "device": "cpu (2 cores)",
        },
        "models": rows,
    }
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    width = 0.38
    for offset, side in ((-width / 2, "ours"), (width / 2, "lerobot")):
        ax.bar(
            [i + offset for i in range(len(rows))], [row["chunk_s"][side] for row in rows.values()], width, label=side
        )
    ax.set_xticks(range(len(rows)), list(rows))
    ax.set_ylabel("seconds per action chunk")
    ax.set_title("Real-size pi0 / pi0.5, 2 CPU cores, batch 1")
    ax.legend(loc="lower right")
    save_with_summary(fig, RESULTS, "pi0_real_size", summary)
    lines = [
        "# pi0 and pi0.5 at real size: this project's model against lerobot 0.4.4's",
        "",
        f"One action chunk ({HORIZON} actions, {STEPS} denoising steps, {CAMERAS} cameras at {IMAGE_SIZE} px, "
        f"batch 1) from the same random weights, inputs and noise: lerobot builds and saves the model "
        f"(`save_pretrained`), this project's `policy=pi0` / `pi05` loads that checkpoint. Median of the "
        f"timed chunks after the first; 2-core CPU machine; each side in its own process.",
        "",
        "| model | parameters (ours / lerobot) | chunk s (ours / lerobot) | lerobot / ours | peak GB (ours / lerobot) "
        "| checkpoint load s | largest difference (largest action) |",
        "| --- | --- | --- | ---: | --- | ---: | --- |",
    ]
    for model, row in rows.items():
        lines.append(
            f"| {model} | {row['parameters']['ours'] / 1e9:.3f} B / {row['parameters']['lerobot'] / 1e9:.3f} B "
            f"| {row['chunk_s']['ours']:.1f} / {row['chunk_s']['lerobot']:.1f} "
            f"| {row['chunk_s']['lerobot'] / row['chunk_s']['ours']:.2f}x "
            f"| {row['peak_gb']['ours']:.1f} / {row['peak_gb']['lerobot']:.1f} "
            f"| {row['checkpoint_load_s']:.0f} | {row['max_abs_difference']:.1e} ({row['max_abs_action']:.2f}) |"
        )
    lines += [
        "",
        "lerobot's count includes the action expert's language-model head (the difference), which "
        "predicts tokens, never actions; this project does not build it.",
        "",
        "![chunk time](pi0_real_size.png)",
        "",
    ]
    (RESULTS / "pi0_real_size.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["ours"]:
        ours(Path(args[1]), args[2], int(args[3]))
    elif args[:1] == ["report"]:
        report()
    else:
        run(list(MODELS), runs=3)
        report()


if __name__ == "__main__":
    main()
