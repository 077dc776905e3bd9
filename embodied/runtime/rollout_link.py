"""The rollout's end of its link to the learner: trajectories out over DEALER, numbered and
kept until the learner says a checkpoint holds them; weights in over SUB, latest only.

One IO thread owns both sockets and keeps the link alive while the rollout simulates: it
heartbeats, notices a silent learner within `timeout_s`, says hello again until a learner
(the same one, or one restarted from a checkpoint) welcomes it, and then resends what that
learner lacks. A learner silent for `reconnect_timeout_s` ends the rollout with an error
instead of leaving it waiting forever. See `learner_link` for the delivery marks."""

from __future__ import annotations

import collections
import logging
import os
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import zmq

from embodied.core.codec import DEFAULT_LIMITS, Limits
from embodied.core.protocol import (
    PROTOCOL_VERSION,
    Message,
    ProtocolError,
    decode_message_single,
    encode_message,
    hello_mismatch,
    plain,
)
from embodied.core.sockets import connect, receive
from embodied.runtime.learner_link import EPHEMERAL_HELLO_KEYS, POLL_MS, LinkError

logger = logging.getLogger(__name__)


@dataclass
class Weights:
    learner_id: str
    policy_version: int
    tensors: dict[str, Any]  # as `embodied.runtime.wire.tensors_to_wire` sent them


