"""The `embodied` command as the tests run it: one runner for a finished command, one for a
process a test watches or stops, and the overrides that every tiny run repeats."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

QUIET = ("logger.progress_bar=false", "logger.tensorboard=false")  # no progress bar, no TensorBoard files
NO_EVAL = ("eval_episodes=0", "eval_every=0")  # neither a periodic nor a final evaluation
# one PPO update, on env.num_envs=2 envs of 4 steps each
ONE_PPO_ITERATION = ("algo.rollout_steps=4", "algo.num_minibatches=2", "algo.update_epochs=1", "total_env_steps=8")
# GRPO in groups of two, every outcome counted (the success band keeps every group)
GRPO_ANY_OUTCOME = ("algo=grpo", "algo.group_size=2", "algo.outcome=return", "algo.success_band=[0.0,1.0]")


def embodied(
    *args: str,
    check: bool = True,
    python: str = sys.executable,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    inherit_env: bool = True,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess:
    """`embodied <args>` run to its end; with `check`, a non-zero exit fails the test with the
    command's last output. `env` adds to this process's environment, or with `inherit_env=False`
    is the whole of it."""
    result = subprocess.run(
        [python, "-m", "embodied.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**(os.environ if inherit_env else {}), "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    assert not check or result.returncode == 0, (
        f"embodied {' '.join(args)} exited with {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result


def start(
    *args: str, python: str = sys.executable, env: dict[str, str] | None = None, inherit_env: bool = True, **popen
) -> subprocess.Popen:
    """`embodied <args>` started in the background, its output piped as text (`stdout=None` or
    `stderr=None`: this process's own); `env` as for `embodied`."""
    return subprocess.Popen(
        [python, "-m", "embodied.cli", *args],
        stdout=popen.pop("stdout", subprocess.PIPE),
        stderr=popen.pop("stderr", subprocess.PIPE),
        text=True,
        cwd=popen.pop("cwd", ROOT),
        env={**(os.environ if inherit_env else {}), "PYTHONUNBUFFERED": "1", **(env or {})},
        **popen,
    )
