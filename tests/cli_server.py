"""The `embodied` command, forked from a process that has imported its dependencies once.

A command's own process spends most of a tiny test run importing torch, torch's compiler
front end (the first optimizer imports it) and ManiSkill: about 5 s of CPU before the first
env step, every time. This server pays that once per test worker: it imports them, then forks
a child per command, which sets the command's working folder, environment, standard streams
and arguments and runs `embodied.cli` as `python -m embodied.cli` would, to its exit (atexit
handlers included). `tests/cli.py` sends it only commands whose environment is exactly the
server's, so nothing an import read from the environment can differ.

Protocol (over two pipes the client opens): length-prefixed pickles. The server answers
`{"ready": True}` once its imports are done; for each request `{"args", "cwd", "env",
"stdout", "stderr"}` it answers `{"pid": ...}` as soon as it has forked and `{"status": ...}`
(`os.waitpid`'s) once the child has ended."""

from __future__ import annotations

import os
import pickle
import runpy
import struct
import sys
import warnings

# What every command imports first; the product's own modules import the rest as they need it.
PRELOAD = ("torch", "torch._dynamo", "mani_skill.envs", "embodied.cli", "embodied.train", "embodied.evaluate")


def read_message(fd: int):
    """The next message on `fd`, or None at its end."""
    header = read_exactly(fd, 4)
    if header is None:
        return None
    body = read_exactly(fd, struct.unpack("!I", header)[0])
    return None if body is None else pickle.loads(body)


def read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_message(fd: int, message) -> None:
    body = pickle.dumps(message)
    os.write(fd, struct.pack("!I", len(body)) + body)


def run_command(request: dict) -> None:
    """In the forked child: become the command's process, then run it (never returns)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]  # `python -m` puts the working folder first
    sys.argv = ["-m", *request["args"]]
    runpy.run_module("embodied.cli", run_name="__main__", alter_sys=True)
    sys.exit(0)  # through the interpreter's shutdown, as the end of a module run would


def serve(requests: int, replies: int) -> None:
    for name in PRELOAD:
        __import__(name)
    # the imports above leave native threads behind (torch's, SAPIEN's), idle ones: a fork
    # copies only this thread, as DataLoader workers are forked after importing torch
    warnings.filterwarnings("ignore", message=".*use of fork\\(\\) may lead to deadlocks", category=DeprecationWarning)
    write_message(replies, {"ready": True})
    while (request := read_message(requests)) is not None:
        pid = os.fork()
        if pid == 0:
            os.close(requests)
            os.close(replies)
            run_command(request)
        write_message(replies, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        write_message(replies, {"status": status})


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
