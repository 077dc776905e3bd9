"""End to end through the `embodied` command on real ManiSkill."""

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.cli import embodied, start

TINY = [
    "env.num_envs=2",
    "algo.rollout_steps=8",
    "algo.num_minibatches=2",
    "algo.update_epochs=2",
    "policy.actor_hidden=[32,32]",
    "policy.critic_hidden=[32,32]",
    "checkpoint_every=1",
    "eval_every=1",
    "periodic_eval_episodes=2",
    "logger.progress_bar=false",
    "runtime.device=cpu",
]
STEPS_PER_ITERATION = 2 * 8


def latest(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text()


def assert_same_checkpoint(a: Path, b: Path):
    for name in ("weights.safetensors", "state.safetensors"):
        left, right = load_file(str(a / name)), load_file(str(b / name))
        assert left.keys() == right.keys()
        for key in left:
            assert (left[key] == right[key]).all(), f"{name}:{key} differs"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "full"
    embodied("train", *TINY, f"run_dir={run_dir}", f"total_env_steps={2 * STEPS_PER_ITERATION}", "eval_episodes=2")
    return run_dir


@pytest.mark.slow
def test_training_writes_checkpoints_logs_and_an_eval_report(uninterrupted):
    checkpoint = latest(uninterrupted)
    assert checkpoint.name == "iter_000002"
    for name in ("weights.safetensors", "state.safetensors", "state.json", "config.yaml"):
        assert (checkpoint / name).is_file()
    assert not list((uninterrupted / "checkpoints").glob(".tmp-*"))
    lines = [json.loads(line) for line in (uninterrupted / "metrics.jsonl").read_text().splitlines()]
    training = [line for line in lines if "loss/approx_kl" in line]
    evaluations = [line for line in lines if "eval/success_rate" in line]
    assert [line["env_steps"] for line in training] == [STEPS_PER_ITERATION, 2 * STEPS_PER_ITERATION]
    assert [line["env_steps"] for line in evaluations] == [STEPS_PER_ITERATION, 2 * STEPS_PER_ITERATION]
    assert {"loss/clipfrac", "loss/explained_variance", "train/env_steps_per_s"} <= set(training[0])
    assert list((uninterrupted / "tensorboard").iterdir())
    report = json.loads((uninterrupted / "eval" / "PushCube-v1" / "report.json").read_text())
    assert report["overall"]["episodes"] == 2 and report["tasks"][0]["task"] == "PushCube-v1"
    assert "| PushCube-v1 | 2 |" in (uninterrupted / "eval" / "PushCube-v1" / "report.md").read_text()


@pytest.mark.slow
def test_resumed_run_reproduces_the_uninterrupted_one(uninterrupted, tmp_path):
    run_dir = tmp_path / "resumed"
    embodied("train", *TINY, f"run_dir={run_dir}", f"total_env_steps={STEPS_PER_ITERATION}", "eval_episodes=0")
    assert latest(run_dir).name == "iter_000001"
    embodied("train", f"resume={run_dir}", f"total_env_steps={2 * STEPS_PER_ITERATION}", "eval_episodes=0")
    assert latest(run_dir).name == "iter_000002"
    assert_same_checkpoint(latest(run_dir), latest(uninterrupted))
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["env_steps"] for line in lines if "loss/approx_kl" in line] == [
        STEPS_PER_ITERATION,
        2 * STEPS_PER_ITERATION,
    ]


@pytest.mark.slow
def test_a_time_limit_ends_the_run_with_a_checkpoint_and_can_be_raised_on_resume(tmp_path):
    run_dir = tmp_path / "timed"
    embodied("train", *TINY, f"run_dir={run_dir}", "total_env_steps=100000", "time_limit_s=0.001", "eval_episodes=0")
    assert latest(run_dir).name == "iter_000001"
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["env_steps"] for line in lines if "loss/approx_kl" in line] == [STEPS_PER_ITERATION]
    embodied(
        "train",
        f"resume={run_dir}",
        "time_limit_s=1e9",
        f"total_env_steps={2 * STEPS_PER_ITERATION}",
        "eval_episodes=0",
    )
    assert latest(run_dir).name == "iter_000002"


