"""`runtime=procs` env steps/s against raw simulator stepping, no learning, side by side.

    raw        the env side alone: the same VectorizedEnv stepping random actions
    local      rollout in this process with the default MLP policy (runtime=local's collection)
    procs      the real rollout process (policy inference, trajectories over ZeroMQ, acks,
               weights) feeding a learner that only consumes; max_policy_lag 0 and 1

    python benchmarks/procs.py [--task PushCube-v1] [--num-envs 16] [--workers 2] [--batches 8]

Writes benchmarks/results/procs.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from embodied.build import build_env, build_policy
from embodied.config import TrainConfig, to_schema, to_yaml
from embodied.core.compose import compose
from embodied.core.protocol import PROTOCOL_VERSION
from embodied.core.types import EnvSpec
from embodied.runtime.learner_link import LearnerLink
from embodied.runtime.procs import RolloutSupervisor
from embodied.runtime.rollout import Rollout
from embodied.runtime.wire import published_weights, tensors_to_wire
from harness.reports import bar_chart, provenance, provenance_line

RESULTS = Path(__file__).resolve().parent / "results"


def config_for(args: argparse.Namespace, max_policy_lag: int = 0) -> TrainConfig:
    return to_schema(
        TrainConfig,
        compose(
            "train",
            [
                f"env.task={args.task}",
                f"env.num_envs={args.num_envs}",
                f"env.num_workers={args.workers}",
                f"algo.rollout_steps={args.rollout_steps}",
                "runtime=procs",
                "runtime.torch_threads=1",
                "runtime.device=cpu",
                "runtime.rollout_device=cpu",
                f"runtime.max_policy_lag={max_policy_lag}",
            ],
        ),
    )


def raw_rate(config: TrainConfig, batches: int) -> float:
    env = build_env(config.env, seed=0)
    try:
        env.reset()
        rng = np.random.default_rng(0)
        low, high = np.array(env.spec.action_low), np.array(env.spec.action_high)
        steps = config.algo.rollout_steps
        actions = rng.uniform(low, high, size=(steps, env.num_envs, 1, env.spec.action_dim)).astype(np.float32)
        env.step(actions[0])
        started, env_steps = time.perf_counter(), 0
        for _ in range(batches):
            for t in range(steps):
                env_steps += int(env.step(actions[t]).executed_steps.sum())
        return env_steps / (time.perf_counter() - started)
    finally:
        env.close()


def local_rate(config: TrainConfig, batches: int) -> float:
    env = build_env(config.env, seed=0)
    try:
        policy = build_policy(config.policy, env.spec, torch.device("cpu"))
        rollout = Rollout(env, policy, torch.device("cpu"))
        rollout.start()
        rollout.collect(2)
        started, env_steps = time.perf_counter(), 0
        for _ in range(batches):
            env_steps += rollout.collect(config.algo.rollout_steps)[2]
        return env_steps / (time.perf_counter() - started)
    finally:
        env.close()


def procs_rate(config: TrainConfig, batches: int) -> float:
    """Env steps/s arriving at a learner that consumes batches without learning, timed from
    the first batch's arrival (the rollout process's start-up left out)."""
    with tempfile.TemporaryDirectory() as run_dir:
        run_dir = Path(run_dir)
        (run_dir / "config.yaml").write_text(to_yaml(config))
        expected = {"protocol": PROTOCOL_VERSION, "policy": config.policy.name, "chunk_size": config.policy.chunk_size}
        link = LearnerLink("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", expected)
        supervisor = RolloutSupervisor(run_dir, config.runtime)
        try:
            supervisor.start({"trajectory": link.trajectory_endpoint, "weights": link.weights_endpoint})
            hello = None
            while hello is None:
                assert supervisor.alive(), supervisor.log_tail()
                hello = link.wait_hello(1.0)
            spec = EnvSpec.from_dict(hello["spec"])
            policy = build_policy(config.policy, spec, torch.device("cpu"))
            link.publish(0, tensors_to_wire(published_weights(policy)))
            env_steps, started = 0, 0.0
            for index in range(batches + 1):
                delivery = None
                while delivery is None:
                    assert supervisor.alive(), supervisor.log_tail()
                    delivery = link.next_trajectory(1.0)
                if index == 0:
                    started = time.perf_counter()
                else:
                    env_steps += int(delivery.body["env_steps"])
                link.consumed(delivery, policy_version=0)
            return env_steps / (time.perf_counter() - started)
        finally:
            link.close(tell_rollouts=True)
            supervisor.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="PushCube-v1")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rollout-steps", type=int, default=50)
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rates: dict[str, float] = {}
    for _ in range(2):  # interleaved, best of two each
        for name, measure in (
            ("raw", lambda: raw_rate(config_for(args), args.batches)),
            ("local", lambda: local_rate(config_for(args), args.batches)),
            ("procs sync", lambda: procs_rate(config_for(args, 0), args.batches)),
            ("procs lag 1", lambda: procs_rate(config_for(args, 1), args.batches)),
        ):
            rates[name] = max(rates.get(name, 0.0), measure())
            print(f"{name}: {rates[name]:.0f} env steps/s", flush=True)
    ratios = {name: rate / rates["raw"] for name, rate in rates.items()}
    result = {
        **provenance("procs.py"),
        "task": args.task,
        "num_envs": args.num_envs,
        "workers": args.workers,
        "rollout_steps": args.rollout_steps,
        "batches": args.batches,
        "cpu_cores": os.cpu_count(),
        "env_steps_per_s": rates,
        "ratio_to_raw": ratios,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "procs.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# runtime=procs vs raw stepping: {args.task}, {args.num_envs} envs in {args.workers} env workers, "
        f"{os.cpu_count()} cores",
        "",
        provenance_line(result),
        "",
        f"No learning. {args.batches} batches of {args.rollout_steps} chunk steps per env, best of two "
        f"interleaved runs. The policy is the default MLP (inference on CPU).",
        "",
        "| collection | env steps/s | vs raw |",
        "| --- | ---: | ---: |",
        *(f"| {name} | {rate:.0f} | {ratios[name]:.2f} |" for name, rate in rates.items()),
    ]
    (RESULTS / "procs.md").write_text("\n".join(lines) + "\n\n![procs](procs.png)\n")
    bar_chart(RESULTS / "procs.png", rates, "env steps / s", f"{args.task}: procs sync {ratios['procs sync']:.2f}x raw")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
