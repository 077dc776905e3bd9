"""`runtime=ray` end to end on a local Ray instance: the roles of `runtime=procs` as actors."""

import os
import subprocess
import time
import uuid

import psutil
import pytest
from safetensors.torch import load_file

from embodied.runs.checkpoint import resolve_checkpoint
from tests.cli import start
from tests.embodied.test_procs import train_interrupted, updates_of, wait_for

# A Ray run starts its cluster and an actor per role, each importing torch and the simulator:
# well under a minute alone, several on a 2-core machine running a benchmark and the suite's
# other worker beside it. These limits only stop a hung run.
RAY_WAIT_S = 1200.0
pytestmark = pytest.mark.timeout(2400)

TINY = [
    "env.num_envs=4",
    "env.num_workers=2",
    "algo.rollout_steps=10",
    "algo.num_minibatches=2",
    "algo.update_epochs=2",
    "eval_episodes=0",
    "runtime.device=cpu",
    "logger.progress_bar=false",
]
RAY = [
    "runtime=ray",
    "runtime.num_cpus=2",
    "runtime.rollout_device=cpu",
    "runtime.heartbeat_s=0.2",
    "runtime.peer_timeout_s=10",
    "runtime.env_worker.num_cpus=0.5",
]  # 2 CPUs: rollout 1, workers 0.5 each


# Every process this module starts, and everything those start (the Ray cluster, its actors, their
# simulators), inherits this variable: the checks below count only this module's processes, not
# those of tests running beside it on another pytest worker.
MARK = "EMBODIED_TEST_RUN"
RUN_ID = uuid.uuid4().hex


def run_cli(*args: str) -> subprocess.Popen:
    return start(*args, env={**os.environ, MARK: RUN_ID}, inherit_env=False)


def train(*args: str) -> subprocess.Popen:
    return run_cli("train", *TINY, *args)


