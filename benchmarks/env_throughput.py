"""Env-side throughput of the ManiSkill CPU backend: envs in this process vs spread over
worker processes, measured side by side in one script (random actions, no policy).

    python benchmarks/env_throughput.py [--task PushCube-v1] [--num-envs 16] [--steps 200]

Writes benchmarks/results/env_throughput.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from plots import bar_chart  # sibling module: the scripts run as `python benchmarks/<name>.py`

from embodied.sim.maniskill import make_maniskill
from embodied.sim.maniskill_common import ManiSkillConfig

RESULTS = Path(__file__).resolve().parent / "results"


def measure(task: str, num_envs: int, workers: int, steps: int) -> float:
    env = make_maniskill(ManiSkillConfig(task=task, num_envs=num_envs, num_workers=workers), seed=0)
    try:
        env.reset()
        rng = np.random.default_rng(0)
        actions = rng.uniform(-1, 1, size=(steps, num_envs, 1, env.spec.action_dim)).astype(np.float32)
        env.step(actions[0])  # warm-up
        started = time.perf_counter()
        executed = sum(int(env.step(a).executed_steps.sum()) for a in actions)
        return executed / (time.perf_counter() - started)
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="PushCube-v1")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200, help="chunk steps per measurement")
    parser.add_argument("--workers", type=int, nargs="*", default=[0, 1, 2])
    args = parser.parse_args()

    rates = {w: measure(args.task, args.num_envs, w, args.steps) for w in args.workers}
    base = rates[args.workers[0]]
    result = {
        "task": args.task,
        "num_envs": args.num_envs,
        "cpu_cores": os.cpu_count(),
        "env_steps_per_s": {str(w): r for w, r in rates.items()},
        "ratio_to_in_process": {str(w): r / base for w, r in rates.items()},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "env_throughput.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# Env throughput: {args.task}, {args.num_envs} envs, physx_cpu, {os.cpu_count()} cores",
        "",
        "| worker processes | env steps/s | ratio to in-process |",
        "| ---: | ---: | ---: |",
    ]
    lines += [f"| {w or 'none (in-process)'} | {r:.0f} | {r / base:.2f} |" for w, r in rates.items()]
    (RESULTS / "env_throughput.md").write_text("\n".join(lines) + "\n\n![throughput](env_throughput.png)\n")

    bar_chart(
        RESULTS / "env_throughput.png",
        {str(w): r for w, r in rates.items()},
        "env steps / s",
        f"{args.task}, {args.num_envs} envs",
        xlabel="worker processes (0 = in-process)",
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
