import msgpack
import numpy as np
import pytest

from embodied.transport.codec import CodecError, decode, encode


def test_nested_messages_with_arrays_round_trip_exactly():
    message = {"state": np.arange(12, dtype=np.float32).reshape(3, 4), "done": np.array([True, False]),
               "nested": [{"x": np.int64(3)}, "text", None], "image": np.zeros((2, 4, 4, 3), np.uint8)}
    decoded = decode(encode(message))
    np.testing.assert_array_equal(decoded["state"], message["state"])
    assert decoded["state"].dtype == np.float32 and decoded["done"].dtype == bool
    assert decoded["nested"] == [{"x": 3}, "text", None]
    assert decoded["image"].shape == (2, 4, 4, 3)


def test_object_arrays_are_refused():
    with pytest.raises(CodecError, match="dtype object"):
        encode({"bad": np.array([object()], dtype=object)})


def test_arbitrary_python_objects_are_refused():
    with pytest.raises(CodecError, match="cannot encode"):
        encode({"bad": object()})


def test_an_array_whose_header_lies_about_its_size_is_rejected():
    header = msgpack.packb(["<f4", [1000]])
    forged = msgpack.packb({"x": msgpack.ExtType(1, header + b"\x00" * 8)})
    with pytest.raises(CodecError, match="needs 4000 bytes, got 8"):
        decode(forged)


def test_an_object_dtype_smuggled_in_a_header_is_rejected():
    header = msgpack.packb(["|O", [1]])
    with pytest.raises(CodecError, match="cannot travel"):
        decode(msgpack.packb(msgpack.ExtType(1, header + b"\x00" * 8)))


def test_garbage_and_oversized_messages_raise_codec_errors():
    with pytest.raises(CodecError, match="malformed"):
        decode(b"\xc1\xff\x00")
    with pytest.raises(CodecError, match="exceeds"):
        decode(encode({"x": np.zeros(100)}), max_bytes=64)
