"""The robot's connection to a policy server: handshake, one request in flight, validated
replies, and reconnection that never blocks the control loop.

A request that gets no answer within `request_timeout_s` means the server is gone: the socket
is dropped (so queued stale requests are never delivered) and a new one says hello every
`retry_s` until a server welcomes it; the session id in the hello lets the server replace
the old registration, and a server that comes back with another policy is refused. Meanwhile
`poll` returns nothing and the control loop's watchdog holds the robot safe. Numpy and pyzmq
only: no torch on the robot."""

from __future__ import annotations

import collections
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from embodied.core.errors import EmbodiedError
from embodied.core.protocol import PROTOCOL_VERSION, Message, ProtocolError, plain
from embodied.core.sockets import connect, receive, send
from embodied.core.types import EnvSpec
from embodied.robots.base import RobotObservation

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  # while nothing is asked, so the server keeps this robot's slot
MAX_REPLY_BYTES = 64 << 20
TIMING_KEYS = ("queue_ms", "infer_ms", "server_ms", "batch_size")


class ServerError(EmbodiedError):
    """The server refused this robot (spec mismatch, full) or could not be reached."""


@dataclass
class ActionReply:
    actions: np.ndarray  # float32 (C, A)
    tick: int  # the tick of the observation it answers
    policy_version: int | None
    round_trip_ms: float
    timing: dict[str, float]


class NoPolicy:
    """The policy side when an operator alone drives (`embodied teleop`, `embodied collect`):
    no server and no actions, so every command is the operator's, through the same safety
    layer, and the watchdog holds the robot whenever the operator lets go."""

    endpoint = "none"
    in_flight = None
    learning = False

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def connect(self, timeout_s: float = 0.0) -> dict[str, Any]:
        return {"policy": "operator", "policy_version": None, "chunk_size": 1, "normalization_id": None}

    def ping(self, timeout_s: float = 0.0) -> float:
        return 0.0

    def maintain(self) -> None:
        pass

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass

    def request(
        self,
        observation: RobotObservation,
        tick: int,
        instruction: str,
        feedback: dict[str, Any] | None = None,
        pending: tuple[np.ndarray, int] | None = None,
    ) -> bool:
        return False

    def poll(self, timeout_s: float) -> None:
        if timeout_s > 0:  # the control loop sleeps until its next tick through here
            time.sleep(timeout_s)
        return None


