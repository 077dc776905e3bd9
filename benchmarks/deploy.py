"""Robot <-> policy server on loopback: our protocol against the openpi client protocol.

    python benchmarks/deploy.py [--quick] [--seconds 8] [--repeats 2] [--clients 1 8 32] [--client-procs 4]

An observation of two uint8 224x224x3 images, a float32 (8,) state and an instruction goes
to a policy server, which answers with a float32 50x7 action chunk.

    ours     `embodied.serve.PolicyServer` (ZeroMQ ROUTER, requests that arrive together answered
             by one batched forward pass) and `embodied.robots.policy_client.PolicyClient`
    openpi   openpi-client's `WebsocketClientPolicy` (msgpack-numpy over a websocket) against
             the server below, written to openpi's documented protocol: the policy's metadata on
             connect, then per message unpack, call the policy, send back the packed actions.
             Like openpi's reference server it calls the policy synchronously inside the
             connection handler, so several clients are served one request at a time.
    bridge   openpi-client's `WebsocketClientPolicy` against `embodied serve`'s openpi endpoint
             (`openpi.port`): each websocket bridged to our policy server, which batches them;
             the goal is a round trip within 1.2x of openpi's client against openpi's server.

Three models, the same for both servers: `transport only` (zeros, instantly: the round trip
is the protocol's overhead), `10 ms model` (each forward pass sleeps 10 ms whatever its batch
size, standing for a GPU forward whose cost is flat in the batch up to 32) and `CPU network` (a
real forward pass of a small convolutional policy on one CPU thread, whose cost grows with the
batch). Each server runs in
its own process; the clients run as threads in up to `--client-procs` other processes, each
closed-loop (the next request as soon as the reply is in). Every client warms up first; replies
are then counted over a window of `--seconds` after a settling second. `--quick` is a ~1 minute
smoke run. Writes benchmarks/results/deploy.{json,md,png} (harness/deploy_report.py); `--report` rebuilds the
Markdown and the plot from deploy.json."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.deploy_report import write
from harness.reports import provenance

RESULTS = Path(__file__).resolve().parent / "results"
IMAGES = ("base", "wrist")
IMAGE_SHAPE = (224, 224, 3)
STATE_DIM, CHUNK, ACTION_DIM = 8, 50, 7
INSTRUCTION = "put the red block in the bowl"
PROTOCOLS = ("ours", "openpi", "bridge")
# The model behind both servers. Fixed costs (milliseconds per forward pass, whatever the
# batch): "transport only" answers zeros at once, "10 ms model" waits 10 ms. "CPU network" is a
# real forward pass whose cost grows with the batch (`PolicyNetwork`), so it has no fixed cost.
MODELS = {"transport only": 0.0, "10 ms model": 10.0, "CPU network": None}
WARMUP_REQUESTS = 5
LEROBOT_REASON = (
    "not measured: lerobot does not install next to this project. lerobot >= 0.5 needs Python >= 3.12 "
    f"(this is {platform.python_version()}); with the `async` extra, pip finds that 0.3.3 to 0.4.4 require "
    "torch < 2.8 or < 2.11 (we pin torch 2.13.0) and 0.3.2 requires gymnasium < 1.0 (we need >= 1.0)"
)


def env_spec():
    from embodied.core.types import EnvSpec

    return EnvSpec(
        state_dim=STATE_DIM,
        action_dim=ACTION_DIM,
        action_low=(-1.0,) * ACTION_DIM,
        action_high=(1.0,) * ACTION_DIM,
        image_shapes={name: IMAGE_SHAPE for name in IMAGES},
        control_hz=10.0,
    )


class PolicyNetwork:
    """A small convolutional policy, run with torch on one CPU thread: each camera through a
    strided convolution stack, the state beside, an MLP to the action chunk (about 0.3 G
    multiply-adds per observation). Unlike a fixed wait, its cost grows with the batch, as a
    real model's does on a CPU."""

    def __init__(self):
        import torch
        from torch import nn

        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.torch = torch
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=1),
            nn.ReLU(),
            nn.Conv2d(128, 128, 3, stride=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
        )
        self.head = nn.Sequential(
            nn.Linear(len(IMAGES) * 2048 + STATE_DIM, 256), nn.ReLU(), nn.Linear(256, CHUNK * ACTION_DIM)
        )

    def __call__(self, images: dict[str, np.ndarray], state: np.ndarray) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            features = [self.encoder(torch.tensor(images[name]).permute(0, 3, 1, 2).float() / 255.0) for name in IMAGES]
            actions = self.head(torch.cat([*features, torch.tensor(state).float()], 1))
        return actions.view(-1, CHUNK, ACTION_DIM).numpy()


