"""`embodied eval suite=...` on real LIBERO: counts, resume after a kill, report fields."""

import json
import os
import signal
import time

import pytest

from embodied.config import EvalConfig
from embodied.core.errors import ConfigError
from embodied.eval.suites import evaluate_suite
from tests.cli import NO_EVAL, QUIET, start

LIBERO_STATE = ["env=libero_goal", "env.cameras=[]", "env.num_workers=1", "env.settle_steps=0"]


@pytest.fixture(scope="module")
def libero_checkpoint(tmp_path_factory):
    """An MLP trained one iteration on LIBERO's proprio state: it fits every LIBERO task."""
    run_dir = tmp_path_factory.mktemp("libero") / "run"
    trainer = start(
        "train",
        *LIBERO_STATE,
        "env.num_envs=2",
        "env.task_ids=[0,1]",
        "algo.rollout_steps=4",
        "algo.num_minibatches=2",
        "total_env_steps=8",
        *NO_EVAL,
        *QUIET,
        f"run_dir={run_dir}",
    )
    _, err = trainer.communicate(timeout=600)
    assert trainer.returncode == 0, err
    return run_dir


def eval_args(run_dir, output, trials=3, videos=0):
    return [
        f"checkpoint={run_dir}",
        "suite=libero_goal",
        "task_ids=[0,2]",
        f"trials={trials}",
        *LIBERO_STATE,
        "env.num_envs=2",
        "env.max_episode_steps=4",
        f"video_episodes={videos}",
        "progress_bar=false",
        f"output={output}",
    ]


@pytest.mark.slow
def test_suite_eval_runs_every_task_times_trials_with_trial_seeds(libero_checkpoint, tmp_path):
    output = tmp_path / "eval"
    process = start("eval", *eval_args(libero_checkpoint, output, videos=2))
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err
    records = [json.loads(line) for line in (output / "episodes.jsonl").read_text().splitlines()]
    assert sorted((r["task"], r["trial"]) for r in records) == [
        (t, k) for t in ("libero_goal/0", "libero_goal/2") for k in range(3)
    ]
    assert all(r["seed"] == r["trial"] and r["length"] == 4 for r in records)
    report = json.loads((output / "report.json").read_text())
    assert report["overall"]["episodes"] == 6 and [t["episodes"] for t in report["tasks"]] == [3, 3]
    assert report["groups"][0]["task"] == "libero_goal" and report["groups"][0]["episodes"] == 6
    assert report["instructions"]["libero_goal/2"] == "put the wine bottle on top of the cabinet"
    low, high = report["tasks"][0]["success_ci95"]
    assert low == 0.0 and 0.5 < high < 0.6  # Wilson interval of 0/3
    assert "| libero_goal/0 | 3 |" in (output / "report.md").read_text()
    for trial in ("trial_000", "trial_001"):  # both envs of the first wave filmed
        assert (output / "videos" / "libero_goal_0" / f"{trial}.mp4").stat().st_size > 0
    assert not (output / "videos" / "libero_goal_0" / "trial_002.mp4").exists()


@pytest.mark.slow
def test_a_killed_suite_eval_continues_where_it_stopped(libero_checkpoint, tmp_path):
    output = tmp_path / "eval"
    log = output / "episodes.jsonl"
    process = start("eval", *eval_args(libero_checkpoint, output, trials=4), start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (log.is_file() and len(log.read_text().splitlines()) >= 2):
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "no trial finished in time"
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    before = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert 2 <= len(before) < 8
    resumed = start("eval", *eval_args(libero_checkpoint, output, trials=4))
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    after = [json.loads(line) for line in log.read_text().splitlines()]
    assert after[: len(before)] == before  # kept, not rerun
    assert sorted((r["task"], r["trial"]) for r in after) == [
        (t, k) for t in ("libero_goal/0", "libero_goal/2") for k in range(4)
    ]


def test_suite_eval_refuses_to_mix_settings_into_an_existing_output(libero_checkpoint, tmp_path):
    output = tmp_path / "eval"
    (output).mkdir()
    (output / "episodes.jsonl").write_text("")
    (output / "eval_config.json").write_text(json.dumps({"trials": 99}))
    config = EvalConfig(checkpoint=str(libero_checkpoint), suite="libero_goal", trials=3, output=str(output))
    with pytest.raises(ConfigError, match="other settings"):
        evaluate_suite(config)
    with pytest.raises(ConfigError, match="libero_goal"):
        evaluate_suite(EvalConfig(checkpoint=str(libero_checkpoint), suite="libero_gaol", output=str(tmp_path / "x")))


@pytest.mark.slow
def test_maniskill_suite_in_the_same_harness(tmp_path):
    run_dir = tmp_path / "run"
    trainer = start(
        "train",
        "env.num_envs=2",
        "algo.rollout_steps=4",
        "algo.num_minibatches=2",
        "total_env_steps=8",
        *NO_EVAL,
        *QUIET,
        f"run_dir={run_dir}",
    )
    _, err = trainer.communicate(timeout=600)
    assert trainer.returncode == 0, err
    output = tmp_path / "eval"
    report = evaluate_suite(
        EvalConfig(
            checkpoint=str(run_dir), suite="maniskill", task_ids=[0], trials=2, output=str(output), progress_bar=False
        )
    )
    assert report == output
    result = json.loads((output / "report.json").read_text())
    assert [t["task"] for t in result["tasks"]] == ["maniskill/PushCube-v1"] and result["overall"]["episodes"] == 2
    assert result["instructions"]["maniskill/PushCube-v1"] == "push the cube to the goal region"
    # A state policy for PushCube does not fit PickCube's observations: said so, by task.
    with pytest.raises(ConfigError, match="does not fit maniskill/PickCube-v1"):
        evaluate_suite(
            EvalConfig(
                checkpoint=str(run_dir),
                suite="maniskill",
                task_ids=[1],
                trials=1,
                output=str(tmp_path / "pick"),
                progress_bar=False,
            )
        )
