"""Learner ranks for data-parallel training (`runtime.learner_ranks=N` with `runtime=procs`
or `runtime=ray`): the learner of the run is rank 0; ranks 1..N-1 are processes on the same
machine that hold a replica of the policy and its optimizer.

Rank 0 alone talks to the rollout, saves checkpoints and publishes weights. For every batch it
sends the trajectory to the other ranks; all of them run the same update, each on its shard
of every minibatch, with gradients averaged across ranks (`embodied.distributed`), so the
replicas stay identical. Messages between ranks use the project's codec (no pickle).

    python -m embodied.runtime.learner_ranks --config <run>/config.yaml --rank 1 --world 2 \\
        --address 127.0.0.1:29500 --spec '<env spec as JSON>'"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from embodied.checkpoint import flatten, unflatten
from embodied.distributed import DataParallel
from embodied.errors import ConfigError
from embodied.runtime.learner import Learner
from embodied.runtime.wire import tensors_from_wire, tensors_to_wire, trajectory_from_wire, trajectory_to_wire
from embodied.transport import codec

logger = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]


def broadcast_message(parallel: DataParallel, message: Any = None) -> Any:
    """Rank 0's `message` on every rank."""
    length = torch.zeros(1, dtype=torch.int64)
    if parallel.rank == 0:
        data = codec.encode(message)
        length[0] = len(data)
    parallel.broadcast(length)
    buffer = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if parallel.rank == 0
              else torch.empty(int(length[0]), dtype=torch.uint8))
    parallel.broadcast(buffer)
    return message if parallel.rank == 0 else codec.decode(buffer.numpy().tobytes())


def state_to_wire(learner: Learner) -> dict[str, Any]:
    tensors: dict[str, torch.Tensor] = {}
    skeleton = flatten(learner.state_dict(), tensors)
    return {"weights": tensors_to_wire(learner.get_weights()), "skeleton": json.dumps(skeleton),
            "tensors": tensors_to_wire(tensors)}


def load_state_from_wire(learner: Learner, wire: dict[str, Any]) -> None:
    learner.load_weights(tensors_from_wire(wire["weights"]))
    learner.load_state_dict(unflatten(json.loads(wire["skeleton"]), tensors_from_wire(wire["tensors"])))


class LearnerRanks:
    """Rank 0's handle on the other learner ranks."""

    def __init__(self, config_path: Path, world: int, spec: dict[str, Any], log_dir: Path):
        with socket.socket() as probe:  # rank 0 serves the process group on a free loopback port
            probe.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{probe.getsockname()[1]}"
        log_dir.mkdir(parents=True, exist_ok=True)
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.processes = []
        for rank in range(1, world):
            with open(log_dir / f"learner-rank-{rank}.log", "ab") as log:
                self.processes.append(subprocess.Popen(
                    [sys.executable, "-m", "embodied.runtime.learner_ranks", "--config", str(config_path),
                     "--rank", str(rank), "--world", str(world), "--address", address, "--spec", json.dumps(spec)],
                    stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True))
        self.parallel = DataParallel.join(0, world, address)
        self.learner: Learner | None = None

    def attach(self, learner: Learner) -> None:
        """Make `learner` rank 0 and give every rank its state (fresh or restored)."""
        if not hasattr(learner.algo, "data_parallel"):
            raise ConfigError(f"runtime.learner_ranks > 1 needs an algorithm that trains data-parallel (ppo), "
                              f"not '{type(learner.algo).__name__}'")
        learner.algo.data_parallel = self.parallel
        self.learner = learner
        broadcast_message(self.parallel, {"kind": "state", "state": state_to_wire(learner)})

    def before_update(self, batch: Any, progress: float, off_policy: bool) -> None:
        self._check_alive()
        broadcast_message(self.parallel, {"kind": "update", "trajectory": trajectory_to_wire(batch),
                                          "progress": progress, "off_policy": off_policy})

    def _check_alive(self) -> None:
        dead = [p for p in self.processes if p.poll() is not None]
        if dead:
            raise RuntimeError(f"learner rank process {dead[0].pid} exited (code {dead[0].returncode}); "
                               f"see logs/learner-rank-*.log. Resume with resume=<run dir>")

    def stop(self) -> None:
        try:
            if all(p.poll() is None for p in self.processes):
                broadcast_message(self.parallel, {"kind": "stop"})
        finally:
            self.parallel.leave()
            for process in self.processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def follow(config_path: Path, rank: int, world: int, address: str, spec: dict[str, Any]) -> None:
    """Ranks 1..N-1: mirror rank 0's updates until it says stop."""
    from embodied.build import build_algo, build_policy, resolve_device
    from embodied.config import TrainConfig, load_yaml, to_schema
    from embodied.train import start_process
    from embodied.types import EnvSpec

    config = to_schema(TrainConfig, load_yaml(config_path))
    start_process(config.seed, config.runtime.torch_threads)
    device = resolve_device(config.runtime.device)
    if device.type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    policy = build_policy(config.policy, EnvSpec.from_dict(spec), device)
    learner = Learner(policy, build_algo(config.algo, policy), device)
    learner.algo.data_parallel = parallel = DataParallel.join(rank, world, address)
    try:
        while True:
            message = broadcast_message(parallel)
            if message["kind"] == "stop":
                return
            if message["kind"] == "state":
                load_state_from_wire(learner, message["state"])
            elif message["kind"] == "update":
                learner.update(trajectory_from_wire(message["trajectory"]), float(message["progress"]),
                               off_policy=bool(message["off_policy"]))
    finally:
        parallel.leave()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    follow(Path(args.config), args.rank, args.world, args.address, json.loads(args.spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
