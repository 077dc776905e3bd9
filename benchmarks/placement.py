"""`runtime=procs` placements side by side, one run after another on this machine: seconds
per update (collection and learning) and, on CUDA, the device memory every process of the
run holds at its peak.

    disaggregated   the rollout and the learner keep their policies on the device
    collocated      they take turns; the idle one's policy (the learner's Adam moments too)
                    waits in CPU memory (`runtime.placement=collocated`)

    python benchmarks/placement.py                                   # the default: a 45M token VLA
    python benchmarks/placement.py --updates 6 -- policy=pi0 policy.pretrained=/models/pi0 \\
        policy.tokenizer=/models/paligemma env.obs_mode=rgb        # a real-size VLA on a GPU

Memory is sampled from the device itself (`torch.cuda.mem_get_info`, every 0.1 s), so it
counts both roles' processes; on a CPU-only machine only the times are measured, and there
collocation can only cost (the copies). Writes benchmarks/results/placement.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from plots import bar_chart  # sibling module: the scripts run as `python benchmarks/<name>.py`

RESULTS = Path(__file__).resolve().parent / "results"
# A token VLA of some size (a random 8-layer, 512-wide Qwen2 with a 32k vocabulary: 45M
# weights), so that what collocation moves is not nothing.
DEFAULT = [
    "env.task=PushCube-v1",
    "env.num_envs=8",
    "env.num_workers=0",
    "policy=token_vla",
    "policy.hidden_size=512",
    "policy.num_layers=8",
    "policy.num_heads=8",
    "policy.vocab_size=32000",
    "algo.rollout_steps=16",
    "algo.num_minibatches=2",
    "algo.update_epochs=2",
]
PLACEMENTS = ("disaggregated", "collocated")
WARMUP_UPDATES = 2  # start-up and first-call costs, left out of the per-update time


class DeviceMemory:
    """The peak memory in use on the GPU, whoever holds it, sampled while a run goes on."""

    def __init__(self) -> None:
        self.available = torch.cuda.is_available()
        self.baseline = self._used() if self.available else 0
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _used(self) -> int:
        free, total = torch.cuda.mem_get_info()
        return total - free

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self._used())

    def __enter__(self) -> "DeviceMemory":
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.available:
            self._thread.join()

    @property
    def peak_gb(self) -> float | None:
        return (self.peak - self.baseline) / 1e9 if self.available else None


def defaults_under(overrides: list[str]) -> list[str]:
    """DEFAULT, less its `policy.*` settings where the overrides choose another policy: those
    belong to the token VLA, and Hydra applies them to whichever policy is chosen."""
    if any(o.startswith("policy=") for o in overrides):
        return [d for d in DEFAULT if not d.startswith("policy")]
    return DEFAULT


def run(placement: str, updates: int, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp, DeviceMemory() as memory:
        run_dir = Path(tmp) / placement
        command = [
            sys.executable,
            "-m",
            "embodied.cli",
            "train",
            *defaults_under(overrides),
            *overrides,
            "runtime=procs",
            f"runtime.placement={placement}",
            "eval_episodes=0",
            "checkpoint_every=0",
            "logger.progress_bar=false",
            f"run_dir={run_dir}",
            f"total_env_steps={10**9}",
        ]
        trainer = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        metrics = run_dir / "metrics.jsonl"
        rows: list[dict] = []
        try:
            while len(rows) < updates + WARMUP_UPDATES:
                if trainer.poll() is not None:
                    raise SystemExit(f"the {placement} run failed:\n{trainer.stderr.read()[-3000:]}")
                time.sleep(0.5)
                if metrics.is_file():
                    rows = [r for r in map(json.loads, metrics.read_text().splitlines()) if "train/iteration" in r]
        finally:  # Ctrl-C: the learner tells its rollout to finish, so nothing holds the device after it
            trainer.send_signal(signal.SIGINT)
            try:
                trainer.wait(timeout=120)
            except subprocess.TimeoutExpired:
                trainer.kill()
                trainer.wait()
        counted = rows[WARMUP_UPDATES - 1 : WARMUP_UPDATES + updates]
        seconds = (counted[-1]["train/elapsed_s"] - counted[0]["train/elapsed_s"]) / (len(counted) - 1)
        steps_per_update = counted[-1]["env_steps"] - counted[-2]["env_steps"]
        last = counted[-1]
    return {
        "placement": placement,
        "seconds_per_update": seconds,
        "env_steps_per_update": steps_per_update,
        "device_peak_gb": memory.peak_gb,
        "learner_offload_s": last.get("train/offload_s"),
        "offload_gb": last.get("train/offload_gb"),
        "rollout_offload_s": last.get("train/rollout_offload_s"),
        "updates_timed": len(counted) - 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=8, help="updates timed per placement, after the warm-up")
    parser.add_argument("overrides", nargs="*", help="config overrides after --, e.g. policy=pi0 ...")
    args = parser.parse_args()
    results = [run(placement, args.updates, args.overrides) for placement in PLACEMENTS]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU only"
    by_name = {r["placement"]: r for r in results}
    ratio = by_name["collocated"]["seconds_per_update"] / by_name["disaggregated"]["seconds_per_update"]
    summary = {
        "device": device,
        "config": [*DEFAULT, *args.overrides],
        "results": results,
        "collocated_time_ratio": ratio,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "placement.json").write_text(json.dumps(summary, indent=2))
    bar_chart(
        RESULTS / "placement.png",
        {r["placement"]: r["seconds_per_update"] for r in results},
        "seconds per update",
        f"runtime=procs placements ({device})",
    )
    gb = lambda value: "n/a (no GPU)" if value is None else f"{value:.2f}"  # noqa: E731
    lines = [
        "# Placements: disaggregated against collocated",
        "",
        f"`runtime=procs`, {device}, one run after the other, {args.updates} updates timed after "
        f"{WARMUP_UPDATES} of warm-up. Config: `{' '.join(summary['config'])}`.",
        "",
        "| placement | s / update | device peak (GB, all processes) | learner offload (s, total) | "
        "moved per offload (GB) | rollout offload (s, total) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['placement']} | {r['seconds_per_update']:.2f} | {gb(r['device_peak_gb'])} | "
            f"{r['learner_offload_s'] or 0:.2f} | {r['offload_gb'] or 0:.3f} | "
            f"{r['rollout_offload_s'] or 0:.2f} |"
        )
    lines += ["", f"Collocated / disaggregated time per update: **{ratio:.2f}x**.", "", "![times](placement.png)"]
    (RESULTS / "placement.md").write_text("\n".join(lines) + "\n")
    print((RESULTS / "placement.md").read_text())


if __name__ == "__main__":
    main()
