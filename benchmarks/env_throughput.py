"""Env-side throughput of the ManiSkill CPU backend: envs in this process vs spread over
worker processes, measured side by side in one script (random actions, no policy).

The bound of W workers on C cores comes from stage times measured in the same run: each
worker steps N/W envs, which in this process take T(N/W) per chunk step against T(N) for all
N; with perfect overlap and free transport the workers take T(N/W) x ceil(W/C) per step, so
the ratio to in-process is at most T(N) / (T(N/W) x ceil(W/C)).

    python benchmarks/env_throughput.py [--task PushCube-v1] [--num-envs 16] [--steps 200]

Writes benchmarks/results/env_throughput.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from embodied.sim.maniskill import make_maniskill
from embodied.sim.maniskill_common import ManiSkillConfig
from harness.reports import bar_chart, provenance, provenance_line

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
    cores = os.cpu_count() or 1
    # a worker's share alone, in this process: the stage time each bound is built from
    share_rates = {w: measure(args.task, args.num_envs // w, 0, args.steps) for w in args.workers if w}
    step_time = lambda envs, rate: envs / rate  # noqa: E731  (seconds per chunk step)
    bounds = {
        w: step_time(args.num_envs, rates[0]) / (step_time(args.num_envs // w, rate) * math.ceil(w / cores))
        for w, rate in share_rates.items()
        if 0 in rates
    }
    result = {
        **provenance("env_throughput.py"),
        "task": args.task,
        "num_envs": args.num_envs,
        "cpu_cores": cores,
        "env_steps_per_s": {str(w): r for w, r in rates.items()},
        "ratio_to_in_process": {str(w): r / base for w, r in rates.items()},
        "share_alone_env_steps_per_s": {str(w): r for w, r in share_rates.items()},
        "bound": {str(w): b for w, b in bounds.items()},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "env_throughput.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# Env throughput: {args.task}, {args.num_envs} envs, physx_cpu, {cores} cores",
        "",
        provenance_line(result),
        "",
        "Bound: a worker's share of the envs stepped alone in this process, all workers overlapping "
        "perfectly over the cores with free transport (see the script's docstring).",
        "",
        "| worker processes | env steps/s | ratio to in-process | bound |",
        "| ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {w or 'none (in-process)'} | {r:.0f} | {r / base:.2f} | {f'{bounds[w]:.2f}' if w in bounds else '-'} |"
        for w, r in rates.items()
    ]
    beyond = [w for w in bounds if rates[w] / base > bounds[w]]
    if beyond:
        lines += ["", f"**Beyond the bound with {beyond} workers: a measurement to investigate, not a result.**"]
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
