"""The GPU campaign's steps (`gpu_campaign.py` runs them): what they share. The steps
themselves are in gpu_sim_steps.py (the simulator: correctness, throughput, PPO, rendering)
and gpu_model_steps.py (the models: the VLA, pipelining, placement, OpenVLA). Each takes a
`Scale` (real sizes on a GPU, toy sizes with `--smoke`) and a work folder, and returns its
rows, its goal and whether the goal was met. Anything that builds a ManiSkill GPU scene runs
in a process of its own (`measure`, through gpu_measure.py), so one scene never outlives its
measurement and a crash costs one row."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

BENCHMARKS = Path(__file__).resolve().parents[1]
ROOT = BENCHMARKS.parent


@dataclass
class Scale:
    smoke: bool  # toy sizes on a CPU: physx_cpu, one env, a few steps

    @property
    def sim_backend(self) -> str:
        return "physx_cpu" if self.smoke else "physx_cuda"

    @property
    def env_backend(self) -> str:  # the config's name for the batched adapter on that backend
        return "cpu_batched" if self.smoke else "gpu"

    @property
    def device(self) -> str:
        return "cpu" if self.smoke else "cuda"

    def sizes(self, *real: int) -> list[int]:
        return [1] if self.smoke else list(real)


def require_physx_gpu(scale: Scale) -> None:
    """physx_cuda needs SAPIEN's PhysX GPU library, which SAPIEN downloads from GitHub the first
    time: where it is missing and GitHub is out of reach, say so before anything runs."""
    import socket

    from embodied.sim.maniskill_common import PHYSX_GPU_RELEASES, physx_gpu_library

    if scale.smoke or physx_gpu_library().is_file():  # smoke: physx_cpu
        return
    try:
        socket.getaddrinfo("github.com", 443)
    except OSError:
        raise RuntimeError(
            f"physx_cuda needs SAPIEN's PhysX GPU library at {physx_gpu_library()}, which is not here, and "
            f"GitHub ({PHYSX_GPU_RELEASES}) is out of reach: carry it with the kit "
            f"(`python tools/gpu/kit.py prepare --physx-gpu linux-so.zip`)"
        ) from None


@dataclass
class StepResult:
    goal: str
    met: bool | None  # None: nothing to meet (a measurement)
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def embodied(*arguments: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """An `embodied` command as a user types it; its output is kept for the step's notes."""
    result = subprocess.run(
        [sys.executable, "-m", "embodied.cli", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"embodied {' '.join(arguments[:2])} failed:\n{result.stderr[-3000:]}")
    return result


def log(message: str) -> None:
    """A measurement's progress, on stderr: `measure` echoes it into the campaign's log."""
    print(message, file=sys.stderr, flush=True)


# Called with each measurement as it comes: the campaign publishes a step's rows before the step
# ends, since GPU time (or a call's limit) can end in the middle of one.
on_measured: Callable[[dict[str, Any]], None] = lambda row: None


def measure(name: str, timeout: float = 900, **arguments: Any) -> dict[str, Any]:
    """The measurement `name` (of gpu_measure.MEASUREMENTS) with `arguments`, in a fresh
    process; its JSON result. Its stderr is echoed as it comes, so the campaign's log shows
    where a long measurement is; killed after `timeout`."""
    # from benchmarks/, which `-m` puts first on the path (as running a study does), so the
    # process finds the harness package and never the checkout's bare embodied/ folder
    process = subprocess.Popen(
        [sys.executable, "-m", "harness.gpu_measure", name, json.dumps(arguments)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=BENCHMARKS,
    )
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    tail: collections.deque[str] = collections.deque(maxlen=40)
    try:
        for line in process.stderr:
            sys.stderr.write(line)
            tail.append(line)
        stdout = process.stdout.read()
        process.wait()
    finally:
        timer.cancel()
    if process.returncode != 0:
        cause = f"killed after {timeout:.0f} s" if process.returncode == -9 else f"exit {process.returncode}"
        raise RuntimeError(f"{name}({arguments}) failed ({cause}):\n{''.join(tail)[-3000:]}")
    row = json.loads(stdout.strip().splitlines()[-1])
    on_measured(row)
    return row
