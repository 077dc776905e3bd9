"""A pretrained checkpoint acting as trained: the whole pipeline (raw state and camera frames
-> normalisation from the checkpoint's processors -> the model -> unnormalised env actions)
against lerobot 0.4.4's own (its preprocessor, image preprocessing, `sample_actions` and
postprocessor), per model (pi0, pi0.5, SmolVLA) and normalisation mode, at tiny size with random
weights on the CPU; and SmolVLA at its published size (chunk parity, time, peak memory).

lerobot builds each model, saves it with `save_pretrained` and its processors in every mode
(tests/policies/pi0_reference.py under .venv-pi0ref, the harness the tests use); this
project's `policy=pi0` / `pi05` loads each folder and acts on the same raw inputs with the same
noise. The real-size side (the model alone: chunk parity, load time, peak memory against
lerobot's) is benchmarks/pi0_real_size.py; its latest figures are quoted beside these.

    python benchmarks/checkpoint_parity.py          # run (about three minutes) and report
    python benchmarks/checkpoint_parity.py report   # rebuild the report from the committed runs"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from harness.reports import save_with_summary
from harness.runs import RESULTS

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # for tests.policies; after the installed package, never before it

RUNS_FILE = RESULTS / "checkpoint_parity" / "runs.json"  # per-model, per-mode differences (committed)
GOAL = 1e-5  # the largest action difference accepted, as in the tests
COMMAND = "python benchmarks/checkpoint_parity.py"


def run() -> None:
    from tests.policies import smolvla_parity
    from tests.policies.pi0_parity import PROCESSOR_MODES, REFERENCE_PYTHON, pipeline_actions, run_reference

    if not REFERENCE_PYTHON.exists():
        sys.exit(f"{REFERENCE_PYTHON} is missing: bash tools/setup.sh test makes it")

    runs = []
    with tempfile.TemporaryDirectory() as folder:
        work = smolvla_parity.run_reference(Path(folder))
        for mode in smolvla_parity.NORM_MAPS:
            ours, reference = smolvla_parity.pipeline_actions(work, mode, work / "ours" / mode)
            runs.append(difference("smolvla", mode, ours, reference))
    for model, modes in PROCESSOR_MODES.items():
        with tempfile.TemporaryDirectory() as folder:
            work = run_reference(Path(folder), model)
            for mode in modes:
                ours, reference = pipeline_actions(work, model, mode, work / "ours" / mode)
                runs.append(difference(model, mode, ours, reference))
    published = smolvla_published(REFERENCE_PYTHON)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    RUNS_FILE.parent.mkdir(parents=True, exist_ok=True)
    RUNS_FILE.write_text(
        json.dumps(
            {
                "commit": commit.stdout.strip(),
                "machine": f"{platform.machine()}, {_cores()} CPU cores, no GPU",
                "command": COMMAND,
                "runs": runs,
                "smolvla_published_size": published,
            },
            indent=2,
        )
    )


def difference(model: str, mode: str, ours: np.ndarray, reference: np.ndarray) -> dict:
    row = {
        "model": model,
        "mode": mode,
        "size": "tiny",
        "max_abs_difference": float(np.abs(ours - reference).max()),
        "max_abs_action": float(np.abs(reference).max()),
    }
    print(f"[{model} {mode}] largest difference {row['max_abs_difference']:.1e}", flush=True)
    return row


def smolvla_published(reference_python: Path, runs: int = 3) -> dict:
    """SmolVLA at its published size, random weights: lerobot builds, saves and times one chunk
    (50 actions, 10 steps, two 512 px cameras, batch 3); ours loads the files and times the
    same chunk, each side in its own process."""
    from tests.policies import smolvla_parity

    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        print("[smolvla published size] lerobot: random weights, save_pretrained, chunks", flush=True)
        smolvla_parity.run_reference(work, smolvla_parity.PUBLISHED_SPEC, processors=False, timed_runs=runs)
        print("[smolvla published size] ours: load the checkpoint, chunks", flush=True)
        subprocess.run([sys.executable, __file__, "smolvla-ours", str(work), str(runs)], check=True, cwd=ROOT)
        theirs, mine = np.load(work / "reference.npz"), np.load(work / "ours.npz")
        return {
            "parameters": {"ours": int(mine["parameters"]), "lerobot": int(theirs["parameters"])},
            "chunk_s": {
                "ours": float(np.median(mine["seconds"][1:])),
                "lerobot": float(np.median(theirs["seconds"][1:])),
            },
            "peak_gb": {"ours": float(mine["peak_bytes"]) / 1e9, "lerobot": float(theirs["peak_bytes"]) / 1e9},
            "checkpoint_load_s": {"ours": float(mine["load_s"]), "lerobot": float(theirs["load_s"])},
            "max_abs_difference": float(np.abs(mine["actions"] - theirs["actions"]).max()),
            "max_abs_action": float(np.abs(theirs["actions"]).max()),
        }


def smolvla_ours(work: Path, runs: int) -> None:
    """Our side of the published-size run, in a process of its own."""
    import resource
    import time

    import torch

    from embodied.policies.pretrained.smolvla_model import resize_with_pad

    started = time.perf_counter()
    from tests.policies.smolvla_parity import PUBLISHED_SPEC, loaded

    model = loaded(work, PUBLISHED_SPEC).model
    load_s = time.perf_counter() - started
    t = {name: torch.from_numpy(value) for name, value in np.load(work / "inputs.npz").items()}
    images = [resize_with_pad(t[f"frame{i}"], PUBLISHED_SPEC["image_size"]) for i in range(2)]
    present = [torch.ones(len(t["state"]), dtype=torch.bool)] * 2
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        with torch.inference_mode():
            actions = model.sample(
                images, present, t["tokens"], t["token_mask"], t["state"], t["noise"], PUBLISHED_SPEC["steps"]
            )
        seconds.append(time.perf_counter() - started)
    np.savez(
        work / "ours.npz",
        actions=actions.numpy(),
        seconds=np.array(seconds),
        load_s=load_s,
        peak_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        parameters=sum(p.numel() for p in model.parameters()),
    )


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not RUNS_FILE.is_file():
        sys.exit(f"no runs yet: {COMMAND}")
    recorded = json.loads(RUNS_FILE.read_text())
    runs = recorded["runs"]
    real_size_file = RESULTS / "pi0_real_size.json"
    real_size = json.loads(real_size_file.read_text())["models"] if real_size_file.is_file() else {}
    summary = {**{k: recorded[k] for k in ("commit", "machine", "command")}, "goal": GOAL, "runs": runs}
    summary["meets_goal"] = all(r["max_abs_difference"] <= GOAL for r in runs)
    summary["real_size_model_only"] = real_size
    summary["smolvla_published_size"] = recorded.get("smolvla_published_size")

    fig, ax = plt.subplots(figsize=(10, 3.4))
    labels = [f"{r['model']}\n{r['mode']}" for r in runs]
    ax.bar(range(len(runs)), [r["max_abs_difference"] for r in runs], color="tab:blue")
    ax.axhline(GOAL, color="tab:red", linestyle="--", label=f"goal {GOAL:.0e}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(runs)), labels, fontsize=7)
    ax.set_ylabel("largest |action difference|")
    ax.set_title("Raw inputs to env actions: ours vs lerobot 0.4.4 (tiny, CPU)", fontsize=9)
    ax.legend(loc="upper right")
    save_with_summary(fig, RESULTS, "checkpoint_parity", summary)

    lines = [
        "# A checkpoint acting as trained: the whole pipeline against lerobot 0.4.4's",
        "",
        f"Commit {recorded['commit']}, {recorded['machine']}; `{recorded['command']}` "
        f"(`report` rebuilds this page from `checkpoint_parity/runs.json`).",
        "",
        "Raw state and camera frames through this project's `policy=pi0` / `pi05` / `smolvla`, loading a "
        "checkpoint lerobot saved with its processors, against lerobot's preprocessor, image preprocessing, "
        "`sample_actions` and postprocessor on the same inputs and noise. Tiny models with random weights; "
        "statistics far from zero mean and unit spread, so a mode mixed up shows. pi0 and pi0.5 see square "
        "40 px frames resized to 32 (lerobot 0.4.4 pads a non-square frame for pi0 with -3 where openpi and "
        "this project pad with -1: docs/flow-rl.md); SmolVLA sees a square and a letterboxed camera. The "
        "prompt is written by this project on both sides (lerobot's prompt steps need the published "
        "tokenizers, which are not here); pi0.5's state reaches its model through that prompt.",
        "",
        f"Goal: every difference <= {GOAL:.0e}. **{'Met' if summary['meets_goal'] else 'Missed'}.**",
        "",
        "| model | normalisation (lerobot) | largest difference | largest action |",
        "| --- | --- | ---: | ---: |",
    ]
    lines += [
        f"| {r['model']} | {r['mode']} | {r['max_abs_difference']:.1e} | {r['max_abs_action']:.2f} |" for r in runs
    ]
    lines += ["", "![differences](checkpoint_parity.png)", ""]
    if real_size:
        lines += [
            "At real size (PaliGemma 2B + the 300M expert, random weights, the model alone; "
            "[pi0_real_size.md](pi0_real_size.md), from its own run):",
            "",
            "| model | largest difference | checkpoint load s (ours) | peak GB (ours / lerobot) |",
            "| --- | ---: | ---: | --- |",
        ]
        lines += [
            f"| {model} | {row['max_abs_difference']:.1e} | {row['checkpoint_load_s']:.0f} "
            f"| {row['peak_gb']['ours']:.1f} / {row['peak_gb']['lerobot']:.1f} |"
            for model, row in real_size.items()
        ]
        lines.append("")
    published = recorded.get("smolvla_published_size")
    if published:
        lines += [
            "SmolVLA at its published size (SmolVLM2-500M's first 16 layers and the 0.75-wide expert, random "
            "weights that lerobot saved; one chunk of 50 actions in 10 steps from two 512 px cameras, batch 3; "
            "median of the timed chunks after the first; each side in its own process), measured in this run:",
            "",
            "| parameters (ours / lerobot) | chunk s (ours / lerobot) | peak GB (ours / lerobot) "
            "| checkpoint load s (ours / lerobot) | largest difference (largest action) |",
            "| --- | --- | --- | --- | --- |",
            f"| {published['parameters']['ours'] / 1e6:.0f} M / {published['parameters']['lerobot'] / 1e6:.0f} M "
            f"| {published['chunk_s']['ours']:.1f} / {published['chunk_s']['lerobot']:.1f} "
            f"| {published['peak_gb']['ours']:.1f} / {published['peak_gb']['lerobot']:.1f} "
            f"| {published['checkpoint_load_s']['ours']:.1f} / {published['checkpoint_load_s']['lerobot']:.1f} "
            f"| {published['max_abs_difference']:.1e} ({published['max_abs_action']:.2f}) |",
            "",
            "lerobot's count includes SmolVLM's language-model head, which predicts tokens, never actions; this "
            "project does not build it.",
            "",
        ]
    lines += [
        "Not measured here: the statistics at real size (they do not depend on the model's size) and the "
        "published LIBERO success rates, which need the published weights and a GPU (docs/evaluation.md gives "
        "the command).",
        "",
    ]
    (RESULTS / "checkpoint_parity.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    if sys.argv[1:2] == ["smolvla-ours"]:
        return smolvla_ours(Path(sys.argv[2]), int(sys.argv[3]))
    if sys.argv[1:2] != ["report"]:
        run()
    report()


if __name__ == "__main__":
    main()
