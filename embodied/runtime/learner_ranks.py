"""Learner ranks for data-parallel training (`runtime.learner_ranks=N` with `runtime=procs`
or `runtime=ray`): the learner of the run is rank 0; ranks 1..N-1 hold a replica of the
policy and its optimizer. Under `procs` they are processes on the learner's machine (rank r
on GPU r); under `ray` they are actors wherever `runtime.learner_rank` places them, other
nodes included (each on the GPU Ray gives it).

Rank 0 alone talks to the rollout, saves checkpoints and publishes weights. For every batch it
sends the trajectory to the other ranks; all of them run the same update, each on its shard
of every minibatch, with gradients averaged across ranks (`embodied.algos.distributed`), so the
replicas stay identical. Messages between ranks use the project's codec (no pickle).

With `runtime.learner_sharding=fsdp` no rank holds the whole policy: rank 0 gathers it to
publish weights (after sharding and after every update) and, told by a `checkpoint` message,
with the optimizer state to save; the other ranks join each gather.

    python -m embodied.runtime.learner_ranks --config <run>/config.yaml --rank 1 --world 2 \\
        --address 127.0.0.1:29500 --spec '<env spec as JSON>'"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from embodied.algos.distributed import SHARDINGS, DataParallel
from embodied.core import codec
from embodied.core.errors import ConfigError
from embodied.runs.checkpoint import flatten, unflatten
from embodied.runtime.learner import Learner
from embodied.runtime.wire import tensors_from_wire, tensors_to_wire, trajectory_from_wire, trajectory_to_wire

logger = logging.getLogger(__name__)


# Between the ranks of one run on one machine: a model's weights and optimizer moments are
# thousands of arrays, more than the wire limits for outside peers allow.
RANK_LIMITS = codec.Limits(
    max_frames=1 << 20, max_header_bytes=1 << 30, max_frame_bytes=1 << 40, max_total_bytes=1 << 40
)


def broadcast_message(parallel: DataParallel, message: Any = None) -> Any:
    """Rank 0's `message` on every rank."""
    length = torch.zeros(1, dtype=torch.int64)
    if parallel.rank == 0:
        data = codec.encode(message)
        length[0] = len(data)
    parallel.broadcast(length)
    buffer = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if parallel.rank == 0
        else torch.empty(int(length[0]), dtype=torch.uint8)
    )
    parallel.broadcast(buffer)
    return message if parallel.rank == 0 else codec.decode(buffer.numpy().tobytes(), RANK_LIMITS)


def state_to_wire(learner: Learner) -> dict[str, Any]:
    tensors: dict[str, torch.Tensor] = {}
    skeleton = flatten(learner.state_dict(), tensors)
    return {
        "weights": tensors_to_wire(learner.get_weights()),
        "skeleton": json.dumps(skeleton),
        "tensors": tensors_to_wire(tensors),
    }


def load_state_from_wire(learner: Learner, wire: dict[str, Any]) -> None:
    learner.load_weights(tensors_from_wire(wire["weights"]))
    learner.load_state_dict(unflatten(json.loads(wire["skeleton"]), tensors_from_wire(wire["tensors"])))


def check_learner_ranks(config: Any, ranks: int, sharding: str = "replicate") -> None:
    """What data-parallel training needs, checked before any process starts."""
    if sharding not in SHARDINGS:
        raise ConfigError(f"runtime.learner_sharding must be one of {SHARDINGS}, got '{sharding}'")
    if sharding == "fsdp" and ranks < 2:
        raise ConfigError(
            "runtime.learner_sharding=fsdp shards the policy over learner ranks: set runtime.learner_ranks >= 2"
        )
    if ranks == 1:
        return
    if config.algo.name not in ("ppo", "grpo"):
        raise ConfigError(f"runtime.learner_ranks > 1 trains algo=ppo or algo=grpo, not '{config.algo.name}'")
    if config.algo.name == "grpo":
        return  # GRPO's minibatches need not split evenly (see GRPO._train)
    samples = getattr(config.env, "num_envs", 1) * config.algo.rollout_steps
    minibatch = samples // config.algo.num_minibatches
    parts = ranks * config.algo.gradient_accumulation_steps
    if minibatch % parts:
        raise ConfigError(
            f"minibatches of {minibatch} samples do not split over runtime.learner_ranks={ranks} x "
            f"algo.gradient_accumulation_steps={config.algo.gradient_accumulation_steps}; "
            f"change algo.num_minibatches or env.num_envs"
        )


def rank_device(device: torch.device, rank: int, world: int) -> torch.device:
    """Rank r's device: GPU r where the learner runs on CUDA, the CPU otherwise."""
    if device.type != "cuda":
        return torch.device("cpu")
    if torch.cuda.device_count() < world:
        raise ConfigError(f"runtime.learner_ranks={world} needs {world} GPUs; {torch.cuda.device_count()} visible")
    return torch.device("cuda", rank)


class RankProcesses:
    """Starts ranks 1..N-1 as processes on this machine (`runtime=procs`): rank r on GPU r."""

    host = "127.0.0.1"  # where rank 0 serves the process group
    devices_here = True  # every rank's GPU is one of this machine's

    def __init__(self, config_path: Path, log_dir: Path):
        self.config_path = config_path
        self.log_dir = log_dir

    def start(self, rank: int, world: int, address: str, spec: dict[str, Any]) -> subprocess.Popen:
        with open(self.log_dir / f"learner-rank-{rank}.log", "ab") as log:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "embodied.runtime.learner_ranks",
                    "--config",
                    str(self.config_path),
                    "--rank",
                    str(rank),
                    "--world",
                    str(world),
                    "--address",
                    address,
                    "--spec",
                    json.dumps(spec),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


