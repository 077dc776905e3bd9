"""Env-side throughput of PickCube on Genesis's batched scene against ManiSkill's CPU backend,
measured side by side in one run (random actions, no policy, chunks of one action).

ManiSkill's PickCube-v1 (`pd_ee_delta_pos`, the control Genesis's PickCube copies, 16 envs over
2 worker processes as `env=maniskill_pickcube` trains; and with joint control, which leaves out
the end-effector controller's pose arithmetic) and Genesis's PickCube (`env=genesis_pickcube`: 64 envs in one
scene, one worker), then Genesis with its scene split over 2 workers and with 2 threads in one.
Each is built, warmed up for 5 chunk steps, then timed over `--steps` chunk steps; the rates
count executed env steps (control steps of 5 physics substeps on both).

    python benchmarks/genesis_throughput.py [--steps 100]
    python benchmarks/genesis_throughput.py report     # rebuild the Markdown and plot from the JSON

Goal (docs/genesis.md): Genesis at 64 envs >= 10x ManiSkill's stepping of the same task (its
end-effector control) on the same machine; the ratios to joint control are given beside.
Writes benchmarks/results/genesis_throughput.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from harness.reports import bar_chart, provenance, provenance_line

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "genesis_throughput"
GOAL = 10.0  # Genesis at 64 envs over ManiSkill's CPU stepping
WARMUP = 5
# label -> (simulator, config overrides)
ARMS = {
    "ManiSkill PickCube-v1, 16 envs, 2 workers": ("maniskill", {"num_envs": 16, "num_workers": 2}),
    # without the end-effector controller's pose arithmetic, which is most of ManiSkill's step here
    "ManiSkill PickCube-v1, joint control, 16 envs, 2 workers": (
        "maniskill",
        {"num_envs": 16, "num_workers": 2, "control_mode": "pd_joint_delta_pos"},
    ),
    "Genesis PickCube, 64 envs, 1 worker": ("genesis", {"num_envs": 64}),
    "Genesis PickCube, 64 envs, 2 workers": ("genesis", {"num_envs": 64, "num_workers": 2}),
    "Genesis PickCube, 64 envs, 1 worker, 2 threads": ("genesis", {"num_envs": 64, "threads": 2}),
}


def build(simulator: str, overrides: dict):
    if simulator == "maniskill":
        from embodied.sim.maniskill import make_maniskill
        from embodied.sim.maniskill_common import ManiSkillConfig

        return make_maniskill(
            ManiSkillConfig(**{"task": "PickCube-v1", "control_mode": "pd_ee_delta_pos", **overrides}), seed=0
        )
    from embodied.sim.genesis import GenesisConfig, make_genesis

    return make_genesis(GenesisConfig(**overrides), seed=0)


def measure(simulator: str, overrides: dict, steps: int) -> dict:
    started = time.perf_counter()
    env = build(simulator, overrides)
    built = time.perf_counter() - started
    try:
        env.reset()
        rng = np.random.default_rng(0)
        shape = (WARMUP + steps, env.num_envs, 1, env.spec.action_dim)
        actions = rng.uniform(-1, 1, size=shape).astype(np.float32)
        for chunk in actions[:WARMUP]:
            env.step(chunk)
        started = time.perf_counter()
        executed = sum(int(env.step(chunk).executed_steps.sum()) for chunk in actions[WARMUP:])
        return {"env_steps_per_s": executed / (time.perf_counter() - started), "build_s": built}
    finally:
        env.close()


def report() -> None:
    result = json.loads((RESULTS / f"{NAME}.json").read_text())
    arms = result["arms"]
    base = next(iter(arms.values()))["env_steps_per_s"]
    lines = [
        "# PickCube env throughput: Genesis's batched scene against ManiSkill's CPU backend",
        "",
        provenance_line(result),
        "",
        f"{result['steps']} chunk steps of one random action after {WARMUP} to warm up, "
        f"{result['cpu_cores']} cores. Goal: Genesis at 64 envs >= {GOAL:.0f}x ManiSkill.",
        "",
        "| configuration | env steps/s | ratio to ManiSkill | ratio to ManiSkill, joint control | built in (s) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    joint = next((arm["env_steps_per_s"] for label, arm in arms.items() if "joint control" in label), None)
    for label, arm in arms.items():
        rate = arm["env_steps_per_s"]
        to_joint = f"{rate / joint:.2f}" if joint else "-"
        lines.append(f"| {label} | {rate:.0f} | {rate / base:.2f} | {to_joint} | {arm['build_s']:.0f} |")
    best = max(arm["env_steps_per_s"] for label, arm in arms.items() if label.startswith("Genesis")) / base
    verdict = "met" if best >= GOAL else "**not met**"
    lines += ["", f"Best Genesis configuration: {best:.2f}x ManiSkill; the goal ({GOAL:.0f}x) is {verdict}."]
    (RESULTS / f"{NAME}.md").write_text("\n".join(lines) + f"\n\n![throughput]({NAME}.png)\n")
    bar_chart(
        RESULTS / f"{NAME}.png",
        {label.replace("PickCube", "").replace(", ", "\n", 1): arm["env_steps_per_s"] for label, arm in arms.items()},
        "env steps / s",
        "PickCube, random actions",
    )
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["measure", "report"], default="measure")
    parser.add_argument("--steps", type=int, default=100, help="timed chunk steps per configuration")
    args = parser.parse_args()
    if args.command == "measure":
        import os

        arms = {label: measure(simulator, overrides, args.steps) for label, (simulator, overrides) in ARMS.items()}
        result = {**provenance("genesis_throughput.py"), "steps": args.steps, "cpu_cores": os.cpu_count(), "arms": arms}
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{NAME}.json").write_text(json.dumps(result, indent=2))
    report()


if __name__ == "__main__":
    main()
