"""`embodied` commands run as a user types them, from a study: one at a time, or several side
by side."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.runs import resumable


def _command(arguments: list[str] | tuple[str, ...]) -> list[str]:
    command = [sys.executable, "-m", "embodied.cli", *arguments]
    print(" ".join(command[2:]), flush=True)
    return command


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}  # read at each start: a study's main() sets HF_HOME


def embodied(*arguments: str) -> None:
    """An `embodied` command (printed first), waited for; it fails the study if it fails."""
    subprocess.run(_command(arguments), check=True, stdin=subprocess.DEVNULL, env=_child_env())


def embodied_side_by_side(commands: list[list[str]]) -> None:
    """Several `embodied` commands at once; waits for all, then fails if any failed."""
    processes = [
        subprocess.Popen(_command(arguments), stdin=subprocess.DEVNULL, env=_child_env()) for arguments in commands
    ]
    failed = [" ".join(process.args[3:5]) for process in processes if process.wait() != 0]
    if failed:
        raise SystemExit(f"failed: {failed}")


def sft_or_resume(run_dir: Path, iterations: int, settings: list[str]) -> None:
    """`embodied sft` with `settings` into `run_dir` for `iterations` gradient steps, or, where an
    earlier try left a checkpoint there, that run continued (or found finished)."""
    quiet = ["eval_episodes=0", "logger.progress_bar=false"]
    if resumable(run_dir):
        embodied("sft", f"resume={run_dir}", f"iterations={iterations}", *quiet)
    else:
        embodied("sft", *settings, f"iterations={iterations}", f"run_dir={run_dir}", *quiet)
