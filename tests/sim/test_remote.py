"""Env workers over ZeroMQ: real sockets, real worker processes."""

import os
import signal
import sys
from dataclasses import asdict
from functools import partial

import numpy as np
import pytest

from embodied.core.errors import EnvWorkerError
from embodied.core.sockets import EndpointError, check_endpoint
from embodied.sim.gymnasium_env import GymnasiumConfig, GymnasiumEnv, make_gymnasium
from embodied.sim.maniskill import make_maniskill
from embodied.sim.maniskill_common import ManiSkillConfig
from embodied.sim.vector import vectorize


@pytest.mark.parametrize("transport", ["pipe", "zmq"])
@pytest.mark.slow
def test_worker_processes_give_the_same_results_as_in_process_envs(transport):
    chunk = np.random.default_rng(1).uniform(-1, 1, size=(4, 3, 8)).astype(np.float32)
    results = []
    for workers in (0, 2):
        env = make_maniskill(ManiSkillConfig(num_envs=4, num_workers=workers, transport=transport), seed=5)
        try:
            env.reset()
            results.append(env.step(chunk))
        finally:
            env.close()
    np.testing.assert_array_equal(results[0].observation.state, results[1].observation.state)
    np.testing.assert_array_equal(results[0].reward, results[1].reward)


def test_a_killed_zmq_worker_is_reported_promptly():
    env = make_gymnasium(
        GymnasiumConfig(task="InvertedPendulum-v4", num_envs=2, num_workers=2, transport="zmq"), seed=0
    )
    try:
        env.reset()
        env.workers[0].process.send_signal(signal.SIGKILL)
        env.workers[0].process.wait()
        with pytest.raises(EnvWorkerError, match="died"):
            env.step(np.zeros((2, 1, 1), np.float32))
    finally:
        env.close()


def test_an_env_worker_with_other_envs_is_refused_on_both_ends():
    from dataclasses import asdict

    from embodied.sim.remote import EnvHub

    pendulum = asdict(GymnasiumConfig(task="InvertedPendulum-v4", num_envs=1))
    hopper_spec = {
        "state_dim": 11,
        "action_dim": 3,
        "action_low": [-1.0] * 3,
        "action_high": [1.0] * 3,
        "image_shapes": {},
        "max_episode_steps": 1000,
        "control_hz": 125.0,
    }
    hub = EnvHub(pendulum, base_seed=0, stream=0, timeout_s=60, expected_spec=hopper_spec)
    try:
        with pytest.raises(EnvWorkerError, match=r"do not match the others: state_dim: this side 11, peer 4"):
            hub.start_worker([0]).wait_ready()
    finally:
        hub.close()


def worker_interpreter(tmp_path, prelude: str) -> str:
    """An interpreter for env workers (`env.python`) that runs `prelude` before the worker module."""
    script = tmp_path / "worker_prelude.py"
    script.write_text(
        prelude + "\nimport runpy, sys\n"
        "assert sys.argv[1:3] == ['-m', 'embodied.sim.worker']\n"
        "sys.argv = ['embodied.sim.worker'] + sys.argv[3:]\n"
        "runpy.run_module('embodied.sim.worker', run_name='__main__')\n"
    )
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_zmq_workers_start_side_by_side(tmp_path):
    """Each worker waits, before it builds its env, until every worker has started: started one
    after another (each waiting for the previous one's hello), they would time out instead."""
    barrier = tmp_path / "started"
    barrier.mkdir()
    python = worker_interpreter(
        tmp_path,
        "import os, pathlib, time\n"
        f"barrier = pathlib.Path({str(barrier)!r})\n"
        "(barrier / str(os.getpid())).touch()\n"
        "deadline = time.monotonic() + 60\n"
        "while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n",
    )
    config = GymnasiumConfig(task="InvertedPendulum-v4", num_envs=2, num_workers=2, transport="zmq", python=python)
    env = vectorize(partial(GymnasiumEnv, config), [0, 1], 2, 0, 0, "zmq", asdict(config), worker_timeout_s=30)
    try:
        assert len(list(barrier.iterdir())) == 2
        assert env.reset().state.shape == (2, 4)
    finally:
        env.close()


