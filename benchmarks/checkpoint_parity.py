"""A pretrained checkpoint acting as trained: the whole pipeline (raw state and camera frames
-> normalisation from the checkpoint's processors -> the model -> unnormalised env actions)
against lerobot 0.4.4's own (its preprocessor, image preprocessing, `sample_actions` and
postprocessor), per model (pi0, pi0.5, SmolVLA) and normalisation mode, at tiny size with random
weights on the CPU; and SmolVLA at its published size (chunk parity, time, peak memory).

lerobot builds each model, saves it with `save_pretrained` and its processors in every mode
(tests/policies/pi0_reference.py under .venv-pi0ref, the harness the tests use); this
project's `policy=pi0` / `pi05` loads each folder and acts on the same raw inputs with the same
noise. The measuring is tests/policies/pipeline_parity.py, the parity tests' own harness, run
as `python -m` from the repository root; this script records and reports. The real-size side
(the model alone: chunk parity, load time, peak memory against lerobot's) is
benchmarks/pi0_real_size.py; its latest figures are quoted beside these.

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

from harness.reports import save_with_summary
from harness.runs import RESULTS

ROOT = Path(__file__).resolve().parents[1]

RUNS_FILE = RESULTS / "checkpoint_parity" / "runs.json"  # per-model, per-mode differences (committed)
GOAL = 1e-5  # the largest action difference accepted, as in the tests
COMMAND = "python benchmarks/checkpoint_parity.py"


def run() -> None:
    with tempfile.TemporaryDirectory() as folder:
        measured = Path(folder) / "measured.json"
        # the parity tests' own harness measures, in the tests package that `-m` finds from the root
        done = subprocess.run([sys.executable, "-m", "tests.policies.pipeline_parity", str(measured)], cwd=ROOT)
        if done.returncode != 0:
            sys.exit(f"the measurement failed (exit {done.returncode}); its output is above")
        measured = json.loads(measured.read_text())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    RUNS_FILE.parent.mkdir(parents=True, exist_ok=True)
    RUNS_FILE.write_text(
        json.dumps(
            {
                "commit": commit.stdout.strip(),
                "machine": f"{platform.machine()}, {_cores()} CPU cores, no GPU",
                "command": COMMAND,
                **measured,
            },
            indent=2,
        )
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
    if sys.argv[1:2] != ["report"]:
        run()
    report()


if __name__ == "__main__":
    main()
