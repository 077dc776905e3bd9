"""Pipe workers are forked from one server per process that imported the simulator's modules
once (`embodied.sim.vector.worker_context`), instead of each importing them in a fresh
interpreter, and the server ends with the process. Checked in a process of its own: the server
belongs to the process that starts it."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from embodied.core.env import SingleEnv, SingleObservation, SingleStep
from embodied.core.types import EnvSpec
from tests.cli import ROOT


class ImportProbe(SingleEnv):
    """state = (the preloaded module was imported before this env was built, torch's threads,
    the worker's parent pid, this worker's pid)."""

    def __init__(self, env_id: int = 0):
        import torch

        self.spec = EnvSpec(state_dim=4, action_dim=1, action_low=(-1.0,), action_high=(1.0,), max_episode_steps=3)
        self.task = self.instruction = "probe"
        self.state = np.array(
            ["wave" in sys.modules, torch.get_num_threads(), os.getppid(), os.getpid()], dtype=np.float64
        )

    def reset(self, seed: int) -> SingleObservation:
        return SingleObservation(state=self.state.astype(np.float32))

    def step(self, action: np.ndarray) -> SingleStep:
        return SingleStep(self.reset(0), reward=float(action[0]), terminated=False, truncated=False, success=False)


PROBE = textwrap.dedent(
    """
    import json, os, sys
    from embodied.sim.vector import vectorize
    from tests.sim.test_workers import ImportProbe

    assert "wave" not in sys.modules
    sets = []
    for _ in range(2):  # two env sets one after the other, as training and its evaluation build them
        env = vectorize(ImportProbe, [0, 1, 2], num_workers=3, preload=("torch", "wave"))
        observation = env.reset([0, 1, 2])
        env.close()
        sets.append(observation.state[:, :4].tolist())
    print(json.dumps({"parent": os.getpid(), "sets": sets, "wave_here": "wave" in sys.modules}))
    """
)


def test_pipe_workers_fork_from_one_server_that_imported_the_simulator_once():
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    workers = [row for rows in probe["sets"] for row in rows]
    assert len(workers) == 6
    assert all(preloaded == 1.0 for preloaded, _, _, _ in workers)  # imported before any env was built
    assert all(threads == 1.0 for _, threads, _, _ in workers)  # one torch thread each, as spawned workers had
    servers = {parent for _, _, parent, _ in workers}
    assert len(servers) == 1 and probe["parent"] not in servers  # every worker forked from the same server
    assert len({pid for _, _, _, pid in workers}) == 6
    assert not probe["wave_here"]  # the preload is the server's: this process imported nothing for it
    with pytest.raises(ProcessLookupError):  # stopped and waited for when the process exited
        os.kill(int(servers.pop()), 0)