def ours(text: str) -> list[psutil.Process]:
    """Live processes started under this module whose command line contains `text`."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if text in " ".join(process.info["cmdline"] or []) and process.environ().get(MARK) == RUN_ID:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass  # ended meanwhile, or not ours to read
    return found


def actors(role: str) -> list[psutil.Process]:
    """The processes of live Ray actors of `role` (Ray titles them ray::<class>)."""
    return ours(f"ray::{role}")


def still_running(processes: list[psutil.Process], timeout_s: float = 30.0) -> list[psutil.Process]:
    """Those of `processes` still running after `timeout_s` (an exited one that nobody has
    reaped yet counts as ended). Ray's worker processes exit once they notice their node is
    gone, a moment after `ray.shutdown()` returns in the run."""

    def running(process: psutil.Process) -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + timeout_s
    while (alive := [process for process in processes if running(process)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def kill_one(role: str, expected: int) -> None:
    running = actors(role)
    assert len(running) == expected, f"expected {expected} {role} actors, found {len(running)}"
    running[0].kill()


@pytest.mark.slow
def test_ray_reproduces_local_bit_for_bit_with_env_workers_as_actors(tmp_path):
    """Same seeds, same data, same updates: Ray changes where the roles run, nothing else."""
    weights = {}
    for runtime in ("local", "ray"):
        run_dir = tmp_path / runtime
        extra = RAY if runtime == "ray" else ["runtime=local"]
        trainer = train(*extra, "total_env_steps=120", "checkpoint_every=0", f"run_dir={run_dir}")
        out, err = trainer.communicate(timeout=RAY_WAIT_S)
        assert trainer.returncode == 0, err
        weights[runtime] = load_file(str(resolve_checkpoint(run_dir) / "weights.safetensors"))
        assert [u["train/iteration"] for u in updates_of(run_dir)] == [1, 2, 3]
    rollout_log = (tmp_path / "ray" / "logs" / "rollout-0.log").read_text()
    assert rollout_log.count("exiting") == 1, f"the rollout did not finish cleanly:\n{rollout_log}\n{err}"
    assert weights["local"].keys() == weights["ray"].keys()
    for name in weights["local"]:
        assert (weights["local"][name] == weights["ray"][name]).all(), name


@pytest.mark.slow
def test_two_rollouts_and_a_learner_rank_as_actors_train_as_procs_does(tmp_path):
    """Ray places two rollouts (half the envs and one env worker each) and learner rank 1 as
    actors; the run takes the updates `procs` takes with the same layout, bit for bit."""
    layout = ["runtime.num_rollouts=2", "runtime.learner_ranks=2", "total_env_steps=120", "checkpoint_every=0"]
    weights = {}
    for runtime in ("procs", "ray"):
        run_dir = tmp_path / runtime
        extra = [*RAY, "runtime.num_cpus=4"] if runtime == "ray" else ["runtime=procs", "runtime.rollout_device=cpu"]
        trainer = train(*extra, *layout, f"run_dir={run_dir}")
        try:
            if runtime == "ray":
                wait_for(lambda run_dir=run_dir: len(updates_of(run_dir)) >= 1, "an update", trainer, RAY_WAIT_S)
                assert len(actors("RolloutRole")) == 2 and len(actors("LearnerRankRole")) == 1
                assert len(actors("EnvWorkerRole")) == 2
                # at the driver's priority, not Ray's default nice 15 (starved on a busy machine)
                driver_nice = psutil.Process(trainer.pid).nice()
                for role in ("RolloutRole", "LearnerRankRole", "EnvWorkerRole"):
                    assert {actor.nice() for actor in actors(role)} == {driver_nice}, role
            out, err = trainer.communicate(timeout=RAY_WAIT_S)
        finally:
            trainer.kill()
        assert trainer.returncode == 0, err
        assert [u["train/iteration"] for u in updates_of(run_dir)] == [1, 2, 3]
        weights[runtime] = load_file(str(resolve_checkpoint(run_dir) / "weights.safetensors"))
    for name in weights["procs"]:
        assert (weights["procs"][name] == weights["ray"][name]).all(), name


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a start, a worker's replacement and a rollout's restart, each as slow as a start
def test_killed_env_worker_and_rollout_actors_are_replaced_and_training_continues(tmp_path):
    """One run, two failures: an env worker actor killed after two updates is replaced (its
    rollout counts the restart), then the rollout actor itself is killed and restarted; every
    update still lands, and no actor outlives the run."""
    run_dir = tmp_path / "run"
    trainer = train(*RAY, "total_env_steps=800", "checkpoint_every=2", f"run_dir={run_dir}")
    restarts_before = []

    def kill_a_worker_then_the_rollout() -> None:
        kill_one("EnvWorkerRole", 2)
        replaced = lambda: any(u["train/env_worker_restarts"] == 1 for u in updates_of(run_dir))
        wait_for(replaced, "an update after the env worker's replacement", trainer, RAY_WAIT_S)
        restarts_before.append(updates_of(run_dir)[-1]["train/rollout_restarts"])  # 0, unless the first kill cost one
        kill_one("RolloutRole", 1)

    updates = train_interrupted(trainer, run_dir, kill_a_worker_then_the_rollout, wait_s=RAY_WAIT_S)
    assert [u["train/iteration"] for u in updates] == list(range(1, 21))
    assert updates[-1]["train/rollout_restarts"] == restarts_before[0] + 1
    assert not still_running(actors("EnvWorkerRole"))  # the actors ended with the run


@pytest.mark.slow
def test_libero_env_workers_run_as_actors_under_their_own_virtualenv(tmp_path):
    """LIBERO lives in .venv-libero (env.python): its worker actor runs it in a child process
    under that interpreter, and nothing of it outlives the run."""
    run_dir = tmp_path / "run"
    trainer = run_cli(
        "train",
        *RAY,
        "env=libero_goal",
        "env.cameras=[]",
        "env.num_workers=1",
        "env.settle_steps=0",
        "env.num_envs=2",
        "env.task_ids=[0,1]",
        "algo.rollout_steps=4",
        "algo.num_minibatches=2",
        "total_env_steps=16",
        "eval_episodes=0",
        "eval_every=0",
        "checkpoint_every=0",
        "runtime.device=cpu",
        "logger.progress_bar=false",
        f"run_dir={run_dir}",
    )
    _, err = trainer.communicate(timeout=RAY_WAIT_S)
    assert trainer.returncode == 0, err[-3000:]
    assert [u["train/iteration"] for u in updates_of(run_dir)] == [1, 2]
    assert not still_running([p for p in ours("embodied.sim.worker") if "libero" in " ".join(p.info["cmdline"] or [])])
    assert not still_running(actors("EnvWorkerRole"))
