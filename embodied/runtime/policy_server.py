"""The policy server (`embodied serve checkpoint=...`): the rollout role in deploy mode.

One ROUTER socket serves many robot clients at once. Requests that arrive together are
answered by one batched forward pass: the server waits at most `batch_window_ms` after the
first request for the other connected clients, and not at all once each has asked.
Every reply carries the server's timing (queueing, inference, total) and the batch size.
A client may have one request pending; a reconnecting client (same session) replaces its
old registration.

    robot client                         policy server
    hello {spec, name}          ->       spec checked against the checkpoint's env
                                <-       welcome {policy, version, chunk size, action space,
                                                  control rate, normalisation id}
    infer {observation, tick    ->       queued, batched with other clients' requests
           [, pending, delay]}           (real-time chunking: the chunk is sampled to agree
                                          with the `pending` actions, the first `delay` held)
                                <-       action {actions (C, A), policy_version, timing}
    heartbeat                   ->  <-   heartbeat {server time, clients, requests served}
    episode {transitions}       ->       only where the server learns (`runtime=robots`,
                                <-       welcome says learning): ack {transitions, policy_version}

A malformed request, or a failed inference, is answered with a typed `error` for its
senders alone; clients beyond `max_clients` are refused; a client silent for
`client_timeout_s` loses its slot. A request with pending actions goes to a policy that
samples with real-time chunking (welcome says `realtime_chunking`), batched with the other
requests that have some (padded to the longest, each row with its own count and delay)."""

from __future__ import annotations

import collections
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

import numpy as np
import zmq

from embodied.core.episodes import EpisodeNotTaken
from embodied.core.errors import ConfigError
from embodied.core.protocol import PROTOCOL_VERSION, Message, ProtocolError, error_message, plain
from embodied.core.sockets import bind, receive, send
from embodied.core.types import ChunkPrefix, EnvSpec, Observation
from embodied.runtime.configs import DeviceConfig
from embodied.runtime.openpi_endpoint import OpenpiConfig

logger = logging.getLogger(__name__)


# What a robot and the policy must agree on; the episode limit is the robot's own business.
SPEC_KEYS = ("state_dim", "action_dim", "action_low", "action_high", "image_shapes", "control_hz")


MAX_INSTRUCTION_CHARS = 4096


@dataclass
class ServeConfig:
    GROUPS_OPTIONAL: ClassVar[bool] = True  # a run's checkpoint names its env and policy
    checkpoint: Optional[str] = None  # a run directory or one checkpoint directory
    # instead of checkpoint: a published model as it is (policy=pi05 policy.pretrained=<dir>)
    # for the robots of `env` (its spec is what clients must match)
    policy: Any = None
    env: Any = None
    endpoint: str = "tcp://127.0.0.1:5555"  # another address needs keys_dir (CURVE)
    keys_dir: Optional[str] = None  # CURVE keys (`embodied keys <dir>`); required off loopback
    runtime: DeviceConfig = field(default_factory=DeviceConfig)  # runtime.device, runtime.torch_threads
    deterministic: bool = True  # the policy's mode rather than a sample
    max_clients: int = 32
    max_batch: int = 64
    batch_window_ms: float = 2.0  # after the first request, wait this long for the others
    client_timeout_s: float = 30.0  # a silent client loses its slot
    stats_every_s: float = 10.0  # log clients, requests/s and mean batch size; 0: never
    # a second endpoint for openpi-client's protocol (openpi.port), bridged to this server
    openpi: OpenpiConfig = field(default_factory=OpenpiConfig)


@dataclass
class ClientState:
    name: str
    session: str
    last_seen: float
    requests: int = 0


@dataclass
class Request:
    identity: bytes
    seq: int
    tick: int
    observation: Observation
    received: float
    pending: np.ndarray | None = None  # real-time chunking: the pending actions (P, A)
    delay: int = 0  # and the ticks until this answer takes over