def test_the_env_worker_runs_where_torch_cannot_be_imported(tmp_path):
    """The worker runs under an interpreter in which any torch import fails (as a separate
    virtualenv without torch would), and serves a gymnasium env over ZeroMQ."""
    python = worker_interpreter(
        tmp_path,
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n",
    )
    config = GymnasiumConfig(task="InvertedPendulum-v4", num_envs=1, num_workers=1, transport="zmq", python=python)
    env = make_gymnasium(config, seed=0)
    try:
        first = env.reset()
        result = env.step(np.zeros((1, 2, 1), np.float32))
        assert first.state.shape == (1, 4) and result.executed_steps.tolist() == [2]
    finally:
        env.close()


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://0.0.0.0:5555",
        "tcp://192.168.1.4:5555",
        "udp://127.0.0.1:1",
        "tcp://127.0.0.1.example.com:5555",
        "tcp://127.0.0.1;10.0.0.5:5555",
    ],
)
def test_non_loopback_endpoints_are_refused(endpoint):
    with pytest.raises(EndpointError):
        check_endpoint(endpoint)


def test_loopback_endpoints_are_allowed():
    for endpoint in ("tcp://127.0.0.1:5555", "tcp://127.3.4.5:5", "tcp://localhost:1", "tcp://[::1]:2", "ipc:///tmp/x"):
        assert check_endpoint(endpoint) == endpoint
    assert os.name == "posix"


@pytest.mark.parametrize("transport,pipeline", [("pipe", False), ("zmq", False), ("pipe", True), ("zmq", True)])
def test_rollout_restarts_a_killed_worker_and_recollects_the_whole_batch(transport, pipeline):
    import torch

    from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig
    from embodied.runtime.rollout import Rollout

    env = make_gymnasium(
        GymnasiumConfig(task="InvertedPendulum-v4", num_envs=4, num_workers=2, transport=transport), seed=0
    )
    try:
        policy = MLPGaussianPolicy(MLPPolicyConfig(), env.spec)
        rollout = Rollout(env, policy, torch.device("cpu"), pipeline=pipeline)
        assert rollout.pipeline == pipeline
        rollout.start()
        rollout.collect(5)
        dead = env.workers[1].process
        os.kill(dead.pid, signal.SIGKILL)
        batch, _, env_steps = rollout.collect(5)
        assert rollout.env_restarts == 1 and env.workers[1].process.pid != dead.pid
        assert batch.reward.shape == (5, 4) and env_steps == 20
        assert rollout.collect(3)[0].reward.shape == (3, 4) and rollout.env_restarts == 1
    finally:
        env.close()


@pytest.mark.slow
def test_training_survives_kill_minus_nine_of_an_env_worker(tmp_path):
    import json
    import subprocess
    import time

    import psutil

    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "embodied.cli",
        "train",
        "experiment=mujoco_invertedpendulum",
        "env.num_envs=2",
        "env.num_workers=2",
        "env.transport=zmq",
        "algo.rollout_steps=256",
        "algo.num_minibatches=4",
        "algo.update_epochs=2",
        "total_env_steps=12288",
        "eval_episodes=0",
        "logger.progress_bar=false",
        f"run_dir={run_dir}",
    ]
    trainer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.exists() and metrics.read_text()) and time.monotonic() < deadline:
            assert trainer.poll() is None, trainer.communicate()[1]
            time.sleep(0.2)
        workers = [
            p
            for p in psutil.Process(trainer.pid).children(recursive=True)
            if "embodied.sim.worker" in " ".join(p.cmdline())
        ]
        assert len(workers) == 2, "expected two env worker processes"
        workers[0].kill()
        out, err = trainer.communicate(timeout=300)
    finally:
        trainer.kill()
    assert trainer.returncode == 0, err
    last = json.loads(metrics.read_text().splitlines()[-1])
    assert last["env_steps"] >= 12288 and last["train/env_worker_restarts"] == 1


