"""An env worker process: its share of the envs, served over ZeroMQ to the rollout.

    python -m embodied.sim.worker --endpoint ipc:///tmp/x --env '{"name": "gymnasium", ...}' --env-ids 0 1 --seed 1

Imports numpy, pyzmq, msgpack and the simulator only: never torch (simulators that use torch
internally import it themselves), so it can run under another Python interpreter, e.g. the
virtualenv of a simulator with conflicting pins. The worker connects a DEALER socket to the
rollout's ROUTER, says hello with its env metadata, then answers requests. It sends heartbeats
while idle and exits when its parent process is gone."""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial
from typing import Any, Callable

import zmq

from embodied.core.env import SingleEnv
from embodied.core.protocol import PROTOCOL_VERSION, Message, ProtocolError, error_message, hello_mismatch, plain
from embodied.core.registry import load, unknown_name_message
from embodied.core.sockets import connect, receive, send
from embodied.sim.latency import LatencyConfig, with_latency
from embodied.sim.worker_envs import WorkerEnvs, run_command

# The single envs a worker can run: env name -> (its env class, its config schema), named
# rather than imported, so a worker imports only its own simulator. The training side's
# registry (`embodied.core.registry.ENVS`) builds batched envs and imports torch.
WORKER_ENVS = {
    "maniskill": ("embodied.sim.maniskill:ManiSkillEnv", "embodied.sim.maniskill_common:ManiSkillConfig"),
    "gymnasium": ("embodied.sim.gymnasium_env:GymnasiumEnv", "embodied.sim.gymnasium_env:GymnasiumConfig"),
    "libero": ("embodied.sim.libero:LiberoEnv", "embodied.sim.libero:LiberoConfig"),
    "robosuite": ("embodied.sim.robosuite_env:RobosuiteEnv", "embodied.sim.robosuite_env:RobosuiteConfig"),
}
# Simulators whose worker holds its whole share in one batched scene: env name -> (the class that
# answers `WorkerEnvs`'s commands for it, its config schema).
BATCHED_WORKER_ENVS = {
    "genesis": ("embodied.sim.genesis:GenesisEnvs", "embodied.sim.genesis:GenesisConfig"),
}


def single_env_factory(env_config: dict[str, Any]) -> Callable[[int], SingleEnv]:
    """Builds single envs from a plain config dict, without the training-side registries."""
    name = env_config.get("name")
    if name not in WORKER_ENVS:
        raise ValueError(unknown_name_message("env worker", name, sorted(WORKER_ENVS)))
    config = _config(WORKER_ENVS[name][1], env_config)
    return with_latency(partial(load(WORKER_ENVS[name][0]), config), config.latency)


def worker_envs_factory(env_config: dict[str, Any]) -> Callable[[list[int], int, int], Any]:
    """What a worker serves, `(env ids, base seed, stream) -> envs`: its single envs in a
    `WorkerEnvs`, or a batched simulator's one scene of them."""
    name = env_config.get("name")
    if name in BATCHED_WORKER_ENVS:
        envs_class, schema = BATCHED_WORKER_ENVS[name]
        return partial(load(envs_class), _config(schema, env_config))
    return partial(WorkerEnvs, single_env_factory(env_config))


def _config(schema: str, env_config: dict[str, Any]) -> Any:
    return load(schema)(**{**env_config, "latency": LatencyConfig.from_value(env_config.get("latency"))})


def serve(
    endpoint: str,
    make_envs: Callable[[list[int], int, int], Any],
    env_ids: list[int],
    base_seed: int,
    stream: int = 0,
    worker_id: str = "",
    heartbeat_s: float = 1.0,
    keys_dir: str | None = None,
) -> None:
    parent = os.getppid()
    context = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.IDENTITY, (worker_id or f"env-{os.getpid()}").encode())
    connect(socket, endpoint, keys_dir)  # a CURVE client where the hub is off loopback
    envs = make_envs(env_ids, base_seed, stream)
    try:
        description = envs.describe()
        spec = plain(description["spec"])
        send(
            socket,
            Message("hello", 0, {"protocol": PROTOCOL_VERSION, "role": "env", "env_ids": env_ids, **description}),
        )
        while True:
            if not socket.poll(int(heartbeat_s * 1000)):
                if os.getppid() != parent:
                    return  # the rollout that started this worker is gone
                send(socket, Message("heartbeat", 0, {"time": time.time()}))
                continue
            try:
                _, request = receive(socket)
            except ProtocolError as error:
                send(socket, error_message(0, error))
                continue
            if request.kind == "close":
                return
            if request.kind == "welcome":
                differences = hello_mismatch({"spec": spec}, request.body)
                if differences:
                    raise SystemExit(
                        f"env worker {worker_id}: the rollout expects other envs: {'; '.join(differences)}"
                    )
            if request.kind == "error":
                raise SystemExit(f"env worker {worker_id}: the rollout refused it: {request.body.get('message')}")
            if request.kind == "command":
                send(socket, Message("result", request.seq, run_command(envs, request.body)))
    finally:
        envs.close()
        socket.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--env", required=True, help="the env config as JSON")
    parser.add_argument("--env-ids", type=int, nargs="+", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stream", type=int, default=0)
    parser.add_argument("--worker-id", default="")
    parser.add_argument("--keys-dir", default=None, help="CURVE keys, for a hub off loopback")
    args = parser.parse_args()
    serve(
        args.endpoint,
        worker_envs_factory(json.loads(args.env)),
        args.env_ids,
        args.seed,
        args.stream,
        args.worker_id,
        keys_dir=args.keys_dir,
    )


if __name__ == "__main__":
    main()
