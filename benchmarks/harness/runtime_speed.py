"""A training run's env steps/s under `runtime=local` and `runtime=procs`, side by side: the
actor and the learner in one process, or the rollout acting in its own while the learner
updates (as HIL-SERL runs its actor and learner). hil.py's `speed` command measures its pixel
arm with it.

Each run trains from scratch with periodic evaluation and checkpoints off; its rate is taken
over its last three quarters (start-up and the demos' encoding left out). The runtimes take
turns run by run, and the report gives medians and ratios to local. `runtime=local` keeps one
core busy with one torch thread, `runtime=procs` two."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.reports import bar_chart, provenance, provenance_line, write_report

RUNTIMES = {
    "local": [],
    # the rollout acts on weights at most one update old, so it need not wait for each update
    "procs, lag 1": ["runtime=procs", "runtime.max_policy_lag=1"],
}


def run_rate(overrides: list[str], steps: int) -> float:
    """Env steps/s of one run over its last three quarters of iterations."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [
            sys.executable,
            "-m",
            "embodied.cli",
            "train",
            *overrides,
            "eval_every=0",
            "checkpoint_every=0",
            "eval_episodes=0",
            f"total_env_steps={steps}",
            "logger.progress_bar=false",
            f"run_dir={run_dir}",
        ]
        finished = subprocess.run(command, capture_output=True, text=True)
        if finished.returncode != 0:
            raise SystemExit(f"the run failed:\n{finished.stderr[-3000:]}")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        rows = [row for row in rows if "train/elapsed_s" in row]
    first, last = rows[len(rows) // 4], rows[-1]
    return (last["env_steps"] - first["env_steps"]) / (last["train/elapsed_s"] - first["train/elapsed_s"])


def measure(script: str, arm: str, overrides: list[str], steps: int, rounds: int) -> dict:
    """Each runtime's rates, the runtimes taking turns `rounds` times, with the result's provenance."""
    rates: dict[str, list[float]] = {name: [] for name in RUNTIMES}
    for _ in range(rounds):
        for name, runtime in RUNTIMES.items():
            rates[name].append(run_rate([*overrides, *runtime], steps))
            print(f"{name}: {rates[name][-1]:.2f} env steps/s", flush=True)
    return {
        **provenance(script),
        "arm": arm,
        "steps": steps,
        "rounds": rounds,
        "runtimes": RUNTIMES,
        "env_steps_per_s": rates,
    }


def report(result: dict, results: Path, name: str, setting: str) -> None:
    """<results>/<name>.{md,png} from a `measure` result; `setting` says what the arm trains on."""
    medians = {runtime: statistics.median(rates) for runtime, rates in result["env_steps_per_s"].items()}
    local = medians["local"]
    lines = [
        f"# A run's speed: actor and learner in one process or two ({result['arm']})",
        "",
        provenance_line(result),
        "",
        f"The `{result['arm']}` arm ({setting}), {result['steps']:,} env steps a run from scratch, evaluation "
        f"and checkpoints off, rates over each run's last three quarters; the runtimes took turns, "
        f"{result['rounds']} round(s). `runtime=local` keeps one core busy, `runtime=procs` two.",
        *(["", result["note"]] if result.get("note") else []),
        "",
        "| runtime | env steps/s (each run) | median | x local | 50k env steps take |",
        "| --- | --- | ---: | ---: | ---: |",
        *(
            f"| {runtime} | {', '.join(f'{r:.2f}' for r in rates)} | {medians[runtime]:.2f} | "
            f"{medians[runtime] / local:.2f}x | {50_000 / medians[runtime] / 60:.0f} min |"
            for runtime, rates in result["env_steps_per_s"].items()
        ),
    ]
    write_report(results, name, [*lines, "", f"![env steps per second]({name}.png)"])
    bar_chart(results / f"{name}.png", medians, "env steps / s", f"{result['arm']}: median of each runtime")
    print("\n".join(lines))
