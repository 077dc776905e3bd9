"""A pixel run's env steps/s with the actor and the learner in one process (`runtime=local`)
and in two (`runtime=procs`, the rollout acting while the learner updates), side by side.

    python benchmarks/actor_learner.py                      # hil.py's best pixel arm, 1,600 env steps a run
    python benchmarks/actor_learner.py --steps 800 --rounds 1
    python benchmarks/actor_learner.py report               # rebuild the Markdown and plot from the JSON

Each run trains `hil.py tune pixels-serl`'s arm (PickCube-v1 from 64 px, 4 envs, one torch
thread per process) from scratch with periodic evaluation and checkpoints off; its rate is
taken over its last three quarters (start-up and the demos' encoding left out). The runtimes
take turns run by run, `--rounds` times, and the report gives medians and ratios to local.
`runtime=local` keeps one core busy, `runtime=procs` two: on a 2-core machine it makes one run
faster, where two local runs side by side would use the same cores.
Writes benchmarks/results/actor_learner.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import hil

from harness.reports import bar_chart, provenance, provenance_line, write_report

RESULTS = Path(__file__).resolve().parent / "results"
ARM = "shifts-stall-corrections"
RUNTIMES = {
    "local": [],
    # HIL-SERL's actor and learner: the actor acts on weights at most one update old
    "procs, lag 1": ["runtime=procs", "runtime.max_policy_lag=1"],
}


def arm_overrides(arm: str) -> list[str]:
    return [*hil.PIXEL_COMMON, *hil.SERL_TEMPERATURE, *hil.TUNING_ARMS["pixels-serl"][arm]]


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


def report(result: dict) -> None:
    medians = {name: statistics.median(rates) for name, rates in result["env_steps_per_s"].items()}
    local = medians["local"]
    lines = [
        f"# A pixel run's speed: actor and learner in one process or two ({result['arm']})",
        "",
        provenance_line(result),
        "",
        f"hil.py's `{result['arm']}` arm (PickCube-v1 from 64 px, 4 envs, one torch thread per process), "
        f"{result['steps']:,} env steps a run from scratch, evaluation and checkpoints off, rates over each run's "
        f"last three quarters; the runtimes took turns, {result['rounds']} round(s). `runtime=local` keeps one core "
        "busy, `runtime=procs` two.",
        "",
        "| runtime | env steps/s (each run) | median | x local | 50k env steps take |",
        "| --- | --- | ---: | ---: | ---: |",
        *(
            f"| {name} | {', '.join(f'{r:.2f}' for r in rates)} | {medians[name]:.2f} | "
            f"{medians[name] / local:.2f}x | {50_000 / medians[name] / 60:.0f} min |"
            for name, rates in result["env_steps_per_s"].items()
        ),
    ]
    write_report(RESULTS, "actor_learner", [*lines, "", "![env steps per second](actor_learner.png)"])
    bar_chart(RESULTS / "actor_learner.png", medians, "env steps / s", f"{result['arm']}: median of each runtime")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["run", "report"], default="run")
    # arms on the study's own demos (the wrist-camera arms record theirs in `hil.py tune`)
    own_demos = [arm for arm, extra in hil.TUNING_ARMS["pixels-serl"].items() if not any("demos=" in o for o in extra)]
    parser.add_argument("--arm", default=ARM, choices=sorted(own_demos))
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.command == "report":
        report(json.loads((RESULTS / "actor_learner.json").read_text()))
        return
    hil.STUDIES["pixels-serl"].prepare()  # the 20 scripted pixel demos, recorded once
    rates: dict[str, list[float]] = {name: [] for name in RUNTIMES}
    for _ in range(args.rounds):
        for name, runtime in RUNTIMES.items():
            rates[name].append(run_rate([*arm_overrides(args.arm), *runtime], args.steps))
            print(f"{name}: {rates[name][-1]:.2f} env steps/s", flush=True)
    result = {
        **provenance("actor_learner.py"),
        "arm": args.arm,
        "steps": args.steps,
        "rounds": args.rounds,
        "runtimes": RUNTIMES,
        "env_steps_per_s": rates,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "actor_learner.json").write_text(json.dumps(result, indent=2))
    report(result)


if __name__ == "__main__":
    main()