class RolloutLink:
    def __init__(
        self,
        trajectory_endpoint: str,
        weights_endpoint: str,
        hello: dict[str, Any],
        keys_dir: str | None = None,
        heartbeat_s: float = 1.0,
        timeout_s: float = 10.0,
        reconnect_timeout_s: float = 120.0,
        ack_timeout_s: float = 30.0,
        weights_limits: Limits = DEFAULT_LIMITS,
    ):
        self.hello = plain({"protocol": PROTOCOL_VERSION, "pid": os.getpid(), **hello})
        self.name = hello["sender"]
        self.heartbeat_s, self.timeout_s = heartbeat_s, timeout_s
        self.reconnect_timeout_s, self.ack_timeout_s = reconnect_timeout_s, ack_timeout_s
        self.weights_limits = weights_limits  # the policy's size: `embodied.runtime.wire.weights_limits`
        self._context = zmq.Context()
        self._dealer = self._context.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for a learner that is not there
        self._dealer.setsockopt(zmq.IDENTITY, f"{self.name}-{secrets.token_hex(4)}".encode())
        self._subscriber = self._context.socket(zmq.SUB)
        self._subscriber.setsockopt(zmq.LINGER, 0)
        self._subscriber.setsockopt(zmq.CONFLATE, 1)  # only the newest weights are worth having
        self._subscriber.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            connect(self._dealer, trajectory_endpoint, keys_dir)
            connect(self._subscriber, weights_endpoint, keys_dir)
        except BaseException:
            self._close_sockets()
            raise
        self._condition = threading.Condition()
        self._outbox: collections.OrderedDict[int, list[Any]] = collections.OrderedDict()
        self._new: queue.Queue[int] = queue.Queue()
        self.learner_id: str | None = None
        self.connected = False
        self.closed = False  # the learner asked this rollout to finish
        self.learner_version = 0
        self.last_sent = 0
        self.received = self.consumed = self.durable = 0
        self.weights: Weights | None = None
        self.held: tuple[str, int] = ("", -1)  # (learner_id, policy_version) the rollout acts with
        self.reconnects = 0
        self.resent = 0
        self._error: LinkError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rollout-link", daemon=True)
        self._thread.start()

    # ---- the rollout's side (main thread) --------------------------------------------------
    def wait(self, ready: Callable[[], bool], what: str, timeout_s: float | None = None) -> None:
        """Block until `ready()` (checked under the link's lock) or the learner closes the link."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._condition:
            while not (self.closed or ready()):
                if self._error is not None:
                    raise self._error
                if deadline is not None and time.monotonic() > deadline:
                    raise LinkError(f"waited {timeout_s:.0f} s for {what}")
                self._condition.wait(0.1)
            if self._error is not None:
                raise self._error

    def current_weights(self) -> Weights | None:
        """The newest weights from the learner connected now (not from one before it)."""
        with self._condition:
            if self.weights is not None and self.weights.learner_id == self.learner_id:
                return self.weights
            return None

    def in_flight(self) -> int:
        """Trajectories sent and not yet used by the learner."""
        return self.last_sent - self.consumed

    def send_trajectory(self, body: dict[str, Any]) -> int:
        with self._condition:
            self.last_sent += 1
            seq = self.last_sent
            self._outbox[seq] = encode_message(Message("trajectory", seq, body))
        self._new.put(seq)
        return seq

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        if self._thread.is_alive():  # sockets are not thread-safe: leave them to process exit
            logger.warning("rollout link thread did not stop; leaving its sockets open")
            return
        self._close_sockets()

    def _close_sockets(self) -> None:
        if self._dealer.closed:  # closed before
            return
        self._dealer.close()
        self._subscriber.close()
        self._context.term()

    # ---- the IO thread -----------------------------------------------------------------------
    def _serve(self) -> None:
        last_beat = 0.0
        self._last_heard = self._silent_since = self._progress = time.monotonic()
        poller = zmq.Poller()
        poller.register(self._dealer, zmq.POLLIN)
        poller.register(self._subscriber, zmq.POLLIN)
        try:
            self._send_hello()
            while not self._stop.is_set():
                self._send_new()
                ready = dict(poller.poll(POLL_MS))
                if self._subscriber in ready:
                    self._on_weights()
                if self._dealer in ready:
                    self._last_heard = time.monotonic()
                    self._on_message()
                now = time.monotonic()
                if self.connected and now - self._last_heard > self.timeout_s:
                    logger.warning("learner silent for %.0f s; reconnecting", now - self._last_heard)
                    self._disconnect(since=self._last_heard)
                if not self.connected and now - self._silent_since > self.reconnect_timeout_s:
                    raise LinkError(f"no learner answered for {now - self._silent_since:.0f} s; giving up")
                if now - last_beat >= self.heartbeat_s:
                    last_beat = now
                    if self.connected:
                        self._send(
                            Message("heartbeat", 0, {"learner_id": self.held[0], "policy_version": self.held[1]})
                        )
                    else:
                        self._send_hello()
                if self.connected and self.last_sent > self.received and now - self._progress > self.ack_timeout_s:
                    logger.warning(
                        "no acknowledgement for %.0f s; resending from %d", now - self._progress, self.received + 1
                    )
                    self._resend(self.received + 1)
        except LinkError as error:
            self._fail(error)
        except Exception as error:
            logger.exception("rollout link stopped")
            self._fail(LinkError(f"rollout link stopped: {error}"))

    def _disconnect(self, since: float) -> None:
        with self._condition:
            self.connected = False
        self._silent_since = since

    def _fail(self, error: LinkError) -> None:
        with self._condition:
            self._error = error
            self._condition.notify_all()

    def _send(self, message: Message | list[Any]) -> bool:
        frames = encode_message(message) if isinstance(message, Message) else message
        try:
            self._dealer.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
            return True
        except zmq.Again:  # no learner connected: the resend after the next welcome covers it
            return False

    def _send_hello(self) -> None:
        """Hello with the first sequence number this rollout still holds, so a learner can
        tell trajectories it will get back from ones that died with an earlier rollout."""
        with self._condition:
            first_held = next(iter(self._outbox), self.last_sent + 1)
        self._send(Message("hello", 0, {**self.hello, "first_held": first_held}))

    def _send_new(self) -> None:
        while True:
            try:
                seq = self._new.get_nowait()
            except queue.Empty:
                return
            if self.connected and seq in self._outbox:
                self._send(self._outbox[seq])
                self._progress = time.monotonic()

    def _resend(self, start: int) -> None:
        self._progress = time.monotonic()
        for seq, frames in list(self._outbox.items()):
            if seq >= start:
                self._send(frames)
                self.resent += 1

    def _on_weights(self) -> None:
        try:
            message = decode_message_single(self._subscriber.recv(copy=False).buffer, self.weights_limits)
        except ProtocolError as error:
            logger.warning("dropped malformed weights: %s", error)
            return
        body = message.body
        if message.kind != "weights" or not isinstance(body, dict) or not isinstance(body.get("weights"), dict):
            logger.warning("dropped a '%s' message on the weights channel", message.kind)
            return
        with self._condition:
            self.weights = Weights(str(body["learner_id"]), int(body["policy_version"]), body["weights"])
            self._condition.notify_all()

    def _on_message(self) -> None:
        try:
            _, message = receive(self._dealer)
        except ProtocolError as error:
            logger.warning("malformed message from the learner: %s", error)
            return
        body = message.body if isinstance(message.body, dict) else {}
        if message.kind == "welcome":
            self._on_welcome(body)
        elif message.kind in ("ack", "heartbeat") and self.connected:
            self._update_marks(body)
            if "resend_from" in body:
                self._resend(int(body["resend_from"]))
        elif message.kind == "close":
            self._send(Message("close", 0, {}))  # the learner says close until it hears this answer
            self._dealer.setsockopt(zmq.LINGER, 1000)  # and the answer must leave before the socket goes
            with self._condition:
                self.closed = True
                self._condition.notify_all()
        elif message.kind == "error":
            code = body.get("code")
            if code == "hello":  # a learner that does not know this rollout yet
                if self.connected:
                    self._disconnect(since=time.monotonic())
                    self._send_hello()
            else:
                raise LinkError(f"the learner refused this rollout ({code}): {body.get('message')}")

    def _on_welcome(self, body: dict[str, Any]) -> None:
        differences = hello_mismatch({k: v for k, v in self.hello.items() if k not in EPHEMERAL_HELLO_KEYS}, body)
        if differences:
            raise LinkError("the learner does not match this rollout: " + "; ".join(differences))
        with self._condition:
            restarted = self.learner_id is not None and body["learner_id"] != self.learner_id
            if self.learner_id is not None:
                self.reconnects += 1
            self.learner_id = str(body["learner_id"])
            self.received = self.consumed = self.durable = 0  # a restarted learner's marks may go back
            self._update_marks(body)
            if self.last_sent < self.received:  # a new rollout continues the learner's numbering
                self.last_sent = self.received
            self.connected = True
            self._condition.notify_all()
        logger.info(
            "connected to learner %s%s; resending %d trajectories",
            self.learner_id,
            " (restarted)" if restarted else "",
            max(self.last_sent - self.received, 0),
        )
        self._resend(self.received + 1)

    def _update_marks(self, body: dict[str, Any]) -> None:
        with self._condition:
            if int(body.get("received", 0)) > self.received:
                self._progress = time.monotonic()
            self.received = max(self.received, int(body.get("received", 0)))
            self.consumed = max(self.consumed, int(body.get("consumed", 0)))
            self.durable = max(self.durable, int(body.get("durable", 0)))
            self.learner_version = int(body.get("policy_version", self.learner_version))
            for seq in [s for s in self._outbox if s <= self.durable]:
                del self._outbox[seq]
            self._condition.notify_all()
