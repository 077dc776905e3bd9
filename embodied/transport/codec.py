"""msgpack encoding of nested dicts/lists holding numpy arrays.

Arrays travel as a msgpack extension: a small header (dtype string, shape) followed by the
raw buffer. Object dtypes are refused on both ends, so decoding never runs code."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

NDARRAY_EXT = 1
MAX_MESSAGE_BYTES = 1 << 30


class CodecError(ValueError):
    """A message that cannot be encoded or decoded safely."""


def _check_dtype(dtype: np.dtype) -> None:
    if dtype.hasobject or dtype.kind not in "biufc":
        raise CodecError(f"arrays of dtype {dtype} cannot travel; use numeric or bool arrays")


def _default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        _check_dtype(value.dtype)
        header = msgpack.packb([value.dtype.str, list(value.shape)])
        return msgpack.ExtType(NDARRAY_EXT, header + np.ascontiguousarray(value).tobytes())
    if isinstance(value, np.generic):
        return value.item()
    raise CodecError(f"cannot encode a value of type {type(value).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code != NDARRAY_EXT:
        raise CodecError(f"unknown extension type {code}")
    unpacker = msgpack.Unpacker(max_buffer_size=len(data))
    unpacker.feed(data)
    dtype_str, shape = unpacker.unpack()
    dtype = np.dtype(dtype_str)
    _check_dtype(dtype)
    payload = data[unpacker.tell():]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if expected != len(payload):
        raise CodecError(f"array of shape {shape} and dtype {dtype} needs {expected} bytes, got {len(payload)}")
    return np.frombuffer(payload, dtype=dtype).reshape(shape)


def encode(message: Any) -> bytes:
    return msgpack.packb(message, default=_default, use_bin_type=True)


def decode(data: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    if len(data) > max_bytes:
        raise CodecError(f"message of {len(data)} bytes exceeds the {max_bytes}-byte limit")
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except CodecError:
        raise
    except Exception as error:  # msgpack raises several unrelated types on malformed input
        raise CodecError(f"malformed message: {error}") from error
