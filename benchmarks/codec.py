"""Codec throughput: encode + decode of a batch of images, side by side in one process.

    python benchmarks/codec.py [--repeats 100]

Compared: our frame codec (`pack`/`unpack`: zero-copy frames, as sent over ZeroMQ), our
single-buffer form (`encode`/`decode`, as sent over a pipe: one join), pickle, plain msgpack
with a bytes copy of the array, and two copies of the same bytes: into a new buffer (the
copy `encode` makes, its ceiling; the ratios are to it) and into one buffer reused each time
(np.copyto). Which of those two is faster depends on where the destination sits in the
caches; measured interleaved, the reused buffer was the slower one.
Writes benchmarks/results/codec.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import pickle
import time
from pathlib import Path

import msgpack
import numpy as np

from embodied.core.codec import decode, encode, pack, unpack
from harness.reports import provenance, provenance_line

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE = (64, 224, 224, 3)


def plain_msgpack(batch: np.ndarray) -> np.ndarray:
    data = msgpack.packb({"shape": list(batch.shape), "data": batch.tobytes()})
    message = msgpack.unpackb(data)
    return np.frombuffer(message["data"], np.uint8).reshape(message["shape"]).copy()


def frames(batch: np.ndarray) -> np.ndarray:
    return unpack(pack({"images": batch}))["images"]


def single_buffer(batch: np.ndarray) -> np.ndarray:
    return decode(encode({"images": batch}))["images"]


def pickled(batch: np.ndarray) -> np.ndarray:
    return pickle.loads(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    batch = np.random.default_rng(0).integers(0, 255, size=SHAPE, dtype=np.uint8)
    target = np.empty_like(batch)

    def memcpy(b: np.ndarray) -> np.ndarray:
        return np.frombuffer(bytes(memoryview(b)), np.uint8).reshape(b.shape)

    def copy_into_reused(b: np.ndarray) -> np.ndarray:
        np.copyto(target, b)
        return target

    methods = {
        "memcpy": memcpy,
        "copy into a reused buffer": copy_into_reused,
        "frames (pack/unpack)": frames,
        "single buffer (encode/decode)": single_buffer,
        "pickle": pickled,
        "msgpack + bytes copy": plain_msgpack,
    }
    for name, method in methods.items():
        assert np.array_equal(method(batch), batch), name
    # Interleaved, best of `repeats` each: a copy of 10 MB takes a fraction of a millisecond, and a
    # slow spell of the machine must hit every method alike, not only the one measured during it
    # (measured one after the other, memcpy once came out below a method that copies as much).
    seconds = {name: float("inf") for name in methods}
    for _ in range(args.repeats):
        for name, method in methods.items():
            started = time.perf_counter()
            method(batch)
            seconds[name] = min(seconds[name], time.perf_counter() - started)
    gbps = {name: batch.nbytes / s / 1e9 for name, s in seconds.items()}
    ratio = {name: gbps[name] / gbps["memcpy"] for name in gbps}
    result = {
        **provenance("codec.py"),
        "shape": SHAPE,
        "bytes": batch.nbytes,
        "best_of": args.repeats,
        "gb_per_s": gbps,
        "ratio_to_memcpy": ratio,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "codec.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# Codec: encode + decode of a {'x'.join(map(str, SHAPE))} uint8 batch ({batch.nbytes / 1e6:.1f} MB)",
        "",
        provenance_line(result),
        "",
        f"Best of {args.repeats} interleaved runs, one process. `frames` never copies the array: its bytes stay where "
        "they are until the socket sends them, hence above memcpy; `single buffer` joins the frames "
        "into one bytes object (one copy), the form used over pipes: memcpy (into a new buffer, as "
        "the join copies) is its bound.",
        "",
        "| method | GB/s | ratio to memcpy |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {name} | {gbps[name]:.2f} | {ratio[name]:.2f} |" for name in methods]
    (RESULTS / "codec.md").write_text("\n".join(lines) + "\n\n![codec](codec.png)\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(list(gbps)[::-1], list(gbps.values())[::-1], color="tab:green")
    ax.set_xscale("log")
    ax.set_xlabel("GB/s (log scale)")
    ax.set_title("encode + decode, 64x224x224x3 uint8")
    fig.tight_layout()
    fig.savefig(RESULTS / "codec.png", dpi=110)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
