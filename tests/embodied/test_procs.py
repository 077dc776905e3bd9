"""`runtime=procs` end to end: learner, rollout and env workers as real processes."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from embodied.runs.checkpoint import load_checkpoint, resolve_checkpoint
from embodied.runtime.configs import ProcsRuntimeConfig
from embodied.runtime.procs import RolloutSupervisor
from tests.cli import embodied

PROCS = [
    "runtime=procs",
    "runtime.device=cpu",
    "runtime.rollout_device=cpu",
    "runtime.heartbeat_s=0.2",
    "runtime.peer_timeout_s=5",
    "logger.progress_bar=false",
]


def train_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "embodied.cli", "train", *PROCS, *args]


def metrics_of(run_dir: Path) -> list[dict]:
    """The run's metrics so far; a line still being written (no newline yet) is left for later."""
    path = run_dir / "metrics.jsonl"
    text = path.read_text() if path.is_file() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def updates_of(run_dir: Path) -> list[dict]:
    return [m for m in metrics_of(run_dir) if "train/iteration" in m]


def rollout_pid(run_dir: Path, index: int = 0) -> int:
    """The pid of rollout `index`, as the learner recorded it."""
    return json.loads((run_dir / "procs.json").read_text())["rollouts"][f"rollout-{index}"]


def env_workers(process: psutil.Process) -> list[psutil.Process]:
    return [p for p in process.children(recursive=True) if "embodied.sim.worker" in " ".join(p.cmdline())]


def train_interrupted(
    trainer: subprocess.Popen, run_dir: Path, interrupt, after_updates: int = 2, wait_s: float = 420.0
) -> list[dict]:
    """Once `after_updates` updates are logged, call `interrupt()` (which kills something);
    the run must finish all the same. Returns its updates."""
    try:
        wait_for(lambda: len(updates_of(run_dir)) >= after_updates, f"{after_updates} updates", trainer, wait_s)
        interrupt()
        out, err = trainer.communicate(timeout=max(600.0, wait_s))  # a restart is as slow as a start
    finally:
        trainer.kill()
    assert trainer.returncode == 0, err
    return updates_of(run_dir)


