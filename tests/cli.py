"""The `embodied` command as the tests run it: one runner for a finished command, one for a
process a test watches or stops, and the overrides that every tiny run repeats."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Connection
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
    is the whole of it. Forked from the worker's command server where it can be (tests/cli_server.py:
    the same interpreter and exactly the server's environment), else a fresh process."""
    environment = {**(os.environ if inherit_env else {}), "PYTHONUNBUFFERED": "1", **(env or {})}
    server = CommandServer.shared() if python == sys.executable else None
    if server is not None and server.serves(environment):
        result = server.run(list(args), cwd, environment, timeout)
    else:
        result = subprocess.run(
            [python, "-m", "embodied.cli", *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            timeout=timeout,
            env=environment,
        )
    assert not check or result.returncode == 0, (
        f"embodied {' '.join(args)} exited with {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result


class CommandServer:
    """This test worker's tests/cli_server.py process: started at the first command that can
    use it, with this process's environment at that moment."""

    _shared: CommandServer | None = None
    cpu_s = 0.0  # CPU time of every command the servers of this process have run (tests/conftest.py)
    _disabled = os.environ.get("EMBODIED_TEST_FORK", "1") == "0"  # 0: every command in a fresh process

    @classmethod
    def shared(cls) -> CommandServer | None:
        if cls._disabled:
            return None
        if cls._shared is None or cls._shared.process.poll() is not None:
            cls._shared = cls()
        return cls._shared

    def __init__(self):
        self.environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_server", str(requests_read), str(replies_write)],
            pass_fds=(requests_read, replies_write),
            cwd=ROOT,
            env=self.environment,
            stdin=subprocess.DEVNULL,
        )
        os.close(requests_read)
        os.close(replies_write)
        self.requests = Connection(requests_write, readable=False)
        self.replies = Connection(replies_read, writable=False)
        self.lock = threading.Lock()
        assert self.reply(timeout=300) == {"ready": True}, "the command server did not start"

    def serves(self, environment: dict[str, str]) -> bool:
        return environment == self.environment

    def reply(self, timeout: float | None = None):
        """The server's next message, or None if none came within `timeout`."""
        return self.replies.recv() if self.replies.poll(timeout) else None

    def run(
        self, args: list[str], cwd: Path, environment: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "embodied.cli", *args]
        with self.lock, tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"args": args, "cwd": str(cwd), "env": environment, "stdout": str(out), "stderr": str(err)}
            self.requests.send(request)
            pid = self.reply(timeout=60)["pid"]
            answer = self.reply(timeout)
            if answer is None:  # as subprocess.run's timeout: the command is killed
                os.kill(pid, signal.SIGKILL)
                self.reply()
                raise subprocess.TimeoutExpired(
                    command, timeout, out.read_text(errors="replace"), err.read_text(errors="replace")
                )
            status = answer["status"]
            CommandServer.cpu_s += answer["cpu_s"]
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            return subprocess.CompletedProcess(
                command, code, out.read_text(errors="replace"), err.read_text(errors="replace")
            )


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
