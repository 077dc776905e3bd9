"""The learner's end of its link to rollout workers: trajectories in over a ROUTER socket,
acknowledged; weights out over PUB, each tagged with its policy_version.

One IO thread owns both sockets, so heartbeats are answered while the learner computes an
update. Delivery is go-back-N per rollout (named in its hello): the learner accepts only the
next sequence number, asks for a resend from the first one it misses, and acknowledges marks:

    received  arrived and queued for the learner
    consumed  used in an update, or dropped as too stale (the sender's flow control)
    durable   held by a saved checkpoint (the sender may forget trajectories up to it)

A learner restarted from a checkpoint welcomes its rollout with the checkpoint's marks, so it
gets back exactly the trajectories the checkpoint lacks and uses none of them twice.

Trajectories travel over ROUTER/DEALER rather than PUSH/PULL, which has no way back for acknowledgements:
one connection carries data, acks and heartbeats and tells rollouts apart."""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq

from embodied.core.errors import EmbodiedError
from embodied.core.protocol import (
    PROTOCOL_VERSION,
    Message,
    ProtocolError,
    encode_message_single,
    error_message,
    hello_mismatch,
    plain,
)
from embodied.core.security import CurveServer
from embodied.core.sockets import bind, receive, send

logger = logging.getLogger(__name__)

POLL_MS = 10


# Hello keys that describe the connection rather than what must match on both ends.
EPHEMERAL_HELLO_KEYS = ("sender", "pid", "first_held")


class LinkError(EmbodiedError):
    """The link cannot go on: a peer that does not match, or one that stays silent."""


@dataclass
class Delivery:
    sender: str
    seq: int
    body: Any


@dataclass
class _Sender:
    identity: bytes
    received: int
    consumed: int
    durable: int
    last_heard: float
    held: tuple[str, int] = ("", -1)  # (learner_id, policy_version) of the weights the rollout holds
    gap_reported: int = 0  # the resend point last asked for, so one gap asks once
    finished: bool = False  # the rollout answered 'close': it is exiting