@pytest.mark.parametrize("workers,stages,rows", [(2, 2, [4, 4]), (4, 2, [4, 4]), (4, 4, [2, 2, 2, 2])])
def test_pipelined_rollout_collects_the_same_transitions_as_the_sequential_one(workers, stages, rows):
    """Whatever the workers are grouped into (runtime.pipeline_stages), pipelining changes when
    inference runs, not what is collected."""
    import torch

    from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig
    from embodied.runtime.rollout import Rollout

    batches = []
    for pipeline in (False, True):
        env = make_gymnasium(GymnasiumConfig(task="InvertedPendulum-v4", num_envs=8, num_workers=workers), seed=3)
        try:
            torch.manual_seed(0)
            policy = MLPGaussianPolicy(MLPPolicyConfig(init_log_std=-30.0), env.spec)  # sampling = the mean
            rollout = Rollout(env, policy, torch.device("cpu"), pipeline=pipeline, pipeline_stages=stages)
            if pipeline:
                sizes = [env.stage_rows(k).stop - env.stage_rows(k).start for k in range(env.num_stages)]
                assert sizes == rows
            rollout.start()
            batch, episodes, env_steps = rollout.collect(40)
            batches.append((batch, len(episodes), env_steps, rollout.observation.state))
        finally:
            env.close()
    (sequential, n_seq, steps_seq, last_seq), (pipelined, n_pipe, steps_pipe, last_pipe) = batches
    assert (n_seq, steps_seq) == (n_pipe, steps_pipe) and steps_seq == 320
    torch.testing.assert_close(pipelined.observation.state, sequential.observation.state)
    torch.testing.assert_close(pipelined.reward, sequential.reward)
    torch.testing.assert_close(pipelined.value, sequential.value)
    torch.testing.assert_close(pipelined.last_value, sequential.last_value)
    assert torch.equal(pipelined.terminated, sequential.terminated)
    np.testing.assert_allclose(last_pipe, last_seq)


