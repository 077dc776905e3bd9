"""Pipelined vs sequential rollout, side by side in one script (no learning).

Inference for the whole batch is made to take about as long as one env step of the whole
batch, the regime where overlapping them pays most, in three ways:

    cpu inference      an MLP sized to that time, computing on the same cores as the envs
    off-cpu inference  a small MLP plus a wait proportional to the rows inferred, leaving the
                       cores to the envs, as a throughput-bound accelerator does (this machine
                       may have none, so the wait stands in for it)
    flat inference     a small MLP plus a wait of half an env step whatever the rows, leaving
                       the cores to the envs: a GPU's cost for small batches, where a stage's
                       inference costs as much as the whole batch's and each stage adds one

With the env workers in k stages (runtime.pipeline_stages, 2 unless --stages says otherwise;
the results committed before that option existed had one stage per worker) the pipeline can at
best turn (inference + step) into max(inference, stage step + inference / k), where a stage is
its workers' share of the envs: 1.33x for k=2 and 1.6x for k=4 if a stage alone steps as long
as the whole batch (the workers run in parallel), 2x in the limit. The bound of each row is
computed from its own stage times,
measured in the same run: the whole batch's step, one stage stepped alone (the mean over the
stages) and the whole batch's inference. A speed-up above its bound is a measurement to
investigate, not a result.

    python benchmarks/pipeline.py [--task PushCube-v1] [--num-envs 16] [--workers 2 4] [--steps 60] [--stages 2]

Writes benchmarks/results/pipeline.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig
from embodied.sim.maniskill import make_maniskill
from embodied.sim.maniskill_common import ManiSkillConfig
from harness.pipelining import STAGES, pipelining_bound, rollout_rates, seconds_per_call, stage_step
from harness.reports import bar_chart, provenance, provenance_line

RESULTS = Path(__file__).resolve().parent / "results"


class OffCPUInference:
    """A policy whose `act` lasts `seconds_per_call` plus `seconds_per_row` per observation
    row, without holding a core for the rest: in proportion to the rows (a throughput-bound
    accelerator) or flat (a GPU's small batches)."""

    def __init__(self, policy: MLPGaussianPolicy, seconds_per_row: float = 0.0, seconds_per_call: float = 0.0):
        self.policy = policy
        self.seconds_per_row = seconds_per_row
        self.seconds_per_call = seconds_per_call

    def act(self, observation, deterministic: bool = False, generator=None):
        started = time.perf_counter()
        chunk = self.policy.act(observation, deterministic, generator)
        latency = self.seconds_per_call + self.seconds_per_row * observation.state.shape[0]
        time.sleep(max(0.0, latency - (time.perf_counter() - started)))
        return chunk

    def value(self, observation):
        return self.policy.value(observation)


def cpu_policy_as_slow_as(seconds: float, observation, spec) -> tuple[MLPGaussianPolicy, int, float]:
    """The smallest MLP from a ladder whose inference on `observation` takes `seconds`."""
    for hidden in (64, 256, 512, 1024, 1536, 2048, 3072, 4096):
        policy = MLPGaussianPolicy(MLPPolicyConfig(actor_hidden=[hidden] * 3, critic_hidden=[hidden] * 3), spec)
        with torch.no_grad():
            inference_s = seconds_per_call(lambda policy=policy: policy.act(observation))
        if inference_s >= seconds:
            break
    return policy, hidden, inference_s


def measure(args: argparse.Namespace, workers: int) -> dict:
    env = make_maniskill(ManiSkillConfig(task=args.task, num_envs=args.num_envs, num_workers=workers), seed=0)
    try:
        observation = env.reset()
        zeros = np.zeros((args.num_envs, 1, env.spec.action_dim), np.float32)
        step_s = seconds_per_call(lambda: env.step(zeros))
        env.group_stages(args.stages)  # as the rollout groups them
        stages = env.num_stages
        stage_s = float(np.mean([seconds_per_call(lambda k=k: stage_step(env, k, zeros)) for k in range(stages)]))
        policy, hidden, inference_s = cpu_policy_as_slow_as(step_s, observation.to_torch(), env.spec)
        small = MLPGaussianPolicy(MLPPolicyConfig(actor_hidden=[64] * 2, critic_hidden=[64] * 2), env.spec)
        off_cpu = OffCPUInference(small, step_s / args.num_envs)
        flat = OffCPUInference(small, seconds_per_call=step_s / 2)  # the env's step about twice an inference
        one_stage = observation.select(env.stage_rows(0)).to_torch()
        with torch.no_grad():
            off_cpu_s = seconds_per_call(lambda: off_cpu.act(observation.to_torch()))
            flat_s = seconds_per_call(lambda: flat.act(observation.to_torch()))
            flat_stage_s = seconds_per_call(lambda: flat.act(one_stage))
        rates = {
            "cpu inference": rollout_rates(env, policy, args.steps, stages=args.stages),
            "off-cpu inference": rollout_rates(env, off_cpu, args.steps, stages=args.stages),
            "flat inference": rollout_rates(env, flat, args.steps, stages=args.stages),
        }
    finally:
        env.close()
    inference = {"cpu inference": inference_s, "off-cpu inference": off_cpu_s, "flat inference": flat_s}
    per_stage = {"flat inference": flat_stage_s}  # the others: their share of the whole batch's
    return {
        "workers": workers,
        "stages": stages,
        "env_step_ms": step_s * 1e3,
        "stage_step_ms": stage_s * 1e3,
        "cpu_policy_hidden": hidden,
        "inference_ms": {name: seconds * 1e3 for name, seconds in inference.items()},
        "env_steps_per_s": rates,
        "speedup": {name: r["pipelined"] / r["sequential"] for name, r in rates.items()},
        "flat_stage_inference_ms": flat_stage_s * 1e3,
        "bound": {
            name: pipelining_bound(step_s, stage_s, seconds, stages, per_stage.get(name))
            for name, seconds in inference.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="PushCube-v1")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--stages", type=int, default=STAGES, help="runtime.pipeline_stages: groups of env workers")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = [measure(args, workers) for workers in args.workers]
    result = {
        **provenance("pipeline.py"),
        "task": args.task,
        "num_envs": args.num_envs,
        "cpu_cores": os.cpu_count(),
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pipeline.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# Pipelined rollout: {args.task}, {args.num_envs} envs, {os.cpu_count()} cores",
        "",
        provenance_line(result),
        "",
        "Inference for the whole batch takes about one env step of the whole batch. CPU inference: an MLP "
        "sized to that, on the same cores as the envs. Off-CPU inference: a wait proportional to the rows, "
        "leaving the cores to the envs, standing in for an accelerator. Flat inference: a wait of half an env "
        "step whatever the rows (a GPU's small batches), so each stage adds a whole inference. Best of two "
        f"interleaved runs of {args.steps} chunk steps each; the bound is each row's own, from its stage times.",
        "",
        "| env workers | env step / one stage alone (ms) | inference | inference (ms) | sequential env steps/s "
        "| pipelined env steps/s | speed-up | bound |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    bars = {}
    beyond = []
    for run in runs:
        for name, rates in run["env_steps_per_s"].items():
            speedup, bound = run["speedup"][name], run["bound"][name]
            lines.append(
                f"| {run['workers']} | {run['env_step_ms']:.1f} / {run['stage_step_ms']:.1f} | {name} | "
                f"{run['inference_ms'][name]:.1f} | {rates['sequential']:.0f} | {rates['pipelined']:.0f} | "
                f"**{speedup:.2f}x** | {bound:.2f}x |"
            )
            bars[f"{run['workers']}w {name.split()[0]}"] = speedup
            if speedup > bound * 1.02:
                beyond.append(f"{run['workers']} workers, {name}")
    lines += [
        "",
        "Beyond its bound (by more than 2%): " + ("; ".join(beyond) if beyond else "none") + ".",
    ]
    (RESULTS / "pipeline.md").write_text("\n".join(lines) + "\n\n![pipeline](pipeline.png)\n")
    bar_chart(
        RESULTS / "pipeline.png",
        bars,
        "pipelined / sequential",
        f"{args.task}: pipelining speed-up",
        xlabel="env workers, inference",
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
