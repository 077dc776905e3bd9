"""The measurements behind benchmarks/checkpoint_parity.py, made with the parity tests' own
harness: for pi0, pi0.5 and SmolVLA in each normalisation mode, the largest difference between
this project's actions and lerobot 0.4.4's whole pipeline on the same raw inputs (tiny, random
weights), and SmolVLA at its published size (parity, chunk time, peak memory, load time), each
side in its own process. Run from the repository root, where `-m` finds the tests package:

    python -m tests.policies.pipeline_parity <output.json>"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def measure() -> dict:
    """Each model's and mode's largest action difference, and SmolVLA at its published size."""
    from tests.policies import smolvla_parity
    from tests.policies.pi0_parity import PROCESSOR_MODES, REFERENCE_PYTHON, pipeline_actions, run_reference

    if not REFERENCE_PYTHON.exists():
        sys.exit(f"{REFERENCE_PYTHON} is missing: bash tools/setup.sh test makes it")
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        work = smolvla_parity.run_reference(Path(folder))
        for mode in smolvla_parity.NORM_MAPS:
            ours, reference = smolvla_parity.pipeline_actions(work, mode, work / "ours" / mode)
            runs.append(difference("smolvla", mode, ours, reference))
    for model, modes in PROCESSOR_MODES.items():
        with tempfile.TemporaryDirectory() as folder:
            work = run_reference(Path(folder), model)
            for mode in modes:
                ours, reference = pipeline_actions(work, model, mode, work / "ours" / mode)
                runs.append(difference(model, mode, ours, reference))
    return {"runs": runs, "smolvla_published_size": smolvla_published(REFERENCE_PYTHON)}


def difference(model: str, mode: str, ours: np.ndarray, reference: np.ndarray) -> dict:
    row = {
        "model": model,
        "mode": mode,
        "size": "tiny",
        "max_abs_difference": float(np.abs(ours - reference).max()),
        "max_abs_action": float(np.abs(reference).max()),
    }
    print(f"[{model} {mode}] largest difference {row['max_abs_difference']:.1e}", flush=True)
    return row


def smolvla_published(reference_python: Path, runs: int = 3) -> dict:
    """SmolVLA at its published size, random weights: lerobot builds, saves and times one chunk
    (50 actions, 10 steps, two 512 px cameras, batch 3); ours loads the files and times the
    same chunk, each side in its own process."""
    from tests.policies import smolvla_parity

    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        print("[smolvla published size] lerobot: random weights, save_pretrained, chunks", flush=True)
        smolvla_parity.run_reference(work, smolvla_parity.PUBLISHED_SPEC, processors=False, timed_runs=runs)
        print("[smolvla published size] ours: load the checkpoint, chunks", flush=True)
        ours = [sys.executable, "-m", "tests.policies.pipeline_parity", "smolvla-ours", str(work), str(runs)]
        subprocess.run(ours, check=True, cwd=ROOT)
        theirs, mine = np.load(work / "reference.npz"), np.load(work / "ours.npz")
        return {
            "parameters": {"ours": int(mine["parameters"]), "lerobot": int(theirs["parameters"])},
            "chunk_s": {
                "ours": float(np.median(mine["seconds"][1:])),
                "lerobot": float(np.median(theirs["seconds"][1:])),
            },
            "peak_gb": {"ours": float(mine["peak_bytes"]) / 1e9, "lerobot": float(theirs["peak_bytes"]) / 1e9},
            "checkpoint_load_s": {"ours": float(mine["load_s"]), "lerobot": float(theirs["load_s"])},
            "max_abs_difference": float(np.abs(mine["actions"] - theirs["actions"]).max()),
            "max_abs_action": float(np.abs(theirs["actions"]).max()),
        }


def smolvla_ours(work: Path, runs: int) -> None:
    """Our side of the published-size run, in a process of its own."""
    import resource
    import time

    import torch

    from embodied.policies.pretrained.smolvla_model import resize_with_pad

    started = time.perf_counter()
    from tests.policies.smolvla_parity import PUBLISHED_SPEC, loaded

    model = loaded(work, PUBLISHED_SPEC).model
    load_s = time.perf_counter() - started
    t = {name: torch.from_numpy(value) for name, value in np.load(work / "inputs.npz").items()}
    images = [resize_with_pad(t[f"frame{i}"], PUBLISHED_SPEC["image_size"]) for i in range(2)]
    present = [torch.ones(len(t["state"]), dtype=torch.bool)] * 2
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        with torch.inference_mode():
            actions = model.sample(
                images, present, t["tokens"], t["token_mask"], t["state"], t["noise"], PUBLISHED_SPEC["steps"]
            )
        seconds.append(time.perf_counter() - started)
    np.savez(
        work / "ours.npz",
        actions=actions.numpy(),
        seconds=np.array(seconds),
        load_s=load_s,
        peak_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        parameters=sum(p.numel() for p in model.parameters()),
    )


def main() -> None:
    if sys.argv[1:2] == ["smolvla-ours"]:
        return smolvla_ours(Path(sys.argv[2]), int(sys.argv[3]))
    Path(sys.argv[1]).write_text(json.dumps(measure()))


if __name__ == "__main__":
    main()