def _env_once_all_workers_started(folder: str, workers: int, cfg: GymnasiumConfig, index: int):
    """An env that is built only once `workers` worker processes have begun building theirs."""
    import time
    from pathlib import Path

    from embodied.sim.gymnasium_env import GymnasiumEnv

    Path(folder, str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(list(Path(folder).iterdir())) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError("the other env workers never started")
        time.sleep(0.05)
    return GymnasiumEnv(cfg, index)


def test_pipe_workers_build_their_envs_side_by_side(tmp_path):
    """Workers started one after another, each waiting for the last to be ready, would never
    all be building at once, and these envs are built only then."""
    from functools import partial

    from embodied.sim.vector import vectorize

    cfg = GymnasiumConfig(task="InvertedPendulum-v4", num_envs=3, num_workers=3)
    make_env = partial(_env_once_all_workers_started, str(tmp_path), 3, cfg)
    env = vectorize(make_env, [0, 1, 2], num_workers=3, worker_timeout_s=120)
    try:
        assert env.num_envs == 3 and len(list(tmp_path.iterdir())) == 3
        assert env.reset().state.shape[0] == 3
    finally:
        env.close()


def test_a_pipeline_of_fewer_than_two_stages_is_refused_by_name():
    import torch

    from embodied.core.errors import ConfigError
    from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig
    from embodied.runtime.rollout import Rollout

    env = make_gymnasium(GymnasiumConfig(task="InvertedPendulum-v4", num_envs=2, num_workers=2), seed=3)
    try:
        policy = MLPGaussianPolicy(MLPPolicyConfig(), env.spec)
        with pytest.raises(ConfigError, match="runtime.pipeline_stages must be >= 2 or 'auto', got 1"):
            Rollout(env, policy, torch.device("cpu"), pipeline=True, pipeline_stages=1)
    finally:
        env.close()


def test_the_socket_folders_of_killed_hubs_are_removed_and_live_ones_kept(tmp_path):
    """A process killed outright cannot remove its hub's folder; the next hub does."""
    import subprocess

    from embodied.sim.remote import HUB_PREFIX, remove_stale_hubs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"{HUB_PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{HUB_PREFIX}{os.getpid()}-def"
    other = tmp_path / f"{HUB_PREFIX}notapid"
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / "hub").write_text("")
    assert remove_stale_hubs(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()


def test_a_worker_runs_every_registered_env_and_names_the_closest_for_a_misspelling():
    import embodied.components  # noqa: F401  (fills the registries)
    from embodied.core.registry import ENVS
    from embodied.sim.worker import BATCHED_WORKER_ENVS, WORKER_ENVS, single_env_factory, worker_envs_factory

    assert sorted([*WORKER_ENVS, *BATCHED_WORKER_ENVS]) == ENVS.names()
    assert worker_envs_factory({"name": "genesis", "num_envs": 2}).func.__name__ == "GenesisEnvs"
    with pytest.raises(ValueError, match=r"unknown env worker 'maniskil'.*Did you mean 'maniskill'"):
        single_env_factory({"name": "maniskil"})
    make = single_env_factory({"name": "gymnasium", "task": "Pendulum-v1"})
    assert make.func is GymnasiumEnv and make.args[0] == GymnasiumConfig(task="Pendulum-v1")


def test_the_pipeline_serves_its_stages_in_turn_each_inference_between_its_steps():
    """The order benchmarks/harness/pipelining.py's bound assumes (tests/test_benchmark_figures.py
    works it out event by event): stage k's next inference comes after its own step has been
    received, and the policy serves the stages in turn; the last step starts no inference."""
    import torch

    from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig
    from embodied.runtime.rollout import Rollout

    env = make_gymnasium(GymnasiumConfig(task="InvertedPendulum-v4", num_envs=4, num_workers=2), seed=3)
    try:
        policy = MLPGaussianPolicy(MLPPolicyConfig(), env.spec)
        rollout = Rollout(env, policy, torch.device("cpu"), pipeline=True, pipeline_stages=2)
        rollout.start()
        events = []
        send, receive, act = env.send_stage_step, env.receive_stage_step, policy.act

        env.send_stage_step = lambda k, actions: (events.append(f"step{k}"), send(k, actions))[1]
        env.receive_stage_step = lambda k: (events.append(f"done{k}"), receive(k))[1]
        policy.act = lambda observation, *a, **kw: (events.append("act"), act(observation, *a, **kw))[1]
        rollout.collect(3)
    finally:
        env.close()
    first = ["act", "step0", "act", "step1"]
    middle = ["done0", "act", "step0", "done1", "act", "step1"]
    assert events == first + middle * 2 + ["done0", "done1"]


def test_auto_stages_keep_the_fastest_grouping_and_train_on_what_that_grouping_collects():
    """runtime.pipeline_stages=auto times each grouping on the live envs and policy, then
    leaves no trace: the batch that follows is the one a run set to the chosen grouping
    collects, sampled actions and episodes alike."""
    import time

    import torch

    from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig
    from embodied.runtime.rollout import Rollout

    class FlatInference(MLPGaussianPolicy):
        """Inference that lasts 20 ms whatever the rows, leaving the cores to the envs (a GPU's)."""

        def act(self, observation, deterministic=False, generator=None):
            time.sleep(0.02)
            return super().act(observation, deterministic, generator)

    batches, chosen = [], None
    for stages in ("auto", None):
        env = make_gymnasium(GymnasiumConfig(task="InvertedPendulum-v4", num_envs=8, num_workers=4), seed=3)
        try:
            torch.manual_seed(0)
            policy = FlatInference(MLPPolicyConfig(), env.spec)
            if stages == "auto":
                rollout = Rollout(env, policy, torch.device("cpu"), pipeline=True, pipeline_stages="auto")
                timed = rollout.choose_stages()
                assert sorted(timed) == [1, 2, 3, 4] and all(seconds > 0.02 for seconds in timed.values())
                chosen = min(timed, key=lambda k: (timed[k], k))
                # four inferences of 20 ms a step cost more than two, and pendulum steps take far less
                assert chosen < 4 and env.num_stages == chosen and rollout.pipeline == (chosen > 1)
                rollout.stages_to_choose = True  # as a fresh rollout: start() times again
                rollout.start()
                assert env.num_stages in timed
                chosen = env.num_stages
            else:
                fixed = {"pipeline": chosen > 1, "pipeline_stages": max(chosen, 2)}
                rollout = Rollout(env, policy, torch.device("cpu"), **fixed)
                rollout.start()
            batch, episodes, _ = rollout.collect(30)
            batches.append((batch, [(e.length, e.success) for e in episodes]))
        finally:
            env.close()
    (timed_batch, timed_episodes), (fixed_batch, fixed_episodes) = batches
    assert timed_episodes == fixed_episodes
    assert torch.equal(timed_batch.actions, fixed_batch.actions) and torch.equal(timed_batch.reward, fixed_batch.reward)
    assert torch.equal(timed_batch.observation.state, fixed_batch.observation.state)


def test_a_pipeline_stages_value_that_is_neither_a_count_nor_auto_is_refused_before_envs_are_built():
    from embodied.core.errors import ConfigError
    from embodied.runtime.rollout import check_pipeline_stages
    from tests.cli import embodied

    check_pipeline_stages("auto")
    check_pipeline_stages(3)
    result = embodied(
        "train", "env=mujoco_invertedpendulum", "runtime.pipeline=true", "runtime.pipeline_stages=fast", check=False
    )
    assert result.returncode != 0 and "runtime.pipeline_stages must be >= 2 or 'auto', got 'fast'" in result.stderr
    assert "built" not in result.stderr  # refused before any env was built
    with pytest.raises(ConfigError, match="got 1"):
        check_pipeline_stages(1)