class LearnerLink:
    def __init__(
        self,
        trajectory_endpoint: str,
        weights_endpoint: str,
        expected_hello: dict[str, Any],
        delivered: dict[str, int] | None = None,
        policy_version: int = 0,
        keys_dir: str | None = None,
        heartbeat_s: float = 1.0,
    ):
        self.learner_id = secrets.token_hex(8)  # tells a restarted learner from the one before
        self.heartbeat_s = heartbeat_s
        self._expected = plain(expected_hello)
        self._context = zmq.Context()
        self._curve: CurveServer | None = None
        self._router = self._context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting rollout takes its name back
        self._publisher = self._context.socket(zmq.PUB)
        self._publisher.setsockopt(zmq.LINGER, 0)
        try:
            self._curve = CurveServer(self._context, keys_dir) if keys_dir else None
            self.trajectory_endpoint = self._bind(self._router, trajectory_endpoint)
            self.weights_endpoint = self._bind(self._publisher, weights_endpoint)
        except BaseException:
            self._close_sockets()
            raise
        self._delivered = dict(delivered or {})
        self._senders: dict[str, _Sender] = {}
        self._names: dict[bytes, str] = {}
        self._policy_version = policy_version
        self._weights: bytes | None = None
        self._last_publish = 0.0
        self._deliveries: queue.Queue[Delivery] = queue.Queue()
        self._requests: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._hello = threading.Event()
        self._error: LinkError | None = None
        self._stop = threading.Event()
        self._closing = False  # 'close' is sent, and sent again each heartbeat until answered
        self._rollouts_finished = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="learner-link", daemon=True)
        self._thread.start()

    def _bind(self, socket: zmq.Socket, endpoint: str) -> str:
        try:
            return bind(socket, endpoint, self._curve)
        except zmq.ZMQError as error:
            raise LinkError(f"cannot bind {endpoint}: {error}; is another learner of this run still running?") from None

    # ---- the learner's side (main thread) --------------------------------------------------
    def wait_hello(self, timeout_s: float) -> dict[str, Any] | None:
        """The handshake metadata of the first rollout to connect; None if none within `timeout_s`."""
        connected = self._hello.wait(timeout_s)
        self._raise_error()
        return dict(self._expected) if connected else None

    def next_trajectory(self, timeout_s: float) -> Delivery | None:
        self._raise_error()
        try:
            return self._deliveries.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def consumed(self, delivery: Delivery, policy_version: int, durable: bool = False) -> None:
        """`delivery` is used (or dropped): move the consumed mark, and the durable one when
        no checkpoint will hold it anyway."""
        with self._lock:
            self._policy_version = max(self._policy_version, policy_version)
            state = self._senders[delivery.sender]
            state.consumed = max(state.consumed, delivery.seq)
            if durable:
                state.durable = state.consumed
        self._requests.put(("ack", delivery.sender))

    def delivery_state(self) -> dict[str, int]:
        """Consumed marks per rollout, to save in a checkpoint."""
        with self._lock:
            return {**self._delivered, **{name: s.consumed for name, s in self._senders.items()}}

    def checkpointed(self, state: dict[str, int]) -> None:
        """A checkpoint holding `state` (from `delivery_state`) is saved: those are durable."""
        with self._lock:
            self._delivered.update(state)
            for name, seq in state.items():
                if name in self._senders:
                    self._senders[name].durable = max(self._senders[name].durable, seq)
        for name in state:
            self._requests.put(("ack", name))

    def publish(self, policy_version: int, weights: dict[str, Any]) -> None:
        message = Message(
            "weights",
            policy_version,
            {"learner_id": self.learner_id, "policy_version": policy_version, "weights": weights},
        )
        self._requests.put(("weights", (policy_version, encode_message_single(message))))

    def last_heard(self, sender: str) -> float | None:
        with self._lock:
            state = self._senders.get(sender)
            return state.last_heard if state else None

    def close(self, tell_rollouts: bool = True, finish_timeout_s: float = 15.0) -> None:
        """Stop serving; `tell_rollouts` asks connected rollouts to finish and exit, and waits
        up to `finish_timeout_s` for each to answer, saying 'close' again every heartbeat: a
        single 'close' can be lost when the sockets shut soon after it on a loaded machine."""
        if tell_rollouts:
            if self._thread.is_alive():
                self._requests.put(("close", None))
                self._rollouts_finished.wait(timeout=finish_timeout_s)
            if not self._rollouts_finished.is_set():
                with self._lock:
                    silent = sorted(name for name, state in self._senders.items() if not state.finished)
                logger.warning(
                    "rollouts %s did not confirm that they finished (%s)",
                    ", ".join(silent) or "?",
                    self._error or f"no answer to 'close' within {finish_timeout_s:.0f} s",
                )
        self._stop.set()
        self._thread.join(timeout=5.0)
        if self._thread.is_alive():  # sockets are not thread-safe: leave them to process exit
            logger.warning("learner link thread did not stop; leaving its sockets open")
            return
        self._close_sockets()

    def _close_sockets(self) -> None:
        if self._router.closed:  # closed before
            return
        self._router.setsockopt(zmq.LINGER, 1000)  # let a final 'close' reach the rollouts
        self._router.close()
        self._publisher.close()
        if self._curve is not None:
            self._curve.stop()
        self._context.term()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    # ---- the IO thread -----------------------------------------------------------------------
    def _serve(self) -> None:
        last_beat = 0.0
        try:
            while not self._stop.is_set():
                self._handle_requests()
                if self._router.poll(POLL_MS):
                    self._handle_message()
                if time.monotonic() - last_beat >= self.heartbeat_s:
                    last_beat = time.monotonic()
                    self._beat()
        except Exception as error:  # the link is gone; tell the learner instead of dying quietly
            logger.exception("learner link stopped")
            self._error = LinkError(f"learner link stopped: {error}")

    def _send(self, identity: bytes, message: Message) -> None:
        try:
            send(self._router, message, identity)
        except zmq.ZMQError as error:  # a peer gone mid-reply; it will reconnect or be replaced
            logger.debug("could not reply to %r: %s", identity, error)

    def _marks(self, state: _Sender) -> dict[str, int]:
        with self._lock:
            return {
                "received": state.received,
                "consumed": state.consumed,
                "durable": state.durable,
                "policy_version": self._policy_version,
            }

    def _handle_requests(self) -> None:
        while True:
            try:
                kind, payload = self._requests.get_nowait()
            except queue.Empty:
                return
            if kind == "weights":
                version, self._weights = payload
                with self._lock:
                    self._policy_version = max(self._policy_version, version)
                self._publish()
            elif kind == "ack" and payload in self._senders:
                state = self._senders[payload]
                self._send(state.identity, Message("ack", state.consumed, self._marks(state)))
            elif kind == "close":
                self._closing = True
                self._tell_rollouts_to_finish()

    def _tell_rollouts_to_finish(self) -> None:
        unfinished = [state for state in self._senders.values() if not state.finished]
        for state in unfinished:
            self._send(state.identity, Message("close", 0, {}))
        if not unfinished:
            self._rollouts_finished.set()

    def _publish(self) -> None:
        if self._weights is not None:
            self._publisher.send(self._weights, copy=False)
            self._last_publish = time.monotonic()

    def _beat(self) -> None:
        if self._closing:
            self._tell_rollouts_to_finish()
        for state in list(self._senders.values()):
            self._send(state.identity, Message("heartbeat", 0, self._marks(state)))
        # A subscriber that joined after the last update, or missed it, gets the latest again.
        behind = any(s.held != (self.learner_id, self._policy_version) for s in self._senders.values())
        if behind and time.monotonic() - self._last_publish >= self.heartbeat_s:
            self._publish()

    def _handle_message(self) -> None:
        try:
            identity, message = receive(self._router, routed=True)
        except ProtocolError as error:
            identity = getattr(error, "identity", None)
            if identity is not None:
                self._send(identity, error_message(0, error))
            return
        if message.kind == "hello":
            self._on_hello(identity, message.body)
            return
        name = self._names.get(identity)
        if name is None:  # e.g. a rollout that was talking to this learner's predecessor
            self._send(identity, Message("error", message.seq, {"code": "hello", "message": "say hello first"}))
            return
        state = self._senders[name]
        with self._lock:
            state.last_heard = time.monotonic()
        if message.kind == "trajectory":
            self._on_trajectory(name, state, message)
        elif message.kind == "heartbeat" and isinstance(message.body, dict):
            state.held = (str(message.body.get("learner_id", "")), int(message.body.get("policy_version", -1)))
        elif message.kind == "close":
            state.finished = True
            logger.info("rollout %s finished", name)
            if self._closing and all(s.finished for s in self._senders.values()):
                self._rollouts_finished.set()

    def _on_hello(self, identity: bytes, hello: Any) -> None:
        if not isinstance(hello, dict) or not isinstance(hello.get("sender"), str):
            self._send(identity, Message("error", 0, {"code": "malformed", "message": "hello needs a sender name"}))
            return
        differences = hello_mismatch(self._expected, hello)
        if differences:
            text = f"rollout {hello['sender']} does not match this learner: " + "; ".join(differences)
            self._send(identity, Message("error", 0, {"code": "mismatch", "message": text}))
            self._error = LinkError(text)
            return
        if not self._hello.is_set():
            self._expected = {k: v for k, v in hello.items() if k not in EPHEMERAL_HELLO_KEYS}
        name = hello["sender"]
        with self._lock:
            old = self._senders.get(name)
            durable = old.durable if old else self._delivered.get(name, 0)
            consumed = old.consumed if old else durable
            received = old.received if old else consumed
            first_held = int(hello.get("first_held", received + 1))
            if first_held > received + 1:
                # The rollout process that sent these died before a checkpoint held them, and
                # this learner's state holds none of them: skipping uses none twice.
                logger.warning(
                    "trajectories %d-%d of %s died with an earlier rollout process; skipping them",
                    received + 1,
                    first_held - 1,
                    name,
                )
                received = consumed = first_held - 1
            state = _Sender(identity, received, consumed, durable, time.monotonic())
            self._senders[name] = state
        self._names = {i: n for i, n in self._names.items() if n != name}
        self._names[identity] = name
        welcome = {"learner_id": self.learner_id, "protocol": PROTOCOL_VERSION, **self._expected, **self._marks(state)}
        self._send(identity, Message("welcome", 0, welcome))
        self._hello.set()
        self._publish()
        logger.info("rollout %s connected (received through %d)", name, received)

    def _on_trajectory(self, name: str, state: _Sender, message: Message) -> None:
        if message.seq == state.received + 1:
            state.received = message.seq
            state.gap_reported = 0
            self._deliveries.put(Delivery(name, message.seq, message.body))
            self._send(state.identity, Message("ack", message.seq, self._marks(state)))
        elif message.seq > state.received + 1 and state.gap_reported != state.received + 1:
            state.gap_reported = state.received + 1
            self._send(
                state.identity, Message("ack", message.seq, {**self._marks(state), "resend_from": state.received + 1})
            )
        # a sequence number at or below `received` is a resend this learner already has
