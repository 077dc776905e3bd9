"""One `runtime=procs` run under a placement (disaggregated or collocated), stopped after a
number of updates: its seconds per update, what its offloads move and take, and the device's
peak memory. placement.py compares the placements with it; the GPU campaign's placement step
runs pi0 at its published size through it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.device_memory import DeviceMemory

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
            "eval_every=0",  # no periodic evaluation inside the timed updates
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
        # the trainer's stderr and its rollout's log, passed on: where a slow run spends its time shows
        echoed: dict[Path, int] = {}
        try:
            while len(rows) < updates + WARMUP_UPDATES:
                for path in [log, *sorted((run_dir / "logs").glob("*.log"))]:
                    echoed[path] = echo_new_lines(path, echoed.get(path, 0), f"placement: {placement}: {path.stem}: ")
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