def wait_for(condition, what: str, process: subprocess.Popen, timeout_s: float = 420.0) -> None:
    """Until `condition()`; the limit only keeps a hung run from hanging the suite (a busy
    machine can take minutes to start a run's processes)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, f"training exited while waiting for {what}:\n{process.communicate()[1]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_procs_trains_and_restarts_a_killed_env_worker(tmp_path):
    run_dir = tmp_path / "run"
    trainer = subprocess.Popen(
        train_command(
            "env.num_envs=4",
            "env.num_workers=2",
            "env.transport=zmq",
            "algo.rollout_steps=25",
            "algo.num_minibatches=4",
            "algo.update_epochs=2",
            "total_env_steps=2000",
            "checkpoint_every=5",
            "eval_every=10",
            "periodic_eval_episodes=2",
            "eval_episodes=2",
            f"run_dir={run_dir}",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    rollout = []

    def kill_a_worker() -> None:
        rollout.append(psutil.Process(rollout_pid(run_dir)))
        workers = env_workers(rollout[0])
        assert len(workers) == 2, "expected the rollout to run two env workers"
        workers[0].kill()

    updates = train_interrupted(trainer, run_dir, kill_a_worker)
    assert [u["train/iteration"] for u in updates] == list(range(1, 21))
    assert updates[-1]["env_steps"] == 2000 and updates[-1]["train/policy_version"] == 20
    assert all(u["train/policy_lag"] == 0 for u in updates)  # synchronous: always the current policy
    assert updates[-1]["train/env_worker_restarts"] == 1
    assert any("eval/success_rate" in m for m in metrics_of(run_dir))
    assert (run_dir / "eval" / "PushCube-v1" / "report.md").is_file()
    assert not rollout[0].is_running() or rollout[0].status() == psutil.STATUS_ZOMBIE  # told to finish, it did


@pytest.mark.slow
def test_a_killed_rollout_process_is_restarted_and_training_continues(tmp_path):
    run_dir = tmp_path / "run"
    batch = 2 * 64
    trainer = subprocess.Popen(
        train_command(
            "experiment=mujoco_invertedpendulum",
            "env.num_envs=2",
            "env.num_workers=0",
            "algo.rollout_steps=64",
            "algo.num_minibatches=2",
            "algo.update_epochs=1",
            f"total_env_steps={20 * batch}",
            "eval_episodes=0",
            f"run_dir={run_dir}",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: len(updates_of(run_dir)) >= 3, "three updates", trainer)
        first = rollout_pid(run_dir)
        psutil.Process(first).kill()
        out, err = trainer.communicate(timeout=300)
    finally:
        trainer.kill()
    assert trainer.returncode == 0, err
    assert rollout_pid(run_dir) != first
    updates = updates_of(run_dir)
    assert updates[-1]["train/rollout_restarts"] == 1
    assert [u["train/iteration"] for u in updates] == list(range(1, 21))
    assert updates[-1]["env_steps"] == 20 * batch


@pytest.mark.slow
def test_several_rollouts_share_the_envs_and_a_killed_one_is_restarted(tmp_path):
    """Two rollout processes, each with half the envs and one env worker; every update learns
    from a trajectory of each (4 envs x 10 steps), and a killed rollout is replaced."""
    run_dir = tmp_path / "run"
    trainer = subprocess.Popen(
        train_command(
            "runtime.num_rollouts=2",
            "env.num_envs=4",
            "env.num_workers=2",
            "env.transport=zmq",
            "algo.rollout_steps=10",
            "algo.num_minibatches=2",
            "algo.update_epochs=1",
            "total_env_steps=400",
            "eval_episodes=0",
            f"run_dir={run_dir}",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    rollouts = []

    def kill_a_rollout() -> None:
        rollouts.extend(psutil.Process(rollout_pid(run_dir, index)) for index in (0, 1))
        assert [len(env_workers(rollout)) for rollout in rollouts] == [1, 1], "one env worker per rollout"
        rollouts[1].kill()

    updates = train_interrupted(trainer, run_dir, kill_a_rollout)
    assert [u["train/iteration"] for u in updates] == list(range(1, 11))
    assert [u["env_steps"] for u in updates] == [40 * i for i in range(1, 11)]  # both shares in every update
    assert all(u["train/policy_lag"] == 0 for u in updates)
    assert updates[-1]["train/rollout_restarts"] == 1
    assert rollout_pid(run_dir, 1) != rollouts[1].pid and rollout_pid(run_dir, 0) == rollouts[0].pid
    for index in (0, 1):
        log = (run_dir / "logs" / f"rollout-{index}.log").read_text()
        assert log.count("the learner finished training; exiting") == 1, log


@pytest.mark.slow
def test_learner_killed_and_resumed_uses_every_acknowledged_trajectory_once(tmp_path):
    run_dir = tmp_path / "run"
    iterations, batch = 40, 2 * 64
    args = [
        "experiment=mujoco_invertedpendulum",
        "env.num_envs=2",
        "env.num_workers=0",
        "algo.rollout_steps=64",
        "algo.num_minibatches=2",
        "algo.update_epochs=1",
        f"total_env_steps={iterations * batch}",
        "checkpoint_every=10",
        "eval_episodes=0",
        f"run_dir={run_dir}",
    ]
    trainer = subprocess.Popen(train_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Past the checkpoint at iteration 10: what came after it is consumed but not durable.
        wait_for(lambda: len(updates_of(run_dir)) >= 12, "twelve updates", trainer)
        trainer.kill()
        trainer.wait()
    finally:
        trainer.kill()
    first = rollout_pid(run_dir)
    assert psutil.pid_exists(first), "the rollout should outlive the learner"
    assert resolve_checkpoint(run_dir).name == "iter_000010"

    resumed = embodied("train", f"resume={run_dir}", check=False, timeout=300, env={**os.environ}, inherit_env=False)
    assert resumed.returncode == 0, resumed.stderr
    assert rollout_pid(run_dir) == first  # adopted, not replaced

    _, state = load_checkpoint(resolve_checkpoint(run_dir))
    updates = updates_of(run_dir)
    # Each update used exactly one trajectory; trajectories are numbered 1, 2, ... by the rollout,
    # so the learner's consumed mark equals the update count only if none was lost or used twice.
    assert [u["train/iteration"] for u in updates] == list(range(1, iterations + 1))
    assert state["procs"]["delivery"] == {"rollout-0": iterations}
    assert state["env_steps"] == iterations * batch
    assert updates[-1]["train/trajectories_resent"] >= 2  # the ones after the checkpoint came back
    assert all(u["train/policy_lag"] == 0 for u in updates)
    deadline = time.monotonic() + 30
    while psutil.pid_exists(first) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(first), "the finished learner should have ended the rollout"


@pytest.mark.slow
def test_asynchronous_training_bounds_policy_lag_and_corrects_stale_samples(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        train_command(
            "experiment=mujoco_invertedpendulum",
            "env.num_envs=2",
            "env.num_workers=0",
            "algo.rollout_steps=64",
            "algo.num_minibatches=2",
            "algo.update_epochs=2",
            "total_env_steps=2560",
            "checkpoint_every=0",
            "eval_episodes=0",
            "runtime.max_policy_lag=1",
            f"run_dir={run_dir}",
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    updates = updates_of(run_dir)
    lags = [u["train/policy_lag"] for u in updates]
    assert max(lags) == 1 and min(lags) >= 0
    stale = [u for u in updates if u["train/policy_lag"] > 0]
    assert stale and all("loss/behaviour_weight" in u for u in stale)
    assert updates[-1]["env_steps"] + 0 >= 2560


@pytest.mark.slow
def test_synchronous_procs_reproduces_local_bit_for_bit_disaggregated_or_collocated(tmp_path):
    """Same seeds, same data, same updates: the separate processes change nothing but where
    the work runs (CPU; the rollout samples from its own seeded stream in both runtimes).
    Collocated, each role's policy (the learner's optimizer state too) leaves for CPU memory
    and comes back between turns: the same again."""
    from safetensors.torch import load_file

    tiny = [
        "env.num_envs=4",
        "env.num_workers=2",
        "algo.rollout_steps=10",
        "algo.num_minibatches=2",
        "algo.update_epochs=2",
        "total_env_steps=120",
        "eval_episodes=0",
        "checkpoint_every=0",
        "runtime.device=cpu",
        "logger.progress_bar=false",
    ]
    runs = {
        "local": ["runtime=local"],
        "procs": ["runtime=procs"],
        "collocated": ["runtime=procs", "runtime.placement=collocated"],
    }
    weights = {}
    for name, runtime in runs.items():
        run_dir = tmp_path / name
        result = embodied("train", *tiny, *runtime, f"run_dir={run_dir}", check=False, timeout=300)
        assert result.returncode == 0, result.stderr
        weights[name] = load_file(str(resolve_checkpoint(run_dir) / "weights.safetensors"))
        assert [u["train/iteration"] for u in updates_of(run_dir)] == [1, 2, 3]
    collocated = updates_of(tmp_path / "collocated")
    assert all(u["train/offload_gb"] > 0 and u["train/offload_s"] > 0 for u in collocated)
    assert collocated[-1]["train/rollout_offload_s"] > 0
    for name in ("procs", "collocated"):
        assert weights["local"].keys() == weights[name].keys()
        for key in weights["local"]:
            assert (weights["local"][key] == weights[name][key]).all(), (name, key)


def test_a_rollout_that_will_not_exit_is_killed_with_its_stacks_in_its_log(tmp_path, caplog):
    """A hang at the end of a run is diagnosable: the learner has the rollout dump where
    every thread is before it kills it, and says so."""
    supervisor = RolloutSupervisor(tmp_path, ProcsRuntimeConfig())
    supervisor.log_path.parent.mkdir(parents=True)
    hanging = (
        "import logging, sys, time\n"
        f"logging.basicConfig(filename={str(supervisor.log_path)!r}, level=logging.INFO)\n"
        "from embodied.runtime.rollout_process import dump_stacks_on_signal\n"
        "dump_stacks_on_signal()\n"
        "logging.info('ready')\n"
        "def stuck_collecting():\n    time.sleep(600)\n"
        "stuck_collecting()\n"
    )
    supervisor.process = subprocess.Popen([sys.executable, "-c", hanging], start_new_session=True)
    supervisor.pid = supervisor.process.pid
    deadline = time.monotonic() + 60
    while "ready" not in supervisor.log_tail() and time.monotonic() < deadline:
        time.sleep(0.1)
    with caplog.at_level("WARNING", logger="embodied.runtime.procs"):
        supervisor.stop(timeout_s=0.5)
    assert supervisor.process.returncode == -9
    assert "stuck_collecting" in supervisor.log_path.read_text()
    assert "did not exit within 0 s; killing it" in caplog.text and "stuck_collecting" in caplog.text
