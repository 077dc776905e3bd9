"""Checkpoints: a directory per save, written to a temporary name and renamed into place, so
a crash never leaves a half-written checkpoint. Tensors go to safetensors (no pickle); the
rest of the state (optimizer layout, counters, RNG, env replay log) to JSON.

    <run>/checkpoints/iter_000010/
        weights.safetensors   policy weights incl. normalisation statistics
        state.safetensors     every other tensor (optimizer moments, RNG, env actions...)
        state.json            the structure around those tensors
        config.yaml           the resolved config
    <run>/checkpoints/latest  name of the newest complete checkpoint

A policy's frozen pretrained weights (`Policy.pretrained_frozen`, e.g. a LoRA run's backbone)
stay out of weights.safetensors: state.json records their source and a SHA-256 of them, and
`load_policy_weights` checks that the policy, built from that source, has the same ones."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import weakref
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from embodied.core.errors import CheckpointError

TENSOR, NDARRAY, TUPLE = "__tensor__", "__ndarray__", "__tuple__"


def flatten(obj: Any, tensors: dict[str, torch.Tensor], prefix: str = "s") -> Any:
    """Replace every tensor/array in a nested structure by a reference into `tensors`."""
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj.detach().cpu().contiguous()
        return {TENSOR: prefix}
    if isinstance(obj, np.ndarray):
        tensors[prefix] = torch.from_numpy(np.array(obj))  # a copy: decoded arrays may be read-only
        return {NDARRAY: prefix}
    if isinstance(obj, dict):
        return {
            "__dict__": [
                [flatten(k, tensors, f"{prefix}.k{i}"), flatten(v, tensors, f"{prefix}.{i}")]
                for i, (k, v) in enumerate(obj.items())
            ]
        }
    if isinstance(obj, (list, tuple)):
        items = [flatten(v, tensors, f"{prefix}.{i}") for i, v in enumerate(obj)]
        return {TUPLE: items} if isinstance(obj, tuple) else items
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot checkpoint a value of type {type(obj).__name__} at {prefix}")


def unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [unflatten(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if TENSOR in obj:
            return tensors[obj[TENSOR]]
        if NDARRAY in obj:
            return tensors[obj[NDARRAY]].numpy()
        if TUPLE in obj:
            return tuple(unflatten(v, tensors) for v in obj[TUPLE])
        return {unflatten(k, tensors): unflatten(v, tensors) for k, v in obj["__dict__"]}
    return obj


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unshared(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU tensors safetensors can write: where several share memory (tied embeddings, as in
    PaliGemma), every one after the first is a copy; loading restores the tie."""
    storages: set[int] = set()
    result = {}
    for name, value in weights.items():
        tensor = value.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        result[name] = tensor.clone() if storage in storages else tensor
        storages.add(storage)
    return result


def save_checkpoint(
    directory: Path, name: str, weights: dict[str, torch.Tensor], state: dict[str, Any], config_yaml: str, keep: int = 3
) -> Path:
    """Write checkpoint `name` and point `latest` at it. Where writing fails (a full disk, a
    read-only folder) the partial copy is removed and a CheckpointError names the last
    complete checkpoint, which stays as it was."""
    try:
        return _save(directory, name, weights, state, config_yaml, keep)
    except (OSError, SafetensorError) as error:
        shutil.rmtree(directory / f".tmp-{name}", ignore_errors=True)
        replaced, final = directory / f".old-{name}", directory / name
        if replaced.exists() and not final.exists():  # failed while replacing a checkpoint of the same name
            os.replace(replaced, final)
        pointer = directory / "latest"
        last = pointer.read_text().strip() if pointer.is_file() else None
        complete = f"the last complete checkpoint is {directory / last}" if last else "no checkpoint is complete yet"
        reason = getattr(error, "strerror", None) or str(error).splitlines()[0]
        raise CheckpointError(
            f"could not write checkpoint {name} in {directory} ({reason}); {complete}. "
            f"Free space (or make the folder writable) and continue with resume=<run directory>."
        ) from None