def test_a_time_limit_that_is_not_positive_is_refused(tmp_path):
    result = embodied("train", *TINY, f"run_dir={tmp_path / 'run'}", "time_limit_s=0", check=False)
    assert result.returncode != 0
    assert "'time_limit_s' must be > 0" in result.stderr
    assert not list((tmp_path / "run").glob("checkpoints/*"))


@pytest.mark.slow
def test_eval_command_reports_wilson_interval_and_writes_video(uninterrupted, tmp_path):
    result = embodied(
        "eval",
        f"checkpoint={uninterrupted}",
        "episodes=3",
        "video_episodes=1",
        f"output={tmp_path}",
        "env=maniskill_pushcube",
        "env.num_envs=1",
        "env.render_size=64",
    )
    report = json.loads((tmp_path / "report.json").read_text())
    overall = report["overall"]
    assert overall["episodes"] == 3
    low, high = overall["success_ci95"]
    assert 0.0 <= low <= overall["success_rate"] <= high <= 1.0
    assert report["policy_version"] == 2 and report["env_steps"] == 2 * STEPS_PER_ITERATION
    assert (tmp_path / "videos" / "episode_000.mp4").stat().st_size > 0
    assert "report.md" in result.stdout


def test_eval_of_a_missing_checkpoint_fails_with_a_clear_error(tmp_path):
    result = embodied("eval", f"checkpoint={tmp_path / 'nowhere'}", check=False)
    assert result.returncode == 2
    assert "no checkpoint or run directory at" in result.stderr
    assert "Traceback" not in result.stderr


def test_resume_of_a_run_without_checkpoints_fails_clearly(tmp_path):
    result = embodied("train", f"resume={tmp_path}", check=False)
    assert result.returncode == 2 and "holds no checkpoint" in result.stderr


def test_a_new_run_into_a_folder_that_holds_one_is_refused_and_leaves_it_untouched(uninterrupted):
    before = {name: (uninterrupted / name).read_text() for name in ("metrics.jsonl", "config.yaml")}
    result = embodied("train", *TINY, f"run_dir={uninterrupted}", check=False)
    assert result.returncode == 2 and "already holds a run" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert {name: (uninterrupted / name).read_text() for name in before} == before


def test_resume_from_an_older_checkpoint_is_refused_and_leaves_the_run_untouched(uninterrupted):
    older = uninterrupted / "checkpoints" / "iter_000001"
    before = (older / "config.yaml").read_text()
    result = embodied("train", f"resume={older}", check=False)
    assert result.returncode == 2 and "pass the run directory" in result.stderr
    assert (older / "config.yaml").read_text() == before
    assert not (older / "checkpoints").exists()


def test_the_starting_command_again_with_resume_added_is_taken_and_a_real_change_named(uninterrupted):
    """A user's habit: the command that started the run, with resume= added. Restated values
    that equal the run's are taken; one that differs is refused with both values."""
    from embodied.core.errors import ConfigError
    from embodied.train import resume_config

    again = ["env=maniskill_pushcube", "algo=ppo_maniskill", "runtime=local", "policy=mlp_gaussian", *TINY]
    config = resume_config(str(uninterrupted), [*again, "total_env_steps=64"])
    assert (config.total_env_steps, config.algo.update_epochs, config.env.num_envs) == (64, 2, 2)
    assert config.resume == str(uninterrupted)
    for change, refused in (
        ("algo.update_epochs=3", r"cannot change 'algo\.update_epochs' .* \(the run has 2, this command 3\)"),
        ("runtime=procs", r"cannot change 'runtime\.name' .* \(the run has 'local', this command 'procs'\)"),
        (
            "env=maniskill_pickcube",
            r"cannot change 'env\.task' .* \(the run has 'PushCube-v1', this command 'PickCube-v1'",
        ),
        # PPO's own defaults beside the keys restated: ppo_maniskill's discount is not PPO's
        ("algo=ppo", r"cannot change 'algo\.gamma' .* \(the run has 0\.8, this command 0\.99\)"),
    ):
        with pytest.raises(ConfigError, match=refused):
            resume_config(str(uninterrupted), [*again, change])