def padded_prefix(batch: list[Request]) -> ChunkPrefix:
    """The requests' pending actions as one batch: each row padded with its last action to the
    longest, with its own count and delay."""
    longest = max(len(r.pending) for r in batch)
    rows = [np.concatenate([r.pending, np.repeat(r.pending[-1:], longest - len(r.pending), 0)]) for r in batch]
    return ChunkPrefix(
        actions=np.stack(rows),
        delay=np.array([r.delay for r in batch]),
        pending=np.array([len(r.pending) for r in batch]),
    )


@dataclass
class ServerStats:
    requests: int = 0
    batches: int = 0
    batch_sizes: collections.Counter = field(default_factory=collections.Counter)
    refused: int = 0
    malformed: int = 0


def spec_mismatch(expected: EnvSpec, offered: Any) -> list[str]:
    if not isinstance(offered, dict):
        return ["spec: missing"]
    try:
        offered = plain(offered)
    except Exception:  # arrays or other values a spec never holds
        return ["spec: not plain data"]
    ours = plain(expected.to_dict())
    return [
        f"{key}: policy {ours[key]!r}, robot {offered.get(key)!r}" for key in SPEC_KEYS if offered.get(key) != ours[key]
    ]


def check_serve_config(config: ServeConfig) -> None:
    for key in ("max_clients", "max_batch"):
        if getattr(config, key) < 1:
            raise ConfigError(f"'{key}' must be >= 1, got {getattr(config, key)}")
    for key in ("batch_window_ms", "stats_every_s"):
        if getattr(config, key) < 0:
            raise ConfigError(f"'{key}' must be >= 0, got {getattr(config, key)}")
    if config.client_timeout_s <= 0:
        raise ConfigError(f"'client_timeout_s' must be > 0, got {config.client_timeout_s}")


