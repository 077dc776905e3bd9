"""Pipelined vs sequential rollout, side by side in one script (no learning).

The policy is an MLP sized so that one inference for one worker group takes about as long as
that group's env step, the regime where overlapping them pays most.

    python benchmarks/pipeline.py [--task PushCube-v1] [--num-envs 16] [--workers 2] [--steps 60]

Writes benchmarks/results/pipeline.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from embodied.runtime.rollout import Rollout
from policies.mlp import MLPGaussianPolicy, MLPPolicyConfig
from plots import bar_chart  # sibling module: the scripts run as `python benchmarks/<name>.py`
from sim.maniskill import ManiSkillConfig, make_maniskill

RESULTS = Path(__file__).resolve().parent / "results"


def seconds_per_call(function, repeats: int = 20) -> float:
    function()
    started = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="PushCube-v1")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    env = make_maniskill(ManiSkillConfig(task=args.task, num_envs=args.num_envs, num_workers=args.workers), seed=0)
    try:
        observation = env.reset()
        rows = env.stage_rows(0)
        zeros = np.zeros((rows.stop - rows.start, 1, env.spec.action_dim), np.float32)

        def group_step() -> None:
            env.send_stage_step(0, zeros)
            env.receive_stage_step(0)

        step_s = seconds_per_call(group_step)
        group_observation = observation.select(rows).to_torch()
        hidden, inference_s = 64, 0.0
        for hidden in (64, 256, 512, 1024, 1536, 2048, 3072, 4096):
            policy = MLPGaussianPolicy(MLPPolicyConfig(actor_hidden=[hidden] * 3, critic_hidden=[hidden] * 3), env.spec)
            with torch.no_grad():
                inference_s = seconds_per_call(lambda: policy.act(group_observation))
            if inference_s >= step_s:
                break
        rates = {}
        for pipeline in (False, True, False, True):  # interleaved, best of two each
            rollout = Rollout(env, policy, torch.device("cpu"), pipeline=pipeline)
            rollout.start()
            rollout.collect(3)
            started = time.perf_counter()
            _, _, env_steps = rollout.collect(args.steps)
            rate = env_steps / (time.perf_counter() - started)
            key = "pipelined" if pipeline else "sequential"
            rates[key] = max(rates.get(key, 0.0), rate)
    finally:
        env.close()
    speedup = rates["pipelined"] / rates["sequential"]
    result = {"task": args.task, "num_envs": args.num_envs, "workers": args.workers, "cpu_cores": os.cpu_count(),
              "group_env_step_ms": step_s * 1e3, "group_inference_ms": inference_s * 1e3, "policy_hidden": hidden,
              "env_steps_per_s": rates, "speedup": speedup}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pipeline.json").write_text(json.dumps(result, indent=2))
    lines = [f"# Pipelined rollout: {args.task}, {args.num_envs} envs in {args.workers} worker groups, "
             f"{os.cpu_count()} cores", "",
             f"One group's env step {step_s * 1e3:.1f} ms; one group's inference {inference_s * 1e3:.1f} ms "
             f"(MLP {hidden}x3). Best of two interleaved runs of {args.steps} chunk steps each.", "",
             "| rollout | env steps/s |", "| --- | ---: |",
             f"| sequential | {rates['sequential']:.0f} |", f"| pipelined | {rates['pipelined']:.0f} |", "",
             f"Speed-up: **{speedup:.2f}x**."]
    (RESULTS / "pipeline.md").write_text("\n".join(lines) + "\n\n![pipeline](pipeline.png)\n")

    bar_chart(RESULTS / "pipeline.png", rates, "env steps / s", f"{args.task}: {speedup:.2f}x")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
