"""The rollout's side of env workers over ZeroMQ: one ROUTER socket (`EnvHub`) that worker
processes (`python -m embodied.sim.worker`) connect to, and one handle per worker with the same
send/receive shape as in-process and pipe workers, so `VectorizedEnv` drives all three alike.

Every reply has a deadline; a worker that exits or goes silent is reported as an
`EnvWorkerError` naming it, never waited on forever."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import zmq

from embodied.core.errors import EnvWorkerError
from embodied.core.protocol import PROTOCOL_VERSION, Message, ProtocolError, hello_mismatch, plain
from embodied.core.sockets import bind, receive, send
from embodied.sim.worker_envs import unwrap_reply


@dataclass
class WorkerPlacement:
    """How env workers start when a runtime places them itself (`runtime=ray`): `launch(worker
    id, serve arguments)` starts one and returns a handle shaped like `subprocess.Popen` (pid,
    poll, returncode, wait, kill). The hub binds on `host`, which workers on other machines
    must reach; off loopback that takes CURVE keys (`keys_dir`)."""

    launch: Callable[[str, dict[str, Any]], Any]
    host: str = "127.0.0.1"
    keys_dir: Optional[str] = None


# Set by the process that builds the env side under a placing runtime, before it builds it.
PLACEMENT: Optional[WorkerPlacement] = None


def worker_command(
    endpoint: str,
    env_config: dict[str, Any],
    env_ids: list[int],
    base_seed: int,
    stream: int,
    worker_id: str,
    keys_dir: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of an env worker process, under `env.python` where the
    env lives in its own virtualenv (LIBERO), else this interpreter."""
    python = env_config.get("python") or sys.executable
    command = [
        python,
        "-m",
        "embodied.sim.worker",
        "--endpoint",
        endpoint,
        "--env",
        json.dumps(env_config),
        "--env-ids",
        *map(str, env_ids),
        "--seed",
        str(base_seed),
        "--stream",
        str(stream),
        "--worker-id",
        worker_id,
        *(["--keys-dir", keys_dir] if keys_dir else []),
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return command, environment


HUB_PREFIX = "embodied-env-"  # <tmp>/embodied-env-<pid>-*: a hub's ipc socket folder


def remove_stale_hubs(root: Path | None = None) -> list[Path]:
    """Remove the socket folders of hubs whose process is gone: a process killed outright (SIGKILL)
    has no chance to remove its own. Returns what was removed."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{HUB_PREFIX}*-*"):
        pid = folder.name.removeprefix(HUB_PREFIX).split("-")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        except PermissionError:  # alive, another user's
            pass
    return removed


class EnvHub:
    def __init__(
        self,
        env_config: dict[str, Any],
        base_seed: int,
        stream: int,
        timeout_s: float,
        endpoint: str | None = None,
        expected_spec: dict[str, Any] | None = None,
    ):
        self.env_config = env_config
        self.spec = plain(expected_spec) if expected_spec is not None else None
        self.base_seed = base_seed
        self.stream = stream
        self.timeout_s = timeout_s
        self._tmp = None
        self.placement = PLACEMENT
        if endpoint is None and self.placement is not None:
            endpoint = f"tcp://{self.placement.host}:*"
        if endpoint is None:
            remove_stale_hubs()
            self._tmp = tempfile.TemporaryDirectory(prefix=f"{HUB_PREFIX}{os.getpid()}-")
            endpoint = f"ipc://{self._tmp.name}/hub"
        keys_dir = self.placement.keys_dir if self.placement is not None else None
        self.curve = None
        if keys_dir is not None:
            from embodied.core.security import CurveServer

            self.curve = CurveServer(zmq.Context.instance(), keys_dir)
        self.socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a gone worker raises
        self.endpoint = bind(self.socket, endpoint, self.curve)
        self.inbox: dict[bytes, collections.deque[Message]] = collections.defaultdict(collections.deque)
        self.known: set[bytes] = set()  # identities of the workers this hub started
        self.last_heard: dict[bytes, float] = {}
        self.seq = 0
        self.count = 0

    def start_worker(self, env_ids: list[int]) -> "SocketWorker":
        """Launch a worker and return its handle at once: it builds its envs while the next
        ones start, and `SocketWorker.wait_ready` checks its hello."""
        identity = f"env-worker-{self.count}".encode()
        self.count += 1
        if self.placement is not None:
            process = self.placement.launch(
                identity.decode(),
                {
                    "endpoint": self.endpoint,
                    "env_config": self.env_config,
                    "env_ids": env_ids,
                    "base_seed": self.base_seed,
                    "stream": self.stream,
                    "worker_id": identity.decode(),
                    "keys_dir": self.placement.keys_dir,
                },
            )
        else:
            command, environment = worker_command(
                self.endpoint, self.env_config, env_ids, self.base_seed, self.stream, identity.decode()
            )
            process = subprocess.Popen(command, env=environment)
        self.known.add(identity)
        return SocketWorker(self, identity, process)

    def _handshake(self, worker: "SocketWorker") -> None:
        """Every worker must serve envs of one spec (observation and action space, control
        rate): the first worker's, or `expected_spec`. A mismatch fails on both ends."""
        hello = worker.wait_for("hello")  # the envelope check has already matched protocol versions
        spec = plain(hello.body.get("spec")) if isinstance(hello.body, dict) else None
        if self.spec is None:
            self.spec = spec
        differences = hello_mismatch(self.spec, spec) if isinstance(spec, dict) else ["spec: missing"]
        if differences:
            text = f"{worker.name} serves envs that do not match the others: " + "; ".join(differences)
            send(self.socket, Message("error", 0, {"code": "mismatch", "message": text}), worker.identity)
            raise EnvWorkerError(text)
        send(self.socket, Message("welcome", 0, {"protocol": PROTOCOL_VERSION, "spec": self.spec}), worker.identity)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def pump(self, timeout_s: float) -> None:
        """Move at most one incoming message into its sender's inbox. A malformed message
        becomes an `error` in its sender's inbox; messages from unknown peers are dropped."""
        if not self.socket.poll(int(timeout_s * 1000)):
            return
        try:
            identity, message = receive(self.socket, routed=True)
        except ProtocolError as error:
            identity = getattr(error, "identity", None)
            message = Message("error", 0, {"code": error.code, "message": error.detail})
        if identity not in self.known:
            return
        self.last_heard[identity] = time.monotonic()
        if message.kind != "heartbeat":
            self.inbox[identity].append(message)

    def close(self) -> None:
        self.socket.close()
        if self.curve is not None:
            self.curve.stop()
        if self._tmp is not None:
            self._tmp.cleanup()


class SocketWorker:
    def __init__(self, hub: EnvHub, identity: bytes, process: Any):  # a Popen or a placement's handle
        self.hub = hub
        self.identity = identity
        self.process = process
        self.name = f"{identity.decode()} (pid {process.pid})"
        self.pending: int | None = None

    def wait_ready(self) -> None:
        """Until the worker has built its envs and its hello has passed the hub's spec check."""
        try:
            self.hub._handshake(self)
        except BaseException:
            self.close()
            raise

    def wait_for(self, kind: str, seq: int | None = None) -> Message:
        deadline = time.monotonic() + self.hub.timeout_s
        inbox = self.hub.inbox[self.identity]
        while True:
            while inbox:
                message = inbox.popleft()
                if message.kind == kind and (seq is None or message.seq == seq):
                    return message
                if message.kind == "error":
                    raise EnvWorkerError(f"{self.name} refused a message: {message.body}")
            if self.process.poll() is not None:
                raise EnvWorkerError(f"{self.name} died (exit code {self.process.returncode})")
            if time.monotonic() > deadline:
                heard = self.hub.last_heard.get(self.identity)
                silence = f"last heard {time.monotonic() - heard:.0f} s ago" if heard else "never heard from"
                raise EnvWorkerError(f"{self.name} gave no '{kind}' within {self.hub.timeout_s:.0f} s ({silence})")
            self.hub.pump(timeout_s=0.05)

    def send(self, command: str, **args: Any) -> None:
        self.pending = self.hub.next_seq()
        try:
            send(self.hub.socket, Message("command", self.pending, {"command": command, "args": args}), self.identity)
        except zmq.ZMQError as error:
            if self.process.poll() is not None:
                raise EnvWorkerError(f"{self.name} died (exit code {self.process.returncode})") from None
            raise EnvWorkerError(f"{self.name} is unreachable: {error}") from None

    def receive(self) -> Any:
        return unwrap_reply(self.wait_for("result", self.pending).body, self.name)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                send(self.hub.socket, Message("close", self.hub.next_seq(), {}), self.identity)
            except zmq.ZMQError:
                pass
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.hub.known.discard(self.identity)
        self.hub.inbox.pop(self.identity, None)
        self.hub.last_heard.pop(self.identity, None)
