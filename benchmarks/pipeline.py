"""Pipelined vs sequential rollout, side by side in one script (no learning).

Inference for one worker group is made to take about as long as that group's env step, the
regime where overlapping them pays most, in two ways:

    cpu inference      an MLP sized to that time, computing on the same cores as the envs
    off-cpu inference  a small MLP plus a wait that leaves the cores free, as inference on an
                       accelerator does (this machine may have none, so the wait stands in)

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


class OffCPUInference:
    """A policy whose every `act` lasts `latency_s` without holding a core for the rest."""

    def __init__(self, policy: MLPGaussianPolicy, latency_s: float):
        self.policy = policy
        self.latency_s = latency_s

    def act(self, observation, deterministic: bool = False):
        started = time.perf_counter()
        chunk = self.policy.act(observation, deterministic)
        time.sleep(max(0.0, self.latency_s - (time.perf_counter() - started)))
        return chunk

    def value(self, observation):
        return self.policy.value(observation)


def rollout_rates(env, policy, steps: int) -> dict[str, float]:
    rates: dict[str, float] = {}
    for pipeline in (False, True, False, True):  # interleaved, best of two each
        rollout = Rollout(env, policy, torch.device("cpu"), pipeline=pipeline)
        rollout.start()
        rollout.collect(3)
        started = time.perf_counter()
        _, _, env_steps = rollout.collect(steps)
        rate = env_steps / (time.perf_counter() - started)
        key = "pipelined" if pipeline else "sequential"
        rates[key] = max(rates.get(key, 0.0), rate)
    return rates


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
        cpu = rollout_rates(env, policy, args.steps)
        small = MLPGaussianPolicy(MLPPolicyConfig(actor_hidden=[64] * 2, critic_hidden=[64] * 2), env.spec)
        off_cpu = rollout_rates(env, OffCPUInference(small, step_s), args.steps)
    finally:
        env.close()
    speedups = {"cpu inference": cpu["pipelined"] / cpu["sequential"],
                "off-cpu inference": off_cpu["pipelined"] / off_cpu["sequential"]}
    rates = {"cpu inference": cpu, "off-cpu inference": off_cpu}
    result = {"task": args.task, "num_envs": args.num_envs, "workers": args.workers, "cpu_cores": os.cpu_count(),
              "group_env_step_ms": step_s * 1e3, "group_inference_ms": inference_s * 1e3, "policy_hidden": hidden,
              "env_steps_per_s": rates, "speedup": speedups}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pipeline.json").write_text(json.dumps(result, indent=2))
    lines = [f"# Pipelined rollout: {args.task}, {args.num_envs} envs in {args.workers} worker groups, "
             f"{os.cpu_count()} cores", "",
             f"One group's env step takes {step_s * 1e3:.1f} ms. CPU inference: an MLP {hidden}x3 taking "
             f"{inference_s * 1e3:.1f} ms per group on the same cores. Off-CPU inference: a {step_s * 1e3:.1f} ms "
             f"wait per group that leaves the cores to the envs, standing in for an accelerator. "
             f"Best of two interleaved runs of {args.steps} chunk steps each.", "",
             "| inference | sequential env steps/s | pipelined env steps/s | speed-up |", "| --- | ---: | ---: | ---: |",
             *(f"| {name} | {r['sequential']:.0f} | {r['pipelined']:.0f} | **{speedups[name]:.2f}x** |"
               for name, r in rates.items())]
    (RESULTS / "pipeline.md").write_text("\n".join(lines) + "\n\n![pipeline](pipeline.png)\n")

    bars = {f"{name}, {mode}": r[mode] for name, r in rates.items() for mode in ("sequential", "pipelined")}
    bar_chart(RESULTS / "pipeline.png", bars, "env steps / s",
              f"{args.task}: {speedups['off-cpu inference']:.2f}x off-CPU, {speedups['cpu inference']:.2f}x CPU")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
