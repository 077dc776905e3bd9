import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embodied.core.codec import pack
from embodied.core.protocol import (
    KINDS,
    PROTOCOL_VERSION,
    Message,
    ProtocolError,
    decode_message,
    encode_message,
    error_message,
)

BODIES = {
    "hello": {"role": "env", "protocol": PROTOCOL_VERSION, "num_envs": 4, "action_dim": 8},
    "welcome": {"policy": "mlp_gaussian", "policy_version": 3, "chunk_size": 4, "control_hz": 20.0},
    "command": {"command": "step", "args": {"chunk": np.zeros((4, 2, 8), np.float32)}},
    "result": {
        "state": np.ones((4, 35), np.float32),
        "images": {"base": np.zeros((4, 8, 8, 3), np.uint8)},
        "reward": np.zeros(4, np.float32),
        "terminated": np.zeros(4, bool),
        "instruction": ["push"] * 4,
    },
    "trajectory": {"id": 17, "reward": np.zeros((50, 4), np.float32)},
    "ack": {"ids": [15, 16, 17]},
    "weights": {"policy_version": 4, "tensors": {"actor.0.weight": np.zeros((64, 35), np.float32)}},
    "infer": {
        "tick": 7,
        "observation": {
            "state": np.zeros(8, np.float32),
            "images": {"base": np.zeros((224, 224, 3), np.uint8)},
            "instruction": "pick up the cube",
        },
    },
    "action": {
        "actions": np.zeros((50, 7), np.float32),
        "tick": 7,
        "policy_version": 3,
        "timing": {"queue_ms": 0.1, "infer_ms": 9.8, "server_ms": 10.0, "batch_size": 4},
    },
    "episode": {
        "states": np.zeros((21, 8), np.float32),
        "actions": np.zeros((20, 7), np.float32),
        "rewards": np.zeros(20, np.float32),
        "intervened": np.zeros(20, bool),
        "terminated": True,
        "success": True,
        "instruction": "pick up the cube",
        "policy_version": 3,
    },
    "heartbeat": {"time": 12.5},
    "close": {},
    "error": {"code": "malformed", "message": "bad frame"},
}


def assert_same(got, expected):
    if isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys()
        for key in expected:
            assert_same(got[key], expected[key])
    else:
        assert got == expected


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_message_kind_round_trips(kind):
    assert set(BODIES) == KINDS
    decoded = decode_message(encode_message(Message(kind, 41, BODIES[kind])))
    assert decoded.kind == kind and decoded.seq == 41
    assert_same(decoded.body, BODIES[kind])


@pytest.mark.parametrize(
    "envelope,code",
    [
        ({"v": PROTOCOL_VERSION + 1, "kind": "command", "seq": 0, "body": {}}, "version"),
        ({"v": PROTOCOL_VERSION, "kind": "exec", "seq": 0, "body": {}}, "kind"),
        ({"v": PROTOCOL_VERSION, "kind": "command", "seq": -1, "body": {}}, "seq"),
        ({"v": PROTOCOL_VERSION, "kind": "command", "seq": True, "body": {}}, "seq"),
        ({"v": PROTOCOL_VERSION, "kind": "command"}, "malformed"),
        ([1, 2, 3], "malformed"),
    ],
)
def test_broken_envelopes_get_typed_errors(envelope, code):
    with pytest.raises(ProtocolError) as caught:
        decode_message(pack(envelope))
    assert caught.value.code == code
    reply = decode_message(encode_message(error_message(5, caught.value)))
    assert reply.kind == "error" and reply.body["code"] == code


def test_unknown_kinds_cannot_be_sent():
    with pytest.raises(ProtocolError, match="unknown message kind 'exec'"):
        encode_message(Message("exec", 0, {}))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=256), min_size=0, max_size=4))
def test_random_frames_only_ever_raise_protocol_errors(frames):
    try:
        decode_message(frames)
    except ProtocolError as error:
        assert error.code in {"malformed", "version", "kind", "seq"}


def test_a_version_field_that_is_not_an_integer_is_a_version_error():
    for version in (np.array([1, 2]), np.array([1]), "1", 1.0):
        with pytest.raises(ProtocolError) as caught:
            decode_message(pack({"v": version, "kind": "command", "seq": 0, "body": {}}))
        assert caught.value.code == "version"