def make_model(model: str):
    """`model`'s forward pass: (images {name: (B, H, W, 3)}, state (B, S)) -> (B, CHUNK, A)."""
    model_ms = MODELS[model]
    if model_ms is None:
        return PolicyNetwork()

    def fixed_cost(images: dict[str, np.ndarray], state: np.ndarray) -> np.ndarray:
        if model_ms > 0:
            time.sleep(model_ms / 1000)
        return np.zeros((len(state), CHUNK, ACTION_DIM), np.float32)

    return fixed_cost


# ---- servers (each in its own process) -----------------------------------------------------
# openpi-client's observation here (`observation_arrays`) onto the served env, for the bridge
BRIDGE_OBSERVATION = "state=state,images/base=image:base,images/wrist=image:wrist,prompt=instruction"


def serve_ours(model: str, address: Any, stop: Any, openpi_endpoint: bool = False) -> None:
    """Our policy server; with `openpi_endpoint`, its openpi endpoint too, whose port is put
    in `address` instead of the server's endpoint (the bridge's clients speak openpi)."""
    from embodied.runtime.openpi_endpoint import OpenpiConfig, OpenpiEndpoint
    from embodied.runtime.policy_server import PolicyServer, ServeConfig

    forward = make_model(model)

    def infer(observation) -> np.ndarray:
        return forward(observation.images, observation.state)

    server = PolicyServer(
        infer,
        env_spec(),
        {"policy": "zeros", "chunk_size": CHUNK},
        ServeConfig(endpoint="tcp://127.0.0.1:*", stats_every_s=0, max_clients=64, max_batch=64),
    )
    openpi = None
    if openpi_endpoint:
        config = OpenpiConfig(port=0, observation=BRIDGE_OBSERVATION, request_timeout_s=120.0)
        openpi = OpenpiEndpoint(config, env_spec(), server.metadata, server.endpoint)
    address.put(server.endpoint if openpi is None else openpi.port)
    try:
        server.serve_forever(stop.is_set)
    finally:
        if openpi is not None:
            openpi.close()
        server.close()


def serve_bridge(model: str, address: Any, stop: Any) -> None:
    serve_ours(model, address, stop, openpi_endpoint=True)


async def openpi_server(model: str, address: Any, stop: Any) -> None:
    from openpi_client import msgpack_numpy
    from websockets.asyncio.server import serve
    from websockets.exceptions import ConnectionClosed

    metadata = {"policy": "zeros", "chunk_size": CHUNK, "action_dim": ACTION_DIM}

    forward = make_model(model)

    def policy(observation: dict) -> dict:
        assert observation["images"]["base"].shape == IMAGE_SHAPE
        images = {name: observation["images"][name][None] for name in IMAGES}
        return {"actions": forward(images, observation["state"][None])[0]}

    async def connection(websocket) -> None:
        packer = msgpack_numpy.Packer()
        await websocket.send(packer.pack(metadata))
        while True:
            try:
                data = await websocket.recv()
            except ConnectionClosed:
                return
            started = time.monotonic()
            # Synchronous, inside the handler, as in openpi's server: the event loop (and with it
            # every other client) waits for this forward pass.
            reply = policy(msgpack_numpy.unpackb(data))
            reply["server_timing"] = {"infer_ms": (time.monotonic() - started) * 1000}
            try:
                await websocket.send(packer.pack(reply))
            except ConnectionClosed:
                return

    async with serve(connection, "127.0.0.1", 0, compression=None, max_size=None) as server:
        address.put(server.sockets[0].getsockname()[1])
        while not stop.is_set():
            await asyncio.sleep(0.1)


def serve_openpi(model: str, address: Any, stop: Any) -> None:
    asyncio.run(openpi_server(model, address, stop))


