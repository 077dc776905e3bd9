"""LIBERO evaluation throughput (episodes/hour) with N env workers vs 1, side by side.

Runs `embodied eval suite=...` (the real harness: env workers under .venv-libero, trial k
from init state k, trials logged) on a few tasks of one suite with an MLP policy on proprio
state, trained for one iteration: it fails, so every episode runs to the suite's step limit,
the worst case for throughput. Raw env stepping with the two standard 128 px cameras is
measured beside it, since a vision policy's evaluation pays for rendering, and so is an
episode's reset on the scene the worker compiled once against robosuite's compile on every
reset, taken in turns on one env.

    python benchmarks/libero_eval.py [--suite libero_goal] [--tasks 2] [--trials 4] [--workers 1 2]

Writes benchmarks/results/libero_eval.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from harness.reports import bar_chart, provenance, provenance_line

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def embodied(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "embodied.cli", *args],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def eval_rate(args: argparse.Namespace, checkpoint: Path, workers: int, output: Path) -> float:
    started = time.perf_counter()
    embodied(
        "eval",
        f"checkpoint={checkpoint}",
        f"suite={args.suite}",
        f"task_ids=[{','.join(map(str, range(args.tasks)))}]",
        f"trials={args.trials}",
        f"env={args.suite}",
        "env.cameras=[]",
        f"env.num_workers={workers}",
        f"env.num_envs={2 * workers}",
        "progress_bar=false",
        f"output={output}",
    )
    return args.tasks * args.trials / (time.perf_counter() - started) * 3600


def raw_camera_rate(args: argparse.Namespace, workers: int, steps: int = 60) -> float:
    from embodied.sim.libero import LiberoConfig, make_libero

    env = make_libero(LiberoConfig(suite=args.suite, task_ids=[0], num_envs=2 * workers, num_workers=workers), seed=0)
    try:
        env.reset()
        action = np.zeros((env.num_envs, 1, 7), np.float32)
        env.step(action)
        started = time.perf_counter()
        for _ in range(steps):
            env.step(action)
        return steps * env.num_envs / (time.perf_counter() - started)
    finally:
        env.close()


RESET_TIMES = """
import json, time
from robosuite.utils import binding_utils

compile_every_time = binding_utils.MjSim.from_xml_string
from embodied.sim.libero import SCENES, LiberoConfig, LiberoEnv

env = LiberoEnv(LiberoConfig(suite={suite!r}, task_ids=[0], cameras=[], settle_steps=0))
times = {{"reused": [], "compiled": []}}
for trial in range({resets}):
    for way, build in (("reused", SCENES.sim), ("compiled", compile_every_time)):
        binding_utils.MjSim.from_xml_string = build
        started = time.perf_counter()
        env.reset(trial)
        times[way].append(time.perf_counter() - started)
env.close()
print(json.dumps(times))
"""


def reset_seconds(args: argparse.Namespace, resets: int = 5) -> dict[str, float]:
    """Median seconds of an episode's reset, on the reused scene and compiled anew, in turns."""
    from embodied.sim.libero import LiberoConfig, libero_python

    found = subprocess.run(
        [libero_python(LiberoConfig()), "-c", RESET_TIMES.format(suite=args.suite, resets=resets)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "MUJOCO_GL": "egl"},
    )
    times = json.loads(found.stdout.strip().splitlines()[-1])
    return {way: float(np.median(values)) for way, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="libero_goal")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = Path(scratch) / "run"
        embodied(
            "train",
            f"env={args.suite}",
            "env.cameras=[]",
            "env.num_envs=2",
            "env.num_workers=1",
            "env.task_ids=[0]",
            "algo.rollout_steps=4",
            "algo.num_minibatches=2",
            "total_env_steps=8",
            "eval_episodes=0",
            "eval_every=0",
            "logger.progress_bar=false",
            f"run_dir={checkpoint}",
        )
        episodes_per_hour = {w: eval_rate(args, checkpoint, w, Path(scratch) / f"eval{w}") for w in args.workers}
    camera_steps = {w: raw_camera_rate(args, w) for w in args.workers}
    resets = reset_seconds(args)
    base = args.workers[0]
    result = {
        **provenance("libero_eval.py"),
        "suite": args.suite,
        "tasks": args.tasks,
        "trials": args.trials,
        "cpu_cores": os.cpu_count(),
        "episodes_per_hour_state_policy": episodes_per_hour,
        "camera_env_steps_per_s": camera_steps,
        "speedup": {w: episodes_per_hour[w] / episodes_per_hour[base] for w in args.workers},
        "reset_s": resets,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "libero_eval.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# LIBERO evaluation throughput: {args.suite}, {os.cpu_count()} cores",
        "",
        provenance_line(result),
        "",
        f"`embodied eval suite={args.suite}` on {args.tasks} tasks x {args.trials} trials, every episode to the "
        f"step limit (a failing state-only MLP), 2 envs per worker. Camera column: raw env stepping with "
        f"agentview + wrist at 128 px, no policy.",
        "",
        "| env workers | episodes / hour | vs 1 worker | env steps/s with 2 cameras |",
        "| ---: | ---: | ---: | ---: |",
        *(
            f"| {w} | {episodes_per_hour[w]:.0f} | {result['speedup'][w]:.2f}x | {camera_steps[w]:.1f} |"
            for w in args.workers
        ),
        "",
        f"An episode's reset (median of 5, in turns on one env, no cameras): {resets['reused']:.2f} s on the "
        f"scene the worker compiled once, {resets['compiled']:.2f} s compiling it anew as robosuite does "
        f"({resets['compiled'] / resets['reused']:.1f}x).",
    ]
    (RESULTS / "libero_eval.md").write_text("\n".join(lines) + "\n\n![libero eval](libero_eval.png)\n")
    bar_chart(
        RESULTS / "libero_eval.png",
        {f"{w} worker{'s' * (w > 1)}": episodes_per_hour[w] for w in args.workers},
        "episodes / hour",
        f"{args.suite} evaluation",
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
