"""A published model from a folder to a LIBERO table with no run and no SFT in between:
`embodied eval policy=pi05 policy.pretrained=<dir> suite=...`, and the same model through
`embodied serve` to `embodied robot` driving LIBERO. The model is a tiny pi0.5 saved with
lerobot's published LIBERO feature names (tests/policies/published.py)."""

import json
import signal
import subprocess
from pathlib import Path

import pytest

from embodied.sim.libero import LiberoConfig, libero_python
from tests.cli import embodied, start
from tests.policies.published import LIBERO_LEROBOT_CAMERAS, save_published_pi0
from tests.robots.test_deploy import free_endpoint

TINY_MODEL = ("policy=pi05", "policy.vocab_size=300")  # the one size its config.json cannot name
LIBERO_ENV = ("env=libero_spatial", "env.num_workers=1", "env.settle_steps=0", "env.max_episode_steps=6")


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    return save_published_pi0(
        tmp_path_factory.mktemp("published") / "pi05_libero", "pi05", LIBERO_LEROBOT_CAMERAS, 8, 7
    )


@pytest.mark.slow
def test_a_published_checkpoint_evaluates_on_libero_and_libero_pro_in_one_command(published, tmp_path):
    output = tmp_path / "eval"
    result = embodied(
        "eval",
        *TINY_MODEL,
        f"policy.pretrained={published}",
        "policy.features=libero_lerobot",
        "suite=[libero_spatial,libero_spatial_swap]",
        "task_ids=[0]",
        "trials=2",
        *LIBERO_ENV,
        f"output={output}",
        "progress_bar=false",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((output / "report.json").read_text())
    assert report["checkpoint"] == str(published)
    rows = {group["task"]: group["episodes"] for group in report["groups"]}
    assert rows == {"libero_spatial": 2, "libero_spatial_swap": 2}  # a row per perturbation
    trials = [json.loads(line) for line in (output / "episodes.jsonl").read_text().splitlines()]
    assert sorted((t["task"], t["trial"]) for t in trials) == [
        ("libero_spatial/0", 0),
        ("libero_spatial/0", 1),
        ("libero_spatial_swap/0", 0),
        ("libero_spatial_swap/0", 1),
    ]
    assert all(t["length"] == 6 for t in trials)  # the model drove each episode to the step limit


@pytest.mark.slow
def test_a_checkpoint_whose_inputs_the_env_cannot_name_is_refused_before_any_episode(published, tmp_path):
    result = embodied(
        "eval",
        *TINY_MODEL,
        f"policy.pretrained={published}",
        "suite=libero_spatial",
        "task_ids=[0]",
        "trials=1",
        *LIBERO_ENV,
        f"output={tmp_path / 'eval'}",
        check=False,
    )
    assert result.returncode != 0
    message = result.stdout + result.stderr
    assert "input_features reads ['observation.images.image', 'observation.images.image2']" in message
    assert "libero_lerobot" in message and "Traceback" not in message
    assert not (tmp_path / "eval" / "episodes.jsonl").exists()  # no trial counted


def test_eval_and_serve_take_a_run_or_a_published_model_and_say_which_is_missing(published):
    from embodied.config import EvalConfig
    from embodied.core.errors import ConfigError
    from embodied.evaluate import evaluate_checkpoint
    from embodied.policies.pretrained.pi0 import Pi05Config
    from embodied.serve import ServeConfig, load_checkpoint_policy

    model = Pi05Config(pretrained=str(published), vocab_size=300)
    with pytest.raises(ConfigError, match="not both"):
        evaluate_checkpoint(EvalConfig(checkpoint="runs/x", policy=model, suite="libero_spatial"))
    with pytest.raises(ConfigError, match="without policy.pretrained has random weights"):
        evaluate_checkpoint(EvalConfig(policy=Pi05Config(), suite="libero_spatial"))
    with pytest.raises(ConfigError, match="give env=<env config> or suite="):
        evaluate_checkpoint(EvalConfig(policy=model))
    with pytest.raises(ConfigError, match="needs env=<env config>"):
        load_checkpoint_policy(ServeConfig(policy=model))
    with pytest.raises(ConfigError, match="env= goes with policy.pretrained"):
        load_checkpoint_policy(ServeConfig(checkpoint="runs/x", env=LiberoConfig()))


@pytest.mark.slow
def test_a_published_checkpoint_is_served_to_a_libero_robot(published, tmp_path):
    """The server builds the model for the env's spec; the robot client runs under LIBERO's
    own interpreter (the env lives there) and never needs torch."""
    endpoint = free_endpoint()
    server = start(
        "serve",
        *TINY_MODEL,
        f"policy.pretrained={published}",
        "policy.features=libero_lerobot",
        *LIBERO_ENV,
        f"endpoint={endpoint}",
        "stats_every_s=0",
        stderr=subprocess.STDOUT,
    )
    try:
        seen = []
        for line in server.stdout:  # LIBERO's workers print first; the server says when it serves
            seen.append(line)
            if line.startswith("serving"):
                break
        assert seen and seen[-1].startswith("serving pi05 (version 0, pi05_libero)"), "".join(seen)
        output = tmp_path / "robot"
        robot_env = "{name: libero, suite: libero_spatial, task_ids: [0], settle_steps: 0}"
        result = embodied(
            "robot",
            "robot=sim",
            f"robot.env={robot_env}",
            f"server={endpoint}",
            "episodes=1",
            # 6 s, with room for a LIBERO step with two cameras and the model's answer in each tick,
            # and for a first answer that a busy machine delays past the first ticks (they hold)
            "max_episode_steps=12",
            "control_hz=2",
            "request_timeout_s=30",
            f"output={output}",
            python=libero_python(LiberoConfig()),
            env={"MUJOCO_GL": "egl", "PATH": "/usr/bin:/bin"},
            inherit_env=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        summary = json.loads((output / "summary.json").read_text())
        assert summary["policy"] == "pi05" and summary["episodes"][0]["ticks"] == 12
        assert summary["action_sources"]["policy"] > 0  # the model's actions drove the robot
        assert summary["safety_interventions"]["bounds"] == 0  # served actions are the env's, clipped as executed
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)
