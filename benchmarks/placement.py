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
counts both roles' processes; on a CPU-only machine only the times are measured.

The bound: collocated roles take turns and move their policies between every turn, so a
collocated update cannot take less than a disaggregated one plus the copies it measures
(learner and rollout offload seconds per update). The placements run in ABBA order over
`--rounds` rounds, so slow drift of a shared machine falls on both alike, and the spread
between rounds of one placement is reported as the noise. A ratio below its bound by more
than that noise is flagged, not reported. Writes benchmarks/results/placement.{json,md,png}."""

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
from statistics import mean

import torch
from harness.reports import bar_chart, provenance, provenance_line

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


def echo_new_lines(log: Path, done: int, prefix: str) -> int:
    """Print the complete lines `log` gained after its first `done` bytes; the bytes read."""
    with open(log, "rb") as file:
        file.seek(done)
        new = file.read()
    complete = new[: new.rfind(b"\n") + 1]
    for line in complete.decode(errors="replace").splitlines():
        print(f"{prefix}{line}", file=sys.stderr, flush=True)
    return done + len(complete)


def run(placement: str, updates: int, overrides: list[str], timeout_s: float | None = None) -> dict:
    """Seconds per update and peak device memory of one run, stopped after its updates (or,
    with `timeout_s`, after that long: an error naming how far it got)."""
    deadline = time.monotonic() + (timeout_s if timeout_s is not None else float("inf"))
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
        # stderr into a file: a pipe nobody reads until the end can fill and stall the trainer
        log = Path(tmp) / "stderr.log"
        with open(log, "w") as stderr:
            trainer = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        metrics = run_dir / "metrics.jsonl"
        rows: list[dict] = []
        echoed = 0  # of the trainer's stderr, passed on: where a slow run spends its time shows
        try:
            while len(rows) < updates + WARMUP_UPDATES:
                echoed = echo_new_lines(log, echoed, f"placement: {placement}: ")
                if trainer.poll() is not None:
                    raise SystemExit(f"the {placement} run failed:\n{log.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"the {placement} run made {len(rows)} of {updates + WARMUP_UPDATES} updates in "
                        f"{timeout_s:.0f} s; its stderr ends:\n{log.read_text()[-2000:]}"
                    )
                time.sleep(0.5)
                if metrics.is_file():
                    done = len(rows)
                    rows = [r for r in map(json.loads, metrics.read_text().splitlines()) if "train/iteration" in r]
                    if len(rows) > done:
                        print(f"placement: {placement}: update {len(rows)}", file=sys.stderr, flush=True)
        finally:  # Ctrl-C: the learner tells its rollout to finish, so nothing holds the device after it
            trainer.send_signal(signal.SIGINT)
            try:
                trainer.wait(timeout=120)
            except subprocess.TimeoutExpired:
                trainer.kill()
                trainer.wait()
        counted = rows[WARMUP_UPDATES - 1 : WARMUP_UPDATES + updates]
        first, last = counted[0], counted[-1]
        seconds = (last["train/elapsed_s"] - first["train/elapsed_s"]) / (len(counted) - 1)
        steps_per_update = last["env_steps"] - counted[-2]["env_steps"]
        moving = lambda row: row.get("train/offload_s", 0.0) + row.get("train/rollout_offload_s", 0.0)  # noqa: E731
    return {
        "placement": placement,
        "seconds_per_update": seconds,
        "env_steps_per_update": steps_per_update,
        "device_peak_gb": memory.peak_gb,
        "learner_offload_s": last.get("train/offload_s"),
        "offload_gb": last.get("train/offload_gb"),
        "rollout_offload_s": last.get("train/rollout_offload_s"),
        "offload_s_per_update": (moving(last) - moving(first)) / (len(counted) - 1),
        "updates_timed": len(counted) - 1,
    }


def compare(results: list[dict]) -> dict:
    """The collocated/disaggregated time ratio, its bound, and the noise between rounds."""
    times = {p: [r["seconds_per_update"] for r in results if r["placement"] == p] for p in PLACEMENTS}
    copies = mean([r["offload_s_per_update"] for r in results if r["placement"] == "collocated"])
    disaggregated, collocated = mean(times["disaggregated"]), mean(times["collocated"])
    ratio, bound = collocated / disaggregated, (disaggregated + copies) / disaggregated
    # the largest spread between rounds of one placement, relative to its mean
    noise = max((max(t) - min(t)) / mean(t) for t in times.values())
    return {
        "seconds_per_update": {p: {"mean": mean(t), "min": min(t), "max": max(t)} for p, t in times.items()},
        "collocated_time_ratio": ratio,
        "ratio_lower_bound": bound,
        "copies_s_per_update": copies,
        "noise": noise,
        "beyond_bound": ratio < bound - noise,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=8, help="updates timed per placement, after the warm-up")
    parser.add_argument("--rounds", type=int, default=2, help="runs per placement, in ABBA order")
    parser.add_argument("overrides", nargs="*", help="config overrides after --, e.g. policy=pi0 ...")
    args = parser.parse_args()
    order = [p for i in range(args.rounds) for p in (PLACEMENTS if i % 2 == 0 else PLACEMENTS[::-1])]
    results = [run(placement, args.updates, args.overrides) for placement in order]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU only"
    comparison = compare(results)
    summary = {
        "device": device,
        "config": [*defaults_under(args.overrides), *args.overrides],
        "order": order,
        "results": results,
        **comparison,
        **provenance("placement.py"),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "placement.json").write_text(json.dumps(summary, indent=2))
    bar_chart(
        RESULTS / "placement.png",
        {p: t["mean"] for p, t in comparison["seconds_per_update"].items()},
        "seconds per update (mean over rounds)",
        f"runtime=procs placements ({device})",
    )
    gb = lambda value: "n/a (no GPU)" if value is None else f"{value:.2f}"  # noqa: E731
    ratio, bound, noise = comparison["collocated_time_ratio"], comparison["ratio_lower_bound"], comparison["noise"]
    verdict = (
        f"**below its bound by more than the noise: not a result; investigate.** Measured {ratio:.3f}x"
        if comparison["beyond_bound"]
        else f"**{ratio:.2f}x**"
    )
    lines = [
        "# Placements: disaggregated against collocated",
        "",
        provenance_line(summary),
        "",
        f"`runtime=procs`, {device}, {args.rounds} rounds in the order {', '.join(order)}, {args.updates} updates "
        f"timed per run after {WARMUP_UPDATES} of warm-up. Config: `{' '.join(summary['config'])}`.",
        "",
        "| run | placement | s / update | device peak (GB, all processes) | copies (s / update) | "
        "moved per offload (GB) |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for index, r in enumerate(results, 1):
        lines.append(
            f"| {index} | {r['placement']} | {r['seconds_per_update']:.2f} | {gb(r['device_peak_gb'])} | "
            f"{r['offload_s_per_update']:.3f} | {r['offload_gb'] or 0:.3f} |"
        )
    lines += [
        "",
        f"Collocated / disaggregated time per update: {verdict}. Its bound: collocated takes at least a "
        f"disaggregated update plus its copies ({comparison['copies_s_per_update']:.3f} s), so the ratio is at "
        f"least **{bound:.3f}x**. Noise (the largest spread between rounds of one placement): {noise:.1%}.",
        "",
        "![times](placement.png)",
    ]
    (RESULTS / "placement.md").write_text("\n".join(lines) + "\n")
    print((RESULTS / "placement.md").read_text())


if __name__ == "__main__":
    main()