class PolicyServer:
    """`infer` maps a batch `Observation` (numpy) to actions float32 (B, C, A); where the
    metadata says `realtime_chunking` it also takes a `ChunkPrefix` (numpy). A learning
    server also takes finished episodes: `on_episode(client, body)` stores one and returns
    the ack's body, or raises ValueError to refuse it; `max_message_bytes` then makes room
    for them on the wire."""

    def __init__(
        self,
        infer: Callable[[Observation], np.ndarray],
        spec: EnvSpec,
        metadata: dict[str, Any],
        config: ServeConfig,
        on_episode: Callable[["ClientState", Any], dict[str, Any]] | None = None,
        max_message_bytes: int = 0,
    ):
        check_serve_config(config)
        self.infer = infer
        self.on_episode = on_episode
        self.spec = spec
        self.config = config
        self.metadata = {
            "protocol": PROTOCOL_VERSION,
            "server_id": uuid.uuid4().hex[:12],
            **metadata,
            "spec": plain(spec.to_dict()),
            "max_clients": config.max_clients,
            "client_timeout_s": config.client_timeout_s,
        }
        self.chunk_size = int(metadata["chunk_size"])
        self.realtime = bool(metadata.get("realtime_chunking"))
        self.context = zmq.Context.instance()
        self.curve = None
        if config.keys_dir is not None:
            from embodied.core.security import CurveServer

            self.curve = CurveServer(self.context, config.keys_dir)
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        # Nothing larger than an observation of this spec is read off the wire at all.
        image_bytes = sum(math.prod(shape) for shape in spec.image_shapes.values())
        observation_bytes = image_bytes + 4 * spec.state_dim + MAX_INSTRUCTION_CHARS * 4 + (1 << 16)
        self.socket.setsockopt(zmq.MAXMSGSIZE, max(observation_bytes, max_message_bytes))
        self.endpoint = bind(self.socket, config.endpoint, self.curve)
        self.clients: dict[bytes, ClientState] = {}
        self.pending: collections.deque[Request] = collections.deque()
        self.stats = ServerStats()

    # ---- messages ---------------------------------------------------------------------
    def _reply(self, identity: bytes, message: Message) -> None:
        try:
            send(self.socket, message, identity)
        except zmq.ZMQError as error:  # the client went away between request and reply
            logger.info("could not reply to a client: %s", error)

    def _refuse(self, identity: bytes, seq: int, code: str, text: str) -> None:
        self.stats.refused += 1
        self._reply(identity, Message("error", seq, {"code": code, "message": text}))

    def _receive_one(self) -> None:
        try:
            identity, message = receive(self.socket, routed=True)
        except ProtocolError as error:
            self.stats.malformed += 1
            self._reply(getattr(error, "identity", b""), error_message(0, error))
            return
        assert identity is not None
        try:
            self._dispatch(identity, message)
        except Exception as error:  # one client's bad message must not stop the server for all
            logger.warning("a message from a client could not be handled: %r", error)
            self.stats.malformed += 1
            self._refuse(identity, message.seq, "malformed", f"message could not be handled: {error}")

    def _dispatch(self, identity: bytes, message: Message) -> None:
        now = time.monotonic()
        client = self.clients.get(identity)
        if message.kind == "hello":
            self._hello(identity, message, now)
        elif client is None:
            self._refuse(
                identity, message.seq, "hello", "unknown client: say hello first (the server may have restarted)"
            )
        elif message.kind == "infer":
            client.last_seen = now
            self._queue(identity, client, message, now)
        elif message.kind == "heartbeat":
            client.last_seen = now
            self._reply(
                identity,
                Message(
                    "heartbeat",
                    message.seq,
                    {
                        "time": time.time(),
                        "clients": len(self.clients),
                        "requests": self.stats.requests,
                        "policy_version": self.metadata.get("policy_version"),
                    },
                ),
            )
        elif message.kind == "episode" and self.on_episode is not None:
            client.last_seen = now
            try:
                ack = self.on_episode(client, message.body)
            except EpisodeNotTaken as error:  # refused, but nothing wrong with it
                self._refuse(identity, message.seq, "episode", f"episode not taken: {error}")
                return
            except ValueError as error:
                self.stats.malformed += 1
                self._refuse(identity, message.seq, "episode", f"episode refused: {error}")
                return
            self._reply(identity, Message("ack", message.seq, ack))
        elif message.kind == "close":
            self._forget(identity)
        else:
            learning = (
                " (this one serves a fixed checkpoint; learning servers run with `embodied train runtime=robots`)"
            )
            self._refuse(
                identity,
                message.seq,
                "kind",
                f"a policy server does not take '{message.kind}' messages"
                f"{learning if message.kind == 'episode' else ''}",
            )

    def _forget(self, identity: bytes) -> None:
        self.clients.pop(identity, None)
        self.pending = collections.deque(r for r in self.pending if r.identity != identity)

    def _hello(self, identity: bytes, message: Message, now: float) -> None:
        body = message.body if isinstance(message.body, dict) else {}
        session = str(body.get("session", ""))[:64]
        returning = any(state.session == session for state in self.clients.values()) if session else False
        if identity not in self.clients and not returning and len(self.clients) >= self.config.max_clients:
            self._refuse(identity, message.seq, "full", f"the server is full (max_clients={self.config.max_clients})")
            return
        differences = spec_mismatch(self.spec, body.get("spec"))
        if differences:
            self._refuse(
                identity, message.seq, "mismatch", "the robot does not match the policy: " + "; ".join(differences)
            )
            return
        name = str(body.get("name", identity.hex()))[:128]
        session = str(body.get("session", identity.hex()))[:64]
        for other, state in list(self.clients.items()):
            if state.session == session and other != identity:
                self._forget(other)  # the same robot, reconnected on a new socket
        self.clients[identity] = ClientState(name=name, session=session, last_seen=now)
        logger.info("client '%s' connected (%d of at most %d)", name, len(self.clients), self.config.max_clients)
        self._reply(identity, Message("welcome", message.seq, self.metadata))

    def _queue(self, identity: bytes, client: ClientState, message: Message, now: float) -> None:
        try:
            tick, observation = self._parse_infer(message.body)
            pending, delay = self._parse_prefix(message.body)
        except ValueError as error:
            self.stats.malformed += 1
            self._refuse(identity, message.seq, "malformed", str(error))
            return
        if any(request.identity == identity for request in self.pending):
            self._refuse(identity, message.seq, "busy", "one request at a time: wait for the answer to the last one")
            return
        client.requests += 1
        self.pending.append(Request(identity, message.seq, tick, observation, now, pending, delay))

    def _parse_infer(self, body: Any) -> tuple[int, Observation]:
        if not isinstance(body, dict) or not isinstance(body.get("observation"), dict):
            raise ValueError("an infer request needs {observation: {state, images, instruction}, tick}")
        tick = body.get("tick", 0)
        if not isinstance(tick, int) or isinstance(tick, bool):
            raise ValueError(f"tick must be an integer, got {tick!r}")
        raw = body["observation"]
        state = raw.get("state")
        if not isinstance(state, np.ndarray) or state.dtype != np.float32 or state.shape != (self.spec.state_dim,):
            raise ValueError(
                f"observation.state must be float32 ({self.spec.state_dim},), got "
                f"{getattr(state, 'dtype', type(state).__name__)} {getattr(state, 'shape', '')}"
            )
        images = raw.get("images", {})
        if not isinstance(images, dict) or set(images) != set(self.spec.image_shapes):
            raise ValueError(f"observation.images must be exactly {sorted(self.spec.image_shapes)}")
        for name, image in images.items():
            shape = tuple(self.spec.image_shapes[name])
            if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.shape != shape:
                raise ValueError(f"observation.images['{name}'] must be uint8 {shape}")
        instruction = raw.get("instruction", "")
        if not isinstance(instruction, str) or len(instruction) > MAX_INSTRUCTION_CHARS:
            raise ValueError(f"observation.instruction must be a string of at most {MAX_INSTRUCTION_CHARS} characters")
        return tick, Observation(
            state=state[None], images={k: v[None] for k, v in images.items()}, instruction=[instruction]
        )

    def _parse_prefix(self, body: dict) -> tuple[np.ndarray | None, int]:
        """Real-time chunking's pending actions (P, A), 1 <= P <= the chunk size, and the delay
        in ticks, 0 <= delay <= P; both or neither (None, 0)."""
        if "pending" not in body and "delay" not in body:
            return None, 0
        if not self.realtime:
            raise ValueError(
                f"pending actions sent to a policy without real-time chunking "
                f"({self.metadata.get('policy')}, deterministic={self.metadata.get('deterministic')}): "
                "turn broker.realtime off"
            )
        pending, delay = body.get("pending"), body.get("delay")
        width = self.spec.action_dim
        if (
            not isinstance(pending, np.ndarray)
            or pending.dtype != np.float32
            or pending.ndim != 2
            or not 1 <= pending.shape[0] <= self.chunk_size
            or pending.shape[1] != width
            or not np.all(np.isfinite(pending))
        ):
            raise ValueError(
                f"pending must be finite float32 (P, {width}) with 1 <= P <= {self.chunk_size}, got "
                f"{getattr(pending, 'dtype', type(pending).__name__)} {getattr(pending, 'shape', '')}"
            )
        if not isinstance(delay, int) or isinstance(delay, bool) or not 0 <= delay <= pending.shape[0]:
            raise ValueError(f"delay must be an integer in [0, {pending.shape[0]}] (as many as pending), got {delay!r}")
        return pending, delay

    # ---- batching -----------------------------------------------------------------------
    def _drain(self, timeout_s: float) -> None:
        """Take in every message that is ready, waiting up to `timeout_s` for the first."""
        if self.socket.poll(math.ceil(max(timeout_s, 0.0) * 1000)):
            self._receive_one()
            while self.socket.poll(0):
                self._receive_one()

    def _waiting_for_more(self) -> bool:
        asking = {request.identity for request in self.pending}
        return len(self.pending) < self.config.max_batch and len(asking) < len(self.clients)

    def run_once(self, timeout_s: float = 0.1) -> int:
        """Serve at most one batch; returns its size (0 if nothing was asked)."""
        if not self.pending:
            self._drain(timeout_s)
        if self.pending:
            deadline = self.pending[0].received + self.config.batch_window_ms / 1000
            while self._waiting_for_more() and (remaining := deadline - time.monotonic()) > 0:
                self._drain(remaining)
        self._forget_silent_clients()
        if not self.pending:
            return 0
        batch = [self.pending.popleft() for _ in range(min(len(self.pending), self.config.max_batch))]
        self._answer(batch)
        return len(batch)

    def _answer(self, requests: list[Request]) -> None:
        """Answer the requests: one forward pass for those without pending actions, one for
        those with."""
        for guided in (False, True):
            batch = [request for request in requests if (request.pending is not None) == guided]
            if batch:
                self._answer_group(batch)

    def _answer_group(self, batch: list[Request]) -> None:
        start = time.monotonic()
        observation = (
            batch[0].observation
            if len(batch) == 1
            else Observation(
                state=np.concatenate([r.observation.state for r in batch]),
                images={
                    name: np.concatenate([r.observation.images[name] for r in batch]) for name in self.spec.image_shapes
                },
                instruction=[r.observation.instruction[0] for r in batch],
            )
        )
        expected = (len(batch), self.chunk_size, self.spec.action_dim)
        try:
            if batch[0].pending is None:
                actions = np.asarray(self.infer(observation), dtype=np.float32)
            else:
                actions = np.asarray(self.infer(observation, padded_prefix(batch)), dtype=np.float32)
            if actions.shape != expected or not np.all(np.isfinite(actions)):
                raise ValueError(
                    f"the policy returned actions of shape {actions.shape} (expected {expected})"
                    f"{'' if np.all(np.isfinite(actions)) else ' with NaN or infinity'}"
                )
        except Exception as error:  # answered, so no robot waits for a reply that never comes
            logger.exception("inference failed for a batch of %d", len(batch))
            for request in batch:
                self._refuse(request.identity, request.seq, "infer", f"inference failed: {error}")
            return
        infer_ms = (time.monotonic() - start) * 1000
        self.stats.requests += len(batch)
        self.stats.batches += 1
        self.stats.batch_sizes[len(batch)] += 1
        version = self.metadata.get("policy_version")
        for row, request in enumerate(batch):
            done = time.monotonic()
            self._reply(
                request.identity,
                Message(
                    "action",
                    request.seq,
                    {
                        "actions": actions[row],
                        "tick": request.tick,
                        "policy_version": version,
                        "timing": {
                            "queue_ms": (start - request.received) * 1000,
                            "infer_ms": infer_ms,
                            "server_ms": (done - request.received) * 1000,
                            "batch_size": len(batch),
                        },
                    },
                ),
            )

    def _forget_silent_clients(self) -> None:
        now = time.monotonic()
        for identity, client in list(self.clients.items()):
            if now - client.last_seen > self.config.client_timeout_s:
                logger.warning("client '%s' silent for %.0f s: its slot is free", client.name, now - client.last_seen)
                self._forget(identity)

    def serve_forever(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        last_report, served_then = time.monotonic(), 0
        while not should_stop():
            self.run_once(timeout_s=0.1)
            now = time.monotonic()
            if self.config.stats_every_s > 0 and now - last_report >= self.config.stats_every_s:
                rate = (self.stats.requests - served_then) / (now - last_report)
                mean_batch = self.stats.requests / max(self.stats.batches, 1)
                logger.info(
                    "%d clients, %.1f requests/s, mean batch %.2f, %d refused, %d malformed",
                    len(self.clients),
                    rate,
                    mean_batch,
                    self.stats.refused,
                    self.stats.malformed,
                )
                last_report, served_then = now, self.stats.requests

    def close(self) -> None:
        self.socket.close()
        if self.curve is not None:
            self.curve.stop()