class LearnerRanks:
    """Rank 0's handle on the other learner ranks, started by `starter` (`RankProcesses`, or
    Ray actors under `runtime=ray`: anything with `host`, `devices_here` and `start`)."""

    def __init__(
        self,
        starter: Any,
        world: int,
        spec: dict[str, Any],
        log_dir: Path,
        device: torch.device,
        sharding: str = "replicate",
        join_timeout_s: float = 600.0,
    ):
        # Ranks elsewhere bring their own GPU; here rank r needs GPU r.
        self.device = rank_device(device, 0, world if starter.devices_here else 1)
        self.sharded = sharding == "fsdp"
        with socket.socket() as probe:  # rank 0 serves the process group on a free port of its host
            probe.bind((starter.host, 0))
            address = f"{starter.host}:{probe.getsockname()[1]}"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.processes: list[Any] = []  # subprocess.Popen, or its shape (ray_actors.ActorProcess)
        try:
            for rank in range(1, world):
                self.processes.append(starter.start(rank, world, address, spec))
            self.parallel = self._join(world, address, join_timeout_s)
        except BaseException:
            self._kill()
            raise

    def _join(self, world: int, address: str, timeout_s: float) -> DataParallel:
        """Join while watching the other ranks: one that dies before joining is an error now,
        not a wait for the process group's timeout."""
        joined: list[DataParallel] = []
        failure: list[BaseException] = []

        def join() -> None:
            try:
                joined.append(DataParallel.join(0, world, address, self.device))
            except BaseException as error:  # reported below
                failure.append(error)

        thread = threading.Thread(target=join, daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout_s
        while thread.is_alive():
            thread.join(0.2)
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the learner ranks did not join within {timeout_s:.0f} s; see {self.log_dir}")
        if failure:
            raise failure[0]
        return joined[0]

    def attach(self, learner: Learner) -> None:
        """Make `learner` rank 0 and give every rank its state (fresh or restored)."""
        if not hasattr(learner.algo, "data_parallel"):
            raise ConfigError(
                f"runtime.learner_ranks > 1 needs an algorithm that trains data-parallel (ppo, grpo), "
                f"not '{type(learner.algo).__name__}'"
            )
        learner.algo.data_parallel = self.parallel
        broadcast_message(self.parallel, {"kind": "state", "state": state_to_wire(learner)})
        if self.sharded:
            learner.shard(self.parallel)

    def before_checkpoint(self) -> None:
        """Sharded: the other ranks join the gathers of the checkpoint rank 0 is about to save."""
        if self.sharded:
            self._check_alive()
            broadcast_message(self.parallel, {"kind": "checkpoint"})

    def before_update(self, batch: Any, progress: float, off_policy: bool) -> None:
        self._check_alive()
        broadcast_message(
            self.parallel,
            {"kind": "update", "trajectory": trajectory_to_wire(batch), "progress": progress, "off_policy": off_policy},
        )

    def _check_alive(self) -> None:
        dead = [p for p in self.processes if p.poll() is not None]
        if dead:
            raise RuntimeError(
                f"learner rank process {dead[0].pid} exited (code {dead[0].returncode}); see "
                f"{self.log_dir}/learner-rank-*.log. Resume from the last checkpoint with "
                f"resume=<run dir>"
            )

    def stop(self, clean: bool) -> None:
        """After a clean finish the ranks are told to stop. After a failure they may be inside
        a collective rank 0 will never reach: they are killed, and nothing here raises over
        the failure."""
        try:
            if clean and all(p.poll() is None for p in self.processes):
                broadcast_message(self.parallel, {"kind": "stop"})
                for process in self.processes:
                    process.wait(timeout=30)
        except Exception as error:
            logger.warning("learner ranks did not stop cleanly: %s", error)
        finally:
            self._kill()
            self.parallel.leave()

    def _kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()


def follow(config: Any, rank: int, world: int, address: str, spec: dict[str, Any], device: torch.device) -> None:
    """Ranks 1..N-1: mirror rank 0's updates until it says stop."""
    from embodied.build import build_algo, build_policy
    from embodied.core.types import EnvSpec
    from embodied.runtime.process import start_process

    sharded = getattr(config.runtime, "learner_sharding", "replicate") == "fsdp"
    start_process(config.seed, config.runtime.torch_threads)
    policy = build_policy(config.policy, EnvSpec.from_dict(spec), device)
    learner = Learner(policy, build_algo(config.algo, policy), device)
    learner.algo.data_parallel = parallel = DataParallel.join(rank, world, address, device)
    try:
        while True:
            message = broadcast_message(parallel)
            if message["kind"] == "stop":
                return
            if message["kind"] == "state":
                load_state_from_wire(learner, message["state"])
                if sharded:
                    learner.shard(parallel)
                    learner.published()  # rank 0 publishes the first weights
            elif message["kind"] == "update":
                learner.update(
                    trajectory_from_wire(message["trajectory"]),
                    float(message["progress"]),
                    off_policy=bool(message["off_policy"]),
                )
                if sharded:
                    learner.published()  # rank 0 publishes after every update
            elif message["kind"] == "checkpoint":
                learner.state_dict()  # in the order rank 0 saves them
                learner.get_weights()
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
    from embodied.build import resolve_device
    from embodied.config import TrainConfig, to_schema
    from embodied.core.compose import load_yaml

    config = to_schema(TrainConfig, load_yaml(Path(args.config)))
    device = rank_device(resolve_device(config.runtime.device), args.rank, args.world)
    follow(config, args.rank, args.world, args.address, json.loads(args.spec), device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