class PolicyClient:
    def __init__(
        self,
        endpoint: str,
        spec: EnvSpec,
        name: str = "robot",
        keys_dir: str | None = None,
        request_timeout_s: float = 2.0,
        retry_s: float = 1.0,
    ):
        self.endpoint = endpoint
        self.spec = spec
        self.name = name
        self.keys_dir = keys_dir
        self.request_timeout_s = request_timeout_s
        self.retry_s = retry_s
        self.context = zmq.Context.instance()
        self.socket: zmq.Socket | None = None
        self.metadata: dict[str, Any] | None = None  # the server's welcome; None while not connected
        self.first_metadata: dict[str, Any] | None = None  # what a reconnect must find again
        self.session = uuid.uuid4().hex  # one per robot run: the server replaces our old slot on reconnect
        self.seq = 0
        self.tick = 0  # infer()'s own count of requests
        self.last_error = ""  # the server's last error reply, "code: message"
        self.in_flight: tuple[int, int, float] | None = None  # (seq, tick, sent at)
        self._hello_seq = 0
        self._hello_sent = 0.0
        self._last_sent = 0.0
        self.counts: collections.Counter[str] = collections.Counter(
            {"malformed_replies": 0, "server_errors": 0, "timeouts": 0, "reconnects": 0}
        )

    @property
    def connected(self) -> bool:
        return self.metadata is not None

    # ---- connection -----------------------------------------------------------------------
    def _open(self) -> None:
        self.close()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
        self.socket.setsockopt(zmq.IDENTITY, f"{self.name}-{uuid.uuid4().hex[:8]}".encode())
        connect(self.socket, self.endpoint, self.keys_dir)
        self.metadata = None
        self.in_flight = None
        self._say_hello()

    def _send(self, kind: str, body: dict[str, Any]) -> int:
        assert self.socket is not None
        self.seq += 1
        send(self.socket, Message(kind, self.seq, body))
        self._last_sent = time.monotonic()
        return self.seq

    def _say_hello(self) -> None:
        self._hello_seq = self._send(
            "hello",
            {
                "protocol": PROTOCOL_VERSION,
                "role": "robot",
                "name": self.name,
                "session": self.session,
                "spec": plain(self.spec.to_dict()),
            },
        )
        self._hello_sent = time.monotonic()

    def connect(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Handshake, waiting up to `timeout_s`; returns the server's metadata."""
        self._open()
        deadline = time.monotonic() + timeout_s
        while not self.connected:
            if time.monotonic() > deadline:
                raise ServerError(
                    f"no policy server answered at {self.endpoint} within {timeout_s:.0f} s; "
                    f"start one with `embodied serve checkpoint=<run dir> endpoint={self.endpoint}`"
                )
            self.poll(0.05)
        return self.metadata  # type: ignore[return-value]

    def _reconnect(self, why: str) -> None:
        logger.warning("policy server %s: %s; reconnecting", self.endpoint, why)
        self.counts["reconnects"] += 1
        self._open()

    def maintain(self) -> None:
        """Call every tick: detects a silent server, retries the handshake, and keeps the
        slot alive with a heartbeat while nothing is asked (an e-stop, a long reset)."""
        now = time.monotonic()
        if self.in_flight is not None and now - self.in_flight[2] > self.request_timeout_s:
            self.counts["timeouts"] += 1
            self._reconnect(f"no answer within {self.request_timeout_s:.1f} s")
        elif not self.connected and now - self._hello_sent > self.retry_s:
            self._open()
        elif self.connected and self.in_flight is None and now - self._last_sent > HEARTBEAT_S:
            self._send("heartbeat", {"time": time.time()})

    def cancel(self) -> None:
        """Give up on the request in flight (a new episode); its late answer is ignored."""
        self.in_flight = None

    def close(self) -> None:
        if self.socket is not None:
            if self.connected:
                try:
                    self._send("close", {})
                except zmq.ZMQError:
                    pass
            self.socket.close()
            self.socket = None
        self.metadata = None
        self.in_flight = None

    # ---- requests -------------------------------------------------------------------------
    def request(
        self,
        observation: RobotObservation,
        tick: int,
        instruction: str,
        feedback: dict[str, Any] | None = None,
        pending: tuple[np.ndarray, int] | None = None,
    ) -> bool:
        """Send an observation unless one is on its way or the server is not connected.
        `feedback`: what the robot did since the last request (reward, executed action,
        intervened ticks), for a learner on the other side. `pending`: real-time chunking's
        (actions (P, A) of the executing chunk from `tick` on, delay in ticks)."""
        if not self.connected or self.in_flight is not None:
            return False
        body = {
            "tick": tick,
            "observation": {
                "state": np.asarray(observation.state, dtype=np.float32),
                "images": observation.images,
                "instruction": instruction,
            },
        }
        if feedback:
            body["feedback"] = feedback
        if pending is not None:
            body["pending"], body["delay"] = np.asarray(pending[0], dtype=np.float32), int(pending[1])
        self.in_flight = (self._send("infer", body), tick, time.monotonic())
        return True

    def infer(
        self, observation: RobotObservation | dict[str, Any], instruction: str = "", timeout_s: float | None = None
    ) -> np.ndarray:
        """One call from an observation to an action chunk, float32 (C, A): connects on first
        use, sends the observation and blocks for its answer. For scripts and evaluation
        harnesses; a control loop uses `request` and `poll` so that it never blocks.
        `observation`: a RobotObservation or `{state, images}`. A refused request, or a server
        that does not answer within `timeout_s` (default `request_timeout_s`), is a
        ServerError; the next call reconnects."""
        if isinstance(observation, dict):
            observation = RobotObservation(
                state=np.asarray(observation["state"], dtype=np.float32), images=dict(observation.get("images", {}))
            )
        timeout_s = self.request_timeout_s if timeout_s is None else timeout_s
        if not self.connected:
            self.connect(timeout_s)
        self.cancel()  # an answer to an earlier, abandoned request is not this one's
        self.tick += 1
        if not self.request(observation, self.tick, instruction):
            raise ServerError(f"the policy server at {self.endpoint} is not connected")
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            reply = self.poll(remaining)
            if reply is not None:
                return reply.actions
            if self.in_flight is None:  # answered by an error, or the connection was reset
                raise ServerError(
                    f"the policy server at {self.endpoint} did not answer with an action: "
                    f"{self.last_error or 'the connection was reset'}"
                )
        self.counts["timeouts"] += 1
        self.close()
        raise ServerError(f"the policy server at {self.endpoint} gave no action within {timeout_s:.1f} s")

    def poll(self, timeout_s: float) -> ActionReply | None:
        """Handle what arrives within `timeout_s`; returns a valid answer to the request in
        flight, if one came. Anything malformed is counted, logged and dropped."""
        if self.socket is None:
            return None
        deadline = time.monotonic() + timeout_s
        while self.socket is not None and self.socket.poll(max(math.ceil((deadline - time.monotonic()) * 1000), 0)):
            try:
                _, message = receive(self.socket)
            except ProtocolError as error:
                self._reject(f"undecodable reply: {error}")
                continue
            reply = self._handle(message)
            if reply is not None:
                return reply
            if time.monotonic() >= deadline:
                break  # a flood of messages must not hold up the control loop
        return None

    def _reject(self, why: str) -> None:
        self.counts["malformed_replies"] += 1
        logger.warning("rejected a reply from the policy server: %s", why)
        self.in_flight = None  # ask again rather than wait for an answer that will not come

    def _handle(self, message: Message) -> ActionReply | None:
        if message.kind == "welcome":
            if message.seq == self._hello_seq:
                self._welcome(message.body)
        elif message.kind == "error":
            body = message.body if isinstance(message.body, dict) else {}
            code, text = body.get("code"), str(body.get("message", message.body))[:500]
            if code in ("mismatch", "full", "version"):
                raise ServerError(f"the policy server at {self.endpoint} refused this robot: {text}")
            self.counts["server_errors"] += 1
            self.last_error = f"{code}: {text}"
            logger.warning("policy server error (%s): %s", code, text)
            if code == "hello":
                self._reconnect("the server does not know this client")
            elif self.in_flight is not None and message.seq == self.in_flight[0]:
                self.in_flight = None  # that request is answered, by an error: ask again
        elif message.kind == "action":
            return self._action(message)
        elif message.kind != "heartbeat":
            self._reject(f"unexpected message kind '{message.kind}'")
        return None

    def _welcome(self, body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("chunk_size"), int) or body["chunk_size"] < 1:
            self._reject(f"a welcome without a valid chunk_size: {body!r:.200}")
            return
        if self.first_metadata is None:
            self.first_metadata = body
            logger.info(
                "connected to policy '%s' version %s at %s",
                body.get("policy"),
                body.get("policy_version"),
                self.endpoint,
            )
        else:
            changed = [
                key
                for key in ("policy", "chunk_size", "normalization_id", "spec")
                if body.get(key) != self.first_metadata.get(key)
            ]
            if changed:
                raise ServerError(
                    f"the policy server at {self.endpoint} came back with another policy "
                    f"({', '.join(changed)} changed); restart the robot client to use it"
                )
            if body.get("policy_version") != self.first_metadata.get("policy_version"):
                logger.warning(
                    "the policy server came back with policy version %s (was %s)",
                    body.get("policy_version"),
                    self.first_metadata.get("policy_version"),
                )
        self.metadata = body

    def _action(self, message: Message) -> ActionReply | None:
        if self.in_flight is None or message.seq != self.in_flight[0]:
            return None  # the answer to a request already given up on
        seq, tick, sent = self.in_flight
        body = message.body
        if not isinstance(body, dict):
            self._reject("an action reply that is not a map")
            return None
        actions = body.get("actions")
        expected = (self.metadata["chunk_size"], self.spec.action_dim) if self.metadata else None
        if not isinstance(actions, np.ndarray) or actions.dtype != np.float32 or actions.shape != expected:
            self._reject(
                f"actions must be float32 {expected}, got "
                f"{getattr(actions, 'dtype', type(actions).__name__)} {getattr(actions, 'shape', '')}"
            )
            return None
        if not np.all(np.isfinite(actions)):
            self._reject("actions contain NaN or infinity")
            return None
        timing = body.get("timing") if isinstance(body.get("timing"), dict) else {}
        version = body.get("policy_version")
        self.in_flight = None
        return ActionReply(
            actions=actions,
            tick=tick,
            policy_version=version if isinstance(version, int) else None,
            round_trip_ms=(time.monotonic() - sent) * 1000,
            timing={
                key: float(timing[key])
                for key in TIMING_KEYS
                if isinstance(timing.get(key), (int, float)) and math.isfinite(timing[key])
            },
        )

    @property
    def learning(self) -> bool:
        """The server learns from this robot's episodes (`embodied train runtime=robots`)."""
        return bool(self.metadata and self.metadata.get("learning"))

    def send_episode(self, episode: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Hand a finished episode (`embodied.core.episodes`) to a learning server and wait
        for its ack; ServerError says why it was not taken (refused, no answer, not connected)."""
        if not self.connected:
            raise ServerError("not connected to the policy server")
        self.in_flight = None  # between episodes: no action is awaited
        seq = self._send("episode", episode)
        deadline = time.monotonic() + timeout_s
        while self.socket is not None and (remaining := deadline - time.monotonic()) > 0:
            if not self.socket.poll(max(math.ceil(remaining * 1000), 1)):
                continue
            try:
                _, message = receive(self.socket)
            except ProtocolError as error:
                self._reject(f"undecodable reply: {error}")
                continue
            if message.seq == seq and message.kind == "ack":
                return message.body if isinstance(message.body, dict) else {}
            if message.seq == seq and message.kind == "error":
                body = message.body if isinstance(message.body, dict) else {}
                raise ServerError(str(body.get("message", message.body))[:500])
            self._handle(message)
        self.counts["timeouts"] += 1
        raise ServerError(f"no answer to the episode within {timeout_s:.0f} s")

    def ping(self, timeout_s: float = 5.0) -> float:
        """Round trip of a heartbeat in milliseconds (a health check); raises if none comes."""
        assert self.socket is not None
        start = time.monotonic()
        seq = self._send("heartbeat", {"time": time.time()})
        deadline = start + timeout_s
        while time.monotonic() < deadline:
            if self.socket.poll(50):
                _, message = receive(self.socket)
                if message.kind == "heartbeat" and message.seq == seq:
                    return (time.monotonic() - start) * 1000
                self._handle(message)
        raise ServerError(f"the policy server at {self.endpoint} did not answer a ping within {timeout_s:.0f} s")