# ---- clients (threads in client processes) -------------------------------------------------
def observation_arrays(seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    state = rng.standard_normal(STATE_DIM).astype(np.float32)
    images = {name: rng.integers(0, 256, size=IMAGE_SHAPE, dtype=np.uint8) for name in IMAGES}
    return state, images


class OursClient:
    def __init__(self, address: str, seed: int):
        from embodied.robots.base import RobotObservation
        from embodied.robots.policy_client import PolicyClient

        self.client = PolicyClient(address, env_spec(), name=f"bench{seed}", request_timeout_s=120.0)
        self.client.connect(timeout_s=60.0)
        state, images = observation_arrays(seed)
        self.observation = RobotObservation(state=state, images=images)
        self.tick = 0

    def round_trip(self) -> np.ndarray:
        self.tick += 1
        if not self.client.request(self.observation, self.tick, INSTRUCTION):
            raise RuntimeError("the policy client would not send a request")
        deadline = time.monotonic() + 120.0
        while (reply := self.client.poll(1.0)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("no reply from our policy server within 120 s")
        return reply.actions

    def close(self) -> None:
        self.client.close()


class OpenpiClient:
    def __init__(self, address: int, seed: int):
        from openpi_client.websocket_client_policy import WebsocketClientPolicy

        self.policy = WebsocketClientPolicy(host="127.0.0.1", port=address)
        state, images = observation_arrays(seed)
        self.observation = {"state": state, "images": images, "prompt": INSTRUCTION}

    def round_trip(self) -> np.ndarray:
        return self.policy.infer(self.observation)["actions"]

    def close(self) -> None:
        self.policy._ws.close()  # openpi-client 0.1.2 has no public close


def run_client(
    protocol: str, address: Any, seed: int, ready: Any, go: Any, window: Any, latencies: list[float], errors: list[str]
) -> None:
    try:
        client = (OursClient if protocol == "ours" else OpenpiClient)(address, seed)  # the bridge speaks openpi
        for _ in range(WARMUP_REQUESTS):
            assert client.round_trip().shape == (CHUNK, ACTION_DIM)
        ready.put("ready")
        go.wait()
        start, end = window[0], window[1]
        while True:
            sent = time.perf_counter()
            actions = client.round_trip()
            done = time.perf_counter()
            if done > end:
                break
            if done >= start:
                latencies.append((done - sent) * 1000)
        assert actions.shape == (CHUNK, ACTION_DIM) and actions.dtype == np.float32
        client.close()
    except Exception as error:  # reported to the parent, which stops the run
        errors.append(f"client {seed}: {error!r}")
        ready.put(errors[-1])


def client_process(protocol: str, address: Any, seeds: list[int], ready: Any, go: Any, window: Any, out: Any) -> None:
    """Clients as threads; reports the round trips (ms) completed inside the window."""
    latencies: list[float] = []  # list.append is atomic under the GIL
    errors: list[str] = []
    threads = [
        threading.Thread(target=run_client, args=(protocol, address, seed, ready, go, window, latencies, errors))
        for seed in seeds
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put({"latencies": latencies, "errors": errors})


# ---- one measurement --------------------------------------------------------------------------
def measure(protocol: str, model: str, clients: int, args: argparse.Namespace) -> np.ndarray:
    """The round trips (ms) of every reply that arrived inside the window."""
    context = multiprocessing.get_context("spawn")
    stop, address_queue = context.Event(), context.Queue()
    target = {"ours": serve_ours, "openpi": serve_openpi, "bridge": serve_bridge}[protocol]
    server = context.Process(target=target, args=(model, address_queue, stop), daemon=True)
    server.start()
    procs: list[Any] = []
    try:
        address = address_queue.get(timeout=60)
        ready, out, go = context.Queue(), context.Queue(), context.Event()
        window = context.Array("d", 2)
        processes = min(clients, args.client_procs)
        groups = [list(range(i, clients, processes)) for i in range(processes)]
        procs = [
            context.Process(target=client_process, args=(protocol, address, seeds, ready, go, window, out), daemon=True)
            for seeds in groups
        ]
        for proc in procs:
            proc.start()
        for _ in range(clients):
            message = ready.get(timeout=180)
            if message != "ready":
                raise RuntimeError(message)
        now = time.perf_counter()  # CLOCK_MONOTONIC on Linux: the same clock in every process
        window[0], window[1] = now + args.settle, now + args.settle + args.seconds
        go.set()
        latencies: list[float] = []
        for _ in procs:
            while True:
                try:
                    returned = out.get(timeout=1.0)
                    if returned["errors"]:
                        raise RuntimeError("; ".join(returned["errors"]))
                    latencies += returned["latencies"]
                    break
                except queue.Empty:
                    if time.perf_counter() > window[1] + 180:
                        raise RuntimeError("the clients did not finish") from None
                    try:
                        raise RuntimeError(ready.get_nowait())
                    except queue.Empty:
                        pass
        for proc in procs:
            proc.join(30)
        return np.array(latencies)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        stop.set()
        server.join(10)
        if server.is_alive():
            server.terminate()


def summary(runs: list[np.ndarray], seconds: float) -> dict[str, Any]:
    """Throughput: the best run's. Latency: over the replies of all runs together."""
    pooled = np.concatenate(runs)
    return {
        "replies_per_s": max(len(run) for run in runs) / seconds,
        "runs_replies_per_s": [len(run) / seconds for run in runs],
        "replies": len(pooled),
        "p50_ms": float(np.percentile(pooled, 50)),
        "p99_ms": float(np.percentile(pooled, 99)),
        "mean_ms": float(pooled.mean()),
    }


def bare_echo(address_queue: Any, stop: Any) -> None:
    """A ROUTER answering every message with one 50x7 float32 frame: ZeroMQ without a protocol."""
    import zmq

    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    address_queue.put(f"tcp://127.0.0.1:{port}")
    reply = np.zeros((CHUNK, ACTION_DIM), np.float32)
    while not stop.is_set():
        if socket.poll(100):
            frames = socket.recv_multipart(copy=False)
            socket.send_multipart([frames[0], b"header", memoryview(reply)], copy=False)
    socket.close()


def bare_zeromq_round_trip(samples: int) -> dict[str, float]:
    """The same observation frames through a pyzmq DEALER/ROUTER pair between two processes,
    with no envelope, codec or checks: what any Python protocol on ZeroMQ over loopback TCP
    starts from on this machine."""
    import zmq

    context = multiprocessing.get_context("spawn")
    stop, address_queue = context.Event(), context.Queue()
    server = context.Process(target=bare_echo, args=(address_queue, stop), daemon=True)
    server.start()
    try:
        socket = zmq.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(address_queue.get(timeout=60))
        state, images = observation_arrays(0)
        frames = [b"header", *(memoryview(image.reshape(-1)) for image in images.values()), memoryview(state)]
        times = []
        for i in range(samples + 100):
            start = time.perf_counter()
            socket.send_multipart(frames, copy=False)
            socket.recv_multipart(copy=False)
            if i >= 100:
                times.append((time.perf_counter() - start) * 1000)
        socket.close()
        return {
            "bare_zeromq_p50_ms": float(np.percentile(times, 50)),
            "bare_zeromq_p99_ms": float(np.percentile(times, 99)),
        }
    finally:
        stop.set()
        server.join(10)
        if server.is_alive():
            server.terminate()


def ours_floor(args: argparse.Namespace) -> dict[str, float]:
    """Where our 1-client round trip goes: a heartbeat over the same sockets (no arrays) and the
    server's own handling of an observation (its `server_ms`), from this process."""
    context = multiprocessing.get_context("spawn")
    stop, address_queue = context.Event(), context.Queue()
    server = context.Process(target=serve_ours, args=("transport only", address_queue, stop), daemon=True)
    server.start()
    try:
        client = OursClient(address_queue.get(timeout=60), 0)
        for _ in range(100):
            client.round_trip()
        samples = 500 if args.quick else 2000
        pings = [client.client.ping() for _ in range(samples)]
        server_ms = []
        for tick in range(samples):
            client.client.request(client.observation, tick, INSTRUCTION)
            while (reply := client.client.poll(1.0)) is None:
                pass
            server_ms.append(reply.timing["server_ms"])
        client.close()
        return {
            "heartbeat_p50_ms": float(np.percentile(pings, 50)),
            "heartbeat_p99_ms": float(np.percentile(pings, 99)),
            "server_p50_ms": float(np.percentile(server_ms, 50)),
            **bare_zeromq_round_trip(samples),
        }
    finally:
        stop.set()
        server.join(10)
        if server.is_alive():
            server.terminate()


# ---- report -------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a ~1 minute smoke run (2 s windows, 1 repeat)")
    parser.add_argument("--seconds", type=float, default=8.0, help="measuring window per point")
    parser.add_argument("--settle", type=float, default=1.0, help="load before the window opens")
    parser.add_argument(
        "--repeats", type=int, default=2, help="interleaved runs per point: best throughput, pooled latencies"
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--client-procs", type=int, default=4, help="client processes (clients are their threads)")
    parser.add_argument("--report", action="store_true", help="rebuild deploy.md and deploy.png from deploy.json")
    args = parser.parse_args()
    if args.report:
        print("\n".join(write(RESULTS, json.loads((RESULTS / "deploy.json").read_text()))))
        return
    if args.quick:
        args.seconds, args.settle, args.repeats = 2.0, 0.5, 1
    from importlib.metadata import version

    import websockets

    openpi_version = version("openpi-client")  # fails early without the bench extra

    started = time.perf_counter()
    runs: dict[tuple[str, str, int], list[np.ndarray]] = {}
    for repeat in range(args.repeats):
        for model in MODELS:
            for n in args.clients:
                for protocol in PROTOCOLS if repeat % 2 == 0 else PROTOCOLS[::-1]:
                    latencies = measure(protocol, model, n, args)
                    runs.setdefault((model, protocol, n), []).append(latencies)
                    print(
                        f"[{time.perf_counter() - started:5.0f} s] {model}, {n} clients, {protocol}: "
                        f"{len(latencies) / args.seconds:.0f} replies/s, p50 {np.percentile(latencies, 50):.2f} ms, "
                        f"p99 {np.percentile(latencies, 99):.2f} ms",
                        flush=True,
                    )
    best = {key: summary(samples, args.seconds) for key, samples in runs.items()}
    floor = ours_floor(args)
    print(f"ours: heartbeat p50 {floor['heartbeat_p50_ms']:.2f} ms, server-side p50 {floor['server_p50_ms']:.2f} ms")
    throughput = {
        model: {
            str(n): {
                **{protocol: best[(model, protocol, n)] for protocol in PROTOCOLS},
                "ratio": best[(model, "ours", n)]["replies_per_s"] / best[(model, "openpi", n)]["replies_per_s"],
                "bridge_ratio": best[(model, "bridge", n)]["replies_per_s"]
                / best[(model, "openpi", n)]["replies_per_s"],
            }
            for n in args.clients
        }
        for model in MODELS
    }
    one = min(args.clients)
    latency = {model: {protocol: best[(model, protocol, one)] for protocol in PROTOCOLS} for model in MODELS}
    plain = latency["transport only"]
    p50_ratio = plain["ours"]["p50_ms"] / plain["openpi"]["p50_ms"]
    top = max(args.clients)
    goals = {
        "overhead_1_client": {
            "p50_ratio": p50_ratio,
            "p99_ratio": plain["ours"]["p99_ms"] / plain["openpi"]["p99_ms"],
            "goal": "<= 1/3",
            "met": p50_ratio <= 1 / 3,
        },
        "throughput_top_clients": {  # the CPU network has none: it measures batching, not the protocol
            model: {
                "clients": top,
                "ratio": throughput[model][str(top)]["ratio"],
                "goal": ">= 5",
                "met": throughput[model][str(top)]["ratio"] >= 5,
            }
            for model, model_ms in MODELS.items()
            if model_ms is not None
        },
        "bridge_1_client": {  # openpi's client against embodied serve, over openpi's own pair
            model: {
                "p50_ratio": latency[model]["bridge"]["p50_ms"] / latency[model]["openpi"]["p50_ms"],
                "goal": "<= 1.2",
                "met": latency[model]["bridge"]["p50_ms"] / latency[model]["openpi"]["p50_ms"] <= 1.2,
            }
            for model in MODELS
        },
    }
    state, images = observation_arrays(0)
    result = {
        **provenance("deploy.py"),
        "setup": {
            "cpu_cores": os.cpu_count(),
            "python": platform.python_version(),
            "openpi_client": openpi_version,
            "websockets": websockets.__version__,
            "pyzmq": version("pyzmq"),
            "observation_bytes": state.nbytes + sum(i.nbytes for i in images.values()),
            "image_shape": IMAGE_SHAPE,
            "images": IMAGES,
            "state_dim": STATE_DIM,
            "chunk": [CHUNK, ACTION_DIM],
            "seconds": args.seconds,
            "settle": args.settle,
            "repeats": args.repeats,
            "client_procs": args.client_procs,
            "warmup_requests": WARMUP_REQUESTS,
            "quick": args.quick,
            "model_ms": MODELS,
        },
        "clients": args.clients,
        "latency_1_client": latency,
        "throughput": throughput,
        "goals": goals,
        "ours_floor": floor,
        "lerobot": LEROBOT_REASON,
        "wall_s": time.perf_counter() - started,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "deploy.json").write_text(json.dumps(result, indent=2))
    print("\n".join(write(RESULTS, result)))


if __name__ == "__main__":
    main()
