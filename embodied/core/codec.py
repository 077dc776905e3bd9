"""Messages as frames: msgpack for structure, raw buffers for numpy arrays.

    frame 0     msgpack of the message; each array replaced by an extension record
                [frame index, dtype, shape]
    frame 1..n  the arrays' bytes: memoryviews on encode, np.frombuffer on decode, no copies

Nothing here can run code while decoding: no pickle, object dtypes refused both ways, every
count and size bounded by `Limits`, and any malformed input raises `CodecError`."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Sequence

import msgpack
import numpy as np

ARRAY_EXT = 1


class CodecError(ValueError):
    """A message that cannot be encoded or decoded safely."""


@dataclass(frozen=True)
class Limits:
    max_frames: int = 1024
    max_header_bytes: int = 16 << 20
    max_frame_bytes: int = 4 << 30
    max_total_bytes: int = 8 << 30
    max_ndim: int = 8


DEFAULT_LIMITS = Limits()
Frame = Any  # bytes, bytearray, memoryview or a zmq.Frame's buffer


def _check_dtype(dtype: np.dtype) -> None:
    if dtype.hasobject or dtype.kind not in "biufc" or dtype.fields is not None:
        raise CodecError(f"arrays of dtype {dtype} cannot travel; use numeric or bool arrays")


def pack(message: Any) -> list[Frame]:
    buffers: list[memoryview] = []

    def default(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            _check_dtype(value.dtype)
            array = value if value.flags.c_contiguous else value.copy(order="C")
            buffers.append(memoryview(array.reshape(-1).view(np.uint8)))
            record = msgpack.packb([len(buffers), array.dtype.str, list(array.shape)])
            return msgpack.ExtType(ARRAY_EXT, record)
        if isinstance(value, np.generic):
            return value.item()
        raise CodecError(f"cannot encode a value of type {type(value).__name__}")

    header = msgpack.packb(message, default=default, use_bin_type=True)
    return [header, *buffers]


def _size(frame: Frame) -> int:
    return memoryview(frame).nbytes


def unpack(frames: Sequence[Frame], limits: Limits = DEFAULT_LIMITS) -> Any:
    if not frames:
        raise CodecError("empty message")
    if len(frames) > limits.max_frames + 1:
        raise CodecError(f"{len(frames)} frames exceed the limit of {limits.max_frames + 1}")
    sizes = [_size(f) for f in frames]
    if sizes[0] > limits.max_header_bytes:
        raise CodecError(f"header of {sizes[0]} bytes exceeds the {limits.max_header_bytes}-byte limit")
    if max(sizes[1:], default=0) > limits.max_frame_bytes or sum(sizes) > limits.max_total_bytes:
        raise CodecError("message exceeds the frame or total size limit")
    used: set[int] = set()

    def ext_hook(code: int, data: bytes) -> Any:
        if code != ARRAY_EXT:
            raise CodecError(f"unknown extension type {code}")
        try:
            index, dtype_str, shape = msgpack.unpackb(data, raw=False)
            dtype = np.dtype(dtype_str)
        except Exception as error:
            raise CodecError(f"malformed array record: {error}") from None
        _check_dtype(dtype)
        if not isinstance(index, int) or not 1 <= index < len(frames) or index in used:
            raise CodecError(f"array record names frame {index!r}, which is missing or already used")
        if (
            not isinstance(shape, list)
            or len(shape) > limits.max_ndim
            or not all(isinstance(n, int) and n >= 0 for n in shape)
        ):
            raise CodecError(f"malformed array shape {shape!r}")
        used.add(index)
        expected = math.prod(shape) * dtype.itemsize
        if expected != sizes[index]:
            raise CodecError(f"array of shape {shape} and dtype {dtype} needs {expected} bytes, got {sizes[index]}")
        return np.frombuffer(frames[index], dtype=dtype).reshape(shape)

    try:
        message = msgpack.unpackb(frames[0], ext_hook=ext_hook, raw=False, strict_map_key=False)
    except CodecError:
        raise
    except Exception as error:  # msgpack raises several unrelated types on malformed input
        raise CodecError(f"malformed message: {error}") from None
    if len(used) != len(frames) - 1:
        raise CodecError(f"{len(frames) - 1 - len(used)} frames are not referenced by the message")
    return message


def encode(message: Any) -> bytes:
    """One contiguous buffer (length-prefixed frames), for byte-stream channels such as pipes."""
    frames = pack(message)
    parts = [struct.pack("<I", len(frames))]
    for frame in frames:
        parts += [struct.pack("<Q", _size(frame)), frame]
    return b"".join(parts)


def decode(data: Frame, limits: Limits = DEFAULT_LIMITS) -> Any:
    view = memoryview(data)
    try:
        (count,) = struct.unpack_from("<I", view, 0)
        if count > limits.max_frames + 1:
            raise CodecError(f"{count} frames exceed the limit of {limits.max_frames + 1}")
        frames, offset = [], 4
        for _ in range(count):
            (size,) = struct.unpack_from("<Q", view, offset)
            offset += 8
            if offset + size > view.nbytes:
                raise CodecError("message is shorter than its frame lengths say")
            frames.append(view[offset : offset + size])
            offset += size
    except struct.error:
        raise CodecError("message is shorter than its frame lengths say") from None
    if offset != view.nbytes:
        raise CodecError(f"{view.nbytes - offset} trailing bytes after the last frame")
    return unpack(frames, limits)