def _save(
    directory: Path, name: str, weights: dict[str, torch.Tensor], state: dict[str, Any], config_yaml: str, keep: int
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / name
    staging = directory / f".tmp-{name}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    tensors: dict[str, torch.Tensor] = {}
    skeleton = flatten(state, tensors)
    save_file(unshared(weights), str(staging / "weights.safetensors"))
    save_file(tensors, str(staging / "state.safetensors"))
    (staging / "state.json").write_text(json.dumps(skeleton))
    (staging / "config.yaml").write_text(config_yaml)
    for file in staging.iterdir():
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())
    replaced = directory / f".old-{name}"
    if final.exists():  # never a moment where `latest` could name a missing directory
        shutil.rmtree(replaced, ignore_errors=True)
        os.replace(final, replaced)
    os.replace(staging, final)
    pointer = directory / ".latest.tmp"
    pointer.write_text(name)
    os.replace(pointer, directory / "latest")
    _fsync_dir(directory)
    shutil.rmtree(replaced, ignore_errors=True)
    _prune(directory, keep, newest=final)
    return final


def _prune(directory: Path, keep: int, newest: Path) -> None:
    saved = sorted(
        (p for p in directory.iterdir() if p.is_dir() and p.name.startswith("iter_")),
        key=lambda p: int(p.name.split("_")[1]),
    )
    for old in saved[:-keep] if keep > 0 else []:
        if old != newest:
            shutil.rmtree(old)


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory a checkpoint belongs to (itself for a loose checkpoint)."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint


def resolve_checkpoint(path: str | Path) -> Path:
    """A run directory (-> its latest checkpoint) or a checkpoint directory."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"no checkpoint or run directory at '{path}'")
    if (path / "weights.safetensors").is_file():
        return path
    pointer = path / "checkpoints" / "latest"
    if not pointer.is_file():
        raise CheckpointError(f"'{path}' holds no checkpoint (expected {pointer} or {path}/weights.safetensors)")
    checkpoint = path / "checkpoints" / pointer.read_text().strip()
    if not (checkpoint / "weights.safetensors").is_file():
        raise CheckpointError(f"'{pointer}' names {checkpoint.name}, which is missing or incomplete")
    return checkpoint


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = load_checkpoint_state(path)
    return load_file(str(path / "weights.safetensors")), state


def load_checkpoint_state(path: Path) -> dict[str, Any]:
    """A checkpoint's saved state without its weights (counters, versions, rng, optimizer)."""
    files = [path / name for name in ("weights.safetensors", "state.safetensors", "state.json")]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")
    return unflatten(json.loads(files[2].read_text()), load_file(str(files[1])))


# ---- the policy's weights without its frozen pretrained ones --------------------------------
_fingerprints: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # policy -> SHA-256 (they never change)


def _fingerprint(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def without_pretrained_frozen(
    policy: torch.nn.Module, weights: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """`weights` (the policy's whole state) less its frozen pretrained entries, and the record
    a checkpoint keeps of them: their source, count and SHA-256 (None when nothing is left out)."""
    frozen = policy.pretrained_frozen()
    if frozen is None:
        return weights, None
    source, names = frozen
    if policy not in _fingerprints:
        _fingerprints[policy] = _fingerprint({name: weights[name] for name in names})
    left_out = set(names)
    kept = {name: value for name, value in weights.items() if name not in left_out}
    return kept, {"source": source, "count": len(names), "sha256": _fingerprints[policy]}


def load_policy_weights(
    policy: torch.nn.Module,
    weights: dict[str, torch.Tensor],
    state: dict[str, Any],
    may_miss: Callable[[str], bool] = lambda name: False,
) -> None:
    """A checkpoint's weights into `policy`, every entry accounted for: those the checkpoint
    left out must be the policy's frozen pretrained ones, built from the same source with the
    same values; `may_miss` names others the caller lets start fresh. A mismatch of names or
    shapes raises RuntimeError, as `load_state_dict` does; other pretrained weights than the
    checkpoint's, CheckpointError."""
    record = state.get("pretrained_frozen")
    frozen = policy.pretrained_frozen() if record else None
    if record and (frozen is None or len(frozen[1]) != record["count"]):
        raise RuntimeError(
            f"the checkpoint left out {record['count']} frozen weights of {record['source']}, "
            f"which this policy does not load frozen"
        )
    left_out = set(frozen[1]) if frozen else set()
    missing, unexpected = policy.load_state_dict(weights, strict=False)
    missing = [name for name in missing if name not in left_out and not may_miss(name)]
    if missing or unexpected:
        raise RuntimeError(
            f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}"
        )
    if frozen:
        state_dict = policy.state_dict()
        found = _fingerprint({name: state_dict[name] for name in frozen[1]})
        if found != record["sha256"]:
            raise CheckpointError(
                f"the pretrained weights at '{frozen[0]}' are not those this checkpoint was "
                f"trained on: it keeps only what training changed and needs the frozen rest "
                f"as it was (SHA-256 {record['sha256'][:12]}..., found {found[:12]}...)"
            )
        _fingerprints[policy] = found
