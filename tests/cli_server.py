"""The `embodied` command, forked from a process that has imported its dependencies once.

A command's own process spends most of a tiny test run importing torch, torch's compiler
front end (the first optimizer imports it) and ManiSkill: about 5 s of CPU before the first
env step, every time. This server pays that once per test worker: it imports them, then forks
a child per command, which sets the command's working folder, environment, standard streams
and arguments and runs `embodied.cli` as `python -m embodied.cli` would, to its exit (atexit
handlers included). `tests/cli.py` sends it only commands whose environment is exactly the
server's, so nothing an import read from the environment can differ.

Protocol (over two pipes the client opens, each end a `multiprocessing.connection.Connection`,
which frames and pickles the messages): the server answers
`{"ready": True}` once its imports are done; for each request `{"args", "cwd", "env",
"stdout", "stderr"}` it answers `{"pid": ...}` as soon as it has forked and `{"status": ...,
"cpu_s": ...}` (`os.wait4`'s status, and the CPU time of the child and of the processes it
waited for) once the child has ended."""

from __future__ import annotations

import gc
import os
import runpy
import sys
import warnings
from multiprocessing.connection import Connection

# What every command imports first; the product's own modules import the rest as they need it.
# peft brings transformers' model machinery, which every VLA command (about 30 in the suite)
# imports: 5.5 s of CPU each time, paid once per server instead.
PRELOAD = ("torch", "torch._dynamo", "mani_skill.envs", "peft", "embodied.cli", "embodied.train", "embodied.evaluate")


def run_command(request: dict) -> None:
    """In the forked child: become the command's process, then run it (never returns)."""
    write = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], write), (2, request["stderr"], write)):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]  # `python -m` puts the working folder first
    sys.argv = ["-m", *request["args"]]
    runpy.run_module("embodied.cli", run_name="__main__", alter_sys=True)
    sys.exit(0)  # through the interpreter's shutdown, as the end of a module run would


def serve(requests: Connection, replies: Connection) -> None:
    for name in PRELOAD:
        __import__(name)
    # the imports above leave native threads behind (torch's, SAPIEN's), idle ones: a fork
    # copies only this thread, as DataLoader workers are forked after importing torch
    warnings.filterwarnings("ignore", message=".*use of fork\\(\\) may lead to deadlocks", category=DeprecationWarning)
    # what the imports made lives as long as any command: frozen out of the collector, as
    # Python's docs advise before forking, so a command's full collections (ManiSkill runs one
    # per scene it builds or clears) walk only the objects the command made itself
    gc.freeze()
    replies.send({"ready": True})
    while True:
        try:
            request = requests.recv()
        except EOFError:  # the test worker has gone
            return
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            run_command(request)
        replies.send({"pid": pid})
        _, status, usage = os.wait4(pid, 0)
        replies.send({"status": status, "cpu_s": usage.ru_utime + usage.ru_stime})


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
