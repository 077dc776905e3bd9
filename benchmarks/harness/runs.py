"""Training runs and their records. A benchmark run is an ordinary `embodied train` run in
RUNS/<name> (not committed); its record, results/runs/<name>.json (committed), keeps its curve,
wall time and provenance, and what its study adds (arm, seed, held-out results), so that the
reports rebuild from a clone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from harness.reports import provenance

BENCHMARKS = Path(__file__).resolve().parents[1]
RESULTS = BENCHMARKS / "results"
RUNS = BENCHMARKS / "runs"  # full run directories (ignored by git)


def resumable(run_dir: Path) -> bool:
    """Whether an earlier run in `run_dir` can be continued. One killed before its first
    checkpoint left nothing to continue, and `embodied train` refuses a folder that holds a
    run: the folder is removed, so the run starts over."""
    if (run_dir / "checkpoints" / "latest").is_file():
        return True
    if run_dir.exists():
        print(f"no checkpoint in {run_dir}: starting that run over", flush=True)
        shutil.rmtree(run_dir)
    return False


def train(name: str, overrides: list[str], steps: int, resume_with: tuple[str, ...] = ()) -> None:
    """Train run `name`, or continue it from its last checkpoint with `resume_with` added (e.g.
    `env_resume=fresh` where the simulator cannot replay the episodes in progress)."""
    run_dir = RUNS / name
    fresh = not resumable(run_dir)
    command = [
        sys.executable,
        "-m",
        "embodied.cli",
        "train",
        *overrides,
        f"run_dir={run_dir}",
        f"total_env_steps={steps}",
        "eval_episodes=0",
        "logger.progress_bar=false",
    ]
    if not fresh:  # continue an interrupted benchmark run
        command = [
            sys.executable,
            "-m",
            "embodied.cli",
            "train",
            f"resume={run_dir}",
            *resume_with,
            f"total_env_steps={steps}",
            "eval_episodes=0",
            "logger.progress_bar=false",
        ]
    print(f"[{name}] {' '.join(command[3:])}", flush=True)
    where = provenance(Path(sys.argv[0]).name)  # the code that trains, not what is checked out when it ends
    subprocess.run(command, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    collect(name, fresh=fresh, where=where)


def record_path(name: str) -> Path:
    """Where a run's record (compact JSON, committed) lives: results/runs/<name>.json."""
    return RESULTS / "runs" / f"{name}.json"


def load_records(folder: str) -> list[dict]:
    """Every record under results/runs/<folder>/, by name."""
    return [json.loads(p.read_text()) for p in sorted((RESULTS / "runs" / folder).glob("*.json"))]


def learner_curve(name: str, every: int) -> list[dict]:
    """The actor's entropy and temperature every `every` env steps of a run, from its metrics."""
    metrics = [json.loads(line) for line in (RUNS / name / "metrics.jsonl").read_text().splitlines()]
    return [
        {"env_steps": m["env_steps"], "entropy": m["train/entropy"], "temperature": m["train/temperature"]}
        for m in metrics
        if "train/entropy" in m and m["env_steps"] % every == 0
    ]


def annotate(name: str, **fields: object) -> None:
    """Add `fields` to a run's committed record."""
    record = json.loads(record_path(name).read_text())
    record.update(fields)
    record_path(name).write_text(json.dumps(record))


def has_heldout(name: str) -> bool:
    """Whether the run's per-run JSON holds its held-out evaluation (its work is done)."""
    path = record_path(name)
    return path.is_file() and "heldout" in json.loads(path.read_text())


TRAINING_POINTS = 200  # training-log points a run record keeps for its plot; every evaluation is kept
CURVE_KEYS = (
    "env_steps",
    "rollout/episode_return",
    "rollout/success_rate",
    "eval/success_rate",
    "eval/episode_return",
    "train/env_steps_per_s",
    "replay/intervened",  # share of the collected steps an operator drove (HIL runs)
)


def compact(lines: list[dict]) -> dict:
    """A run's log as a record keeps it: every evaluation, the last line and about
    TRAINING_POINTS training lines for the plot, and the statistics of the whole log that the
    reports need (an off-policy run logs every few env steps, thousands of lines)."""
    curve = [{k: line[k] for k in CURVE_KEYS if k in line} for line in lines]
    stride = max(1, len(curve) // TRAINING_POINTS)
    kept = [
        p
        for i, p in enumerate(curve)
        if i % stride == 0 or i == len(curve) - 1 or any(k.startswith("eval/") for k in p)
    ]
    rates = [p["train/env_steps_per_s"] for p in curve if "train/env_steps_per_s" in p]
    shares = [p["replay/intervened"] for p in curve if "replay/intervened" in p]
    return {
        "curve": kept,
        "env_steps_per_s_median": float(np.median(rates)) if rates else None,
        "intervened_mean": float(np.mean(shares)) if shares else 0.0,  # the operator's share, mean over the log
    }


def collect(name: str, fresh: bool = False, where: dict | None = None) -> None:
    """Curve and wall time of a finished run: the trainer's own clock, which a resume carries
    on (else from its config file to its last checkpoint, which a resume rewrites). `fresh`: the
    run was trained from its first step just now, so an earlier record of the same name (another
    training of it) says nothing about where it ran or how it did held out. `where`: the
    provenance taken when the training started (default: now)."""
    run_dir = RUNS / name
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    elapsed = [line["train/elapsed_s"] for line in lines if "train/elapsed_s" in line]
    wall = (
        elapsed[-1]
        if elapsed
        else (run_dir / "checkpoints" / "latest").stat().st_mtime - (run_dir / "config.yaml").stat().st_mtime
    )
    out = record_path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    earlier = json.loads(out.read_text()) if out.exists() and not fresh else {}
    record = {"name": name, "wall_time_s": wall, **compact(lines)}
    # re-collected: keep where the run ran, its held-out evaluation and what studies added
    # (arm, seed, overrides, ...); else the study that was started (sys.argv[0]), not this module
    where = earlier.get("provenance") or where or provenance(Path(sys.argv[0]).name)
    out.write_text(json.dumps({**earlier, **record, "provenance": where}))


def load(name: str) -> dict | None:
    """A run's record, or None where it has none."""
    path = record_path(name)
    return json.loads(path.read_text()) if path.exists() else None
