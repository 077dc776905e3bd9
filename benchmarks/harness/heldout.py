"""Held-out evaluation: a final policy (or a checkpoint) on HELDOUT_EPISODES episodes of an
evaluation seed that no run, tuning or periodic evaluation draws from, greedy and sampled.
The studies' reported figures come from it; their tuning never sees it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.reports import provenance
from harness.runs import RUNS, annotate

HELDOUT_SEED, HELDOUT_EPISODES = 900_001, 100  # an evaluation stream no run or tuning has drawn from


def heldout_eval(checkpoint: Path, output: Path, deterministic: bool) -> tuple[dict, str]:
    """A policy (a run's latest checkpoint, or a checkpoint) on the held-out episodes: the
    report's overall figures, and the command."""
    command = [
        sys.executable,
        "-m",
        "embodied.cli",
        "eval",
        f"checkpoint={checkpoint}",
        f"episodes={HELDOUT_EPISODES}",
        f"seed={HELDOUT_SEED}",
        f"deterministic={str(deterministic).lower()}",
        f"output={output}",
        "progress_bar=false",
    ]
    print(f"[{checkpoint.name}] {' '.join(command[3:])}", flush=True)
    subprocess.run(command, check=True)
    return json.loads((output / "report.json").read_text())["overall"], " ".join(command[3:])


def heldout_results(run_dir: Path) -> tuple[dict, str]:
    """A run's final policy on the held-out episodes, greedy and sampled, with the commit that
    evaluated it (the run may have been trained at an earlier one), and the command."""
    results: dict = {"commit": provenance(Path(sys.argv[0]).name)["commit"]}
    for mode in ("deterministic", "sampled"):
        overall, command = heldout_eval(run_dir, run_dir / "eval" / f"heldout-{mode}", mode == "deterministic")
        kept = ("episodes", "successes", "success_rate", "success_ci95", "mean_return")
        results[mode] = {k: overall[k] for k in kept}
    return results, command


def evaluate_heldout(name: str, **fields: object) -> None:
    """The run's held-out results, and any other `fields`, into its per-run JSON."""
    results, command = heldout_results(RUNS / name)
    annotate(name, **fields, heldout={"seed": HELDOUT_SEED, "command": command, **results})
