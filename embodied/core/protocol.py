"""The envelope every socket message travels in: `{v, kind, seq, body}` packed by
`embodied.core.codec` (msgpack header + raw array frames).

Decoding checks the protocol version, the kind and the sequence number as well as the codec's
bounds, and raises `ProtocolError` with a machine-readable code, which a server answers with
an `error` message instead of crashing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack

from embodied.core.codec import DEFAULT_LIMITS, CodecError, Frame, Limits, decode, encode, pack, unpack

PROTOCOL_VERSION = 1

# env side <-> rollout, rollout -> learner, learner -> rollout, and both directions' liveness
KINDS = frozenset(
    {
        "hello",
        "welcome",  # handshake: client metadata, server metadata (or an error)
        "command",
        "result",  # rollout -> env side: {command, args}; env side -> rollout: {ok} or {error}
        "infer",
        "action",  # robot -> policy server: observation (+ last step's outcome); reply: chunk + timing
        "episode",  # robot -> a learning policy server: a finished episode's transitions; reply: ack
        "trajectory",
        "ack",  # rollout -> learner with acknowledgement
        "weights",  # learner -> rollout, tagged with policy_version
        "heartbeat",
        "close",
        "error",
    }
)


class ProtocolError(Exception):
    """A message that breaks the protocol. `code` is one of: malformed, version, kind, seq."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.detail = message


@dataclass
class Message:
    kind: str
    seq: int
    body: Any = field(default_factory=dict)


def _envelope(message: Message) -> dict[str, Any]:
    if message.kind not in KINDS:
        raise ProtocolError("kind", f"unknown message kind '{message.kind}'; known: {', '.join(sorted(KINDS))}")
    return {"v": PROTOCOL_VERSION, "kind": message.kind, "seq": int(message.seq), "body": message.body}


def encode_message(message: Message) -> list[Frame]:
    try:
        return pack(_envelope(message))
    except CodecError as error:
        raise ProtocolError("malformed", str(error)) from None


def encode_message_single(message: Message) -> bytes:
    """The message as one buffer, for sockets that keep only single-part messages (a SUB
    socket with CONFLATE, which holds just the latest weights)."""
    try:
        return encode(_envelope(message))
    except CodecError as error:
        raise ProtocolError("malformed", str(error)) from None


def decode_message_single(data: Frame, limits: Limits = DEFAULT_LIMITS) -> Message:
    try:
        envelope = decode(data, limits)
    except CodecError as error:
        raise ProtocolError("malformed", str(error)) from None
    return _check_envelope(envelope)


def decode_message(frames: Sequence[Frame], limits: Limits = DEFAULT_LIMITS) -> Message:
    try:
        envelope = unpack(frames, limits)
    except CodecError as error:
        raise ProtocolError("malformed", str(error)) from None
    return _check_envelope(envelope)


def _check_envelope(envelope: Any) -> Message:
    if not isinstance(envelope, dict) or set(envelope) != {"v", "kind", "seq", "body"}:
        raise ProtocolError("malformed", "expected an envelope map with keys v, kind, seq, body")
    if type(envelope["v"]) is not int or envelope["v"] != PROTOCOL_VERSION:
        raise ProtocolError("version", f"peer speaks protocol version {envelope['v']!r}, this side {PROTOCOL_VERSION}")
    kind, seq = envelope["kind"], envelope["seq"]
    if not isinstance(kind, str) or kind not in KINDS:
        raise ProtocolError("kind", f"unknown message kind {kind!r}")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise ProtocolError("seq", f"sequence number must be a non-negative integer, got {seq!r}")
    return Message(kind, seq, envelope["body"])


def error_message(seq: int, error: ProtocolError) -> Message:
    """The typed reply to a message that could not be used."""
    return Message("error", seq, {"code": error.code, "message": error.detail})


def plain(value: Any) -> Any:
    """`value` as it reads after a trip over the wire (tuples become lists), so handshake
    metadata compares equal however it was built."""
    return msgpack.unpackb(msgpack.packb(value), raw=False, strict_map_key=False)


def hello_mismatch(expected: dict[str, Any], hello: dict[str, Any]) -> list[str]:
    """The handshake keys (protocol, policy, chunk size, env spec) on which two ends differ."""
    return [
        f"{key}: this side {expected[key]!r}, peer {hello.get(key)!r}"
        for key in expected
        if key != "sender" and hello.get(key) != expected[key]
    ]
