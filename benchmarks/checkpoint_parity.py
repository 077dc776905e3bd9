"""A pretrained checkpoint acting as trained: the whole pipeline (raw state and camera frames
-> normalisation from the checkpoint's processors -> the model -> unnormalised env actions)
against lerobot 0.4.4's own (its preprocessor, image preprocessing, `sample_actions` and
postprocessor), per model and normalisation mode, at tiny size with random weights on the CPU.

lerobot builds each model, saves it with `save_pretrained` and its processors in every mode
(tests/policies/pi0_reference.py under .venv-pi0ref, the harness the tests use); this
project's `policy=pi0` / `pi05` loads each folder and acts on the same raw inputs with the same
noise. The real-size side (the model alone: chunk parity, load time, peak memory against
lerobot's) is benchmarks/pi0_real_size.py; its latest figures are quoted beside these.

    python benchmarks/checkpoint_parity.py          # run (about a minute) and report
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from plots import save_with_summary  # noqa: E402
from ppo import RESULTS  # noqa: E402

RUNS_FILE = RESULTS / "checkpoint_parity" / "runs.json"  # per-model, per-mode differences (committed)
GOAL = 1e-5  # the largest action difference accepted, as in the tests
COMMAND = "python benchmarks/checkpoint_parity.py"


def run() -> None:
    from tests.policies.pi0_parity import PROCESSOR_MODES, REFERENCE_PYTHON, pipeline_actions, run_reference

    if not REFERENCE_PYTHON.exists():
        sys.exit(f"{REFERENCE_PYTHON} is missing: bash tools/setup.sh test makes it")

    runs = []
    for model, modes in PROCESSOR_MODES.items():
        with tempfile.TemporaryDirectory() as folder:
            work = run_reference(Path(folder), model)
            for mode in modes:
                ours, reference = pipeline_actions(work, model, mode, work / "ours" / mode)
                runs.append(
                    {
                        "model": model,
                        "mode": mode,
                        "size": "tiny",
                        "max_abs_difference": float(np.abs(ours - reference).max()),
                        "max_abs_action": float(np.abs(reference).max()),
                    }
                )
                print(f"[{model} {mode}] largest difference {runs[-1]['max_abs_difference']:.1e}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    RUNS_FILE.parent.mkdir(parents=True, exist_ok=True)
    RUNS_FILE.write_text(
        json.dumps(
            {
                "commit": commit.stdout.strip(),
                "machine": f"{platform.machine()}, {_cores()} CPU cores, no GPU",
                "command": COMMAND,
                "runs": runs,
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

    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    labels = [f"{r['model']}\n{r['mode']}" for r in runs]
    ax.bar(range(len(runs)), [r["max_abs_difference"] for r in runs], color="tab:blue")
    ax.axhline(GOAL, color="tab:red", linestyle="--", label=f"goal {GOAL:.0e}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(runs)), labels, fontsize=7)
    ax.set_ylabel("largest |action difference|")
    ax.set_title("Raw inputs to env actions: ours vs lerobot 0.4.4 (tiny, CPU)")
    ax.legend(loc="upper right")
    save_with_summary(fig, RESULTS, "checkpoint_parity", summary)

    lines = [
        "# A checkpoint acting as trained: the whole pipeline against lerobot 0.4.4's",
        "",
        f"Commit {recorded['commit']}, {recorded['machine']}; `{recorded['command']}` "
        f"(`report` rebuilds this page from `checkpoint_parity/runs.json`).",
        "",
        "Raw state and camera frames (square, 40 px, resized to the model's 32) through this project's "
        "`policy=pi0` / `pi05`, loading a checkpoint lerobot saved with its processors, against lerobot's "
        "preprocessor, image preprocessing, `sample_actions` and postprocessor on the same inputs and noise. "
        "Tiny models with random weights; statistics far from zero mean and unit spread, so a mode mixed up "
        "shows. pi0.5's state reaches the model through its prompt, written by this project on both sides "
        "(lerobot's prompt step needs PaliGemma's tokenizer, which is not here).",
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
            "[pi0_real_size.md](pi0_real_size.md), measured at an earlier commit):",
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
    lines += [
        "Not measured here: SmolVLA (not built yet), the statistics at real size (they do not depend on the "
        "model's size), lerobot's load time at tiny size (dominated by imports), and the published LIBERO "
        "success rates, which need the published weights and a GPU (docs/evaluation.md gives the command).",
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
