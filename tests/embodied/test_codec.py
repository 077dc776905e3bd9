import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embodied.core.codec import CodecError, Limits, decode, encode, pack, unpack


def test_nested_messages_with_arrays_round_trip_exactly():
    message = {
        "state": np.arange(12, dtype=np.float32).reshape(3, 4),
        "done": np.array([True, False]),
        "nested": [{"x": np.int64(3)}, "text", None],
        "image": np.zeros((2, 4, 4, 3), np.uint8),
        "empty": np.zeros((0, 8), np.float32),
        "strided": np.arange(10.0)[::2],
    }
    for decoded in (decode(encode(message)), unpack(pack(message))):
        np.testing.assert_array_equal(decoded["state"], message["state"])
        assert decoded["state"].dtype == np.float32 and decoded["done"].dtype == bool
        assert decoded["nested"] == [{"x": 3}, "text", None]
        assert decoded["image"].shape == (2, 4, 4, 3) and decoded["empty"].shape == (0, 8)
        np.testing.assert_array_equal(decoded["strided"], [0.0, 2.0, 4.0, 6.0, 8.0])


def test_arrays_travel_as_separate_frames_without_copies():
    image = np.zeros((4, 8, 8, 3), np.uint8)
    frames = pack({"image": image})
    assert len(frames) == 2 and memoryview(frames[1]).nbytes == image.nbytes
    decoded = unpack(frames)
    assert np.shares_memory(decoded["image"], image)


def test_object_arrays_are_refused():
    with pytest.raises(CodecError, match="dtype object"):
        encode({"bad": np.array([object()], dtype=object)})


def test_arbitrary_python_objects_are_refused():
    with pytest.raises(CodecError, match="cannot encode"):
        encode({"bad": object()})


def test_an_array_whose_record_lies_about_its_size_is_rejected():
    frames = pack({"x": np.zeros(2, np.float32)})
    frames[0] = msgpack.packb({"x": msgpack.ExtType(1, msgpack.packb([1, "<f4", [1000]]))})
    with pytest.raises(CodecError, match="needs 4000 bytes, got 8"):
        unpack(frames)


def test_an_object_dtype_smuggled_in_a_record_is_rejected():
    header = msgpack.packb(msgpack.ExtType(1, msgpack.packb([1, "|O", [1]])))
    with pytest.raises(CodecError, match="cannot travel"):
        unpack([header, b"\x00" * 8])


def test_limits_bound_frames_and_sizes():
    with pytest.raises(CodecError, match="frames exceed"):
        unpack([b"\x90"] * 5, Limits(max_frames=3))
    with pytest.raises(CodecError, match="size limit"):
        unpack(pack({"x": np.zeros(100)}), Limits(max_frame_bytes=64))
    with pytest.raises(CodecError, match="not referenced"):
        unpack([msgpack.packb(1), b"spare"])


def test_garbage_raises_codec_errors():
    with pytest.raises(CodecError):
        decode(b"\xc1\xff\x00")
    with pytest.raises(CodecError):
        decode(encode({"x": 1}) + b"tail")


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_never_escape_as_anything_but_codec_errors(data):
    try:
        decode(data)
    except CodecError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.binary(min_size=1, max_size=8), st.booleans())
def test_corrupted_valid_messages_never_escape_as_anything_but_codec_errors(position, patch, header_only):
    frames = pack({"kind": "step", "seq": 3, "body": {"a": np.arange(6, dtype=np.int16).reshape(2, 3)}})
    target = 0 if header_only else 1
    raw = bytearray(frames[target])
    at = position % len(raw)
    raw[at : at + len(patch)] = patch
    frames[target] = bytes(raw)
    try:
        unpack(frames)
    except CodecError:
        pass


def test_zero_dimensional_arrays_keep_their_shape():
    decoded = unpack(pack({"x": np.array(2.5, np.float32)}))
    assert decoded["x"].shape == () and decoded["x"] == 2.5