@pytest.mark.slow
def test_a_replay_that_diverges_stops_the_resume_and_env_resume_fresh_starts_new_episodes(tmp_path):
    from embodied.runs.checkpoint import load_checkpoint, save_checkpoint

    run_dir = tmp_path / "run"
    embodied(
        "train",
        *TINY,
        "env.num_workers=0",
        f"run_dir={run_dir}",
        f"total_env_steps={STEPS_PER_ITERATION}",
        "eval_episodes=0",
    )
    checkpoint = latest(run_dir)
    weights, state = load_checkpoint(checkpoint)
    state["env"]["observation_state"] = state["env"]["observation_state"] + 1.0  # what a drifting replay looks like
    save_checkpoint(checkpoint.parent, checkpoint.name, weights, state, (checkpoint / "config.yaml").read_text())

    more = f"total_env_steps={2 * STEPS_PER_ITERATION}"
    diverged = embodied("train", f"resume={run_dir}", more, "eval_episodes=0", check=False)
    assert diverged.returncode == 2 and "env_resume=fresh" in diverged.stderr and "Traceback" not in diverged.stderr
    assert latest(run_dir).name == "iter_000001"  # nothing written past the checkpoint
    embodied("train", f"resume={run_dir}", more, "env_resume=fresh", "eval_episodes=0")
    assert latest(run_dir).name == "iter_000002"


@pytest.mark.parametrize(
    "transport, stop", [("pipe", signal.SIGINT), ("zmq", signal.SIGTERM)], ids=["pipe-sigint", "zmq-sigterm"]
)
@pytest.mark.slow
def test_sigterm_ends_training_as_ctrl_c_does_leaving_no_worker_or_socket(tmp_path, transport, stop):
    """A scheduler's preemption sends SIGTERM: the env workers are closed, the hub's socket
    folder removed, and the run says where to resume from. SIGINT does the same as Ctrl-C also
    where the run started with it ignored, as a script's background job does (Python would
    leave it ignored, and a script stopping the run that way would wait on it for nothing)."""
    run_dir, mark = tmp_path / "run", f"EMBODIED_TEST_RUN={tmp_path}"
    trainer = start(
        "train",
        *TINY,
        "env.num_workers=2",
        f"env.transport={transport}",
        "total_env_steps=1000000",
        f"run_dir={run_dir}",
        stdout=subprocess.DEVNULL,
        # TMPDIR: where the hub's socket folder goes; the mark: inherited by every worker
        env={"TMPDIR": str(tmp_path), "EMBODIED_TEST_RUN": str(tmp_path)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )

    def marked() -> list[str]:  # this run's processes: the trainer and its workers
        found = []
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                if mark.encode() in environ.read_bytes().split(b"\0"):
                    found.append(environ.parent.name)
            except OSError:  # ended while being read, or not ours to read
                continue
        return found

    try:
        deadline = time.monotonic() + 420
        while not (run_dir / "checkpoints" / "latest").is_file():
            assert trainer.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.2)
        assert bool(list(tmp_path.glob("embodied-env-*"))) == (transport == "zmq")  # the workers' hub is up
        assert len(marked()) >= 3
        trainer.send_signal(stop)
        _, stderr = trainer.communicate(timeout=120)
    finally:  # a failed assertion leaves no million-step run behind
        trainer.kill()
    ending = (143, "terminated") if stop == signal.SIGTERM else (130, "interrupted")
    assert trainer.returncode == ending[0], stderr[-2000:]
    assert f"{ending[1]}; resume from the last checkpoint" in stderr, stderr[-2000:]
    assert not list(tmp_path.glob("embodied-env-*"))
    deadline = time.monotonic() + 30
    while marked() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not marked()
