"""policy=openvla end to end at tiny widths: `embodied train` with GRPO and PPO on ManiSkill
and LIBERO, from a published folder with LoRA, sharded over learner ranks; `embodied eval` of a
published folder; the real-size benchmark's smoke run."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.core.types import EnvSpec
from embodied.policies.pretrained.openvla import OpenVLAConfig, OpenVLAPolicy
from tests.cli import GRPO_ANY_OUTCOME, NO_EVAL, QUIET, embodied

FLOAT32 = dict(precision="float32", lora_rank=0)


MANISKILL_RGB = ("env.obs_mode=rgb", "env.image_size=32", "env.num_workers=0")
# GRPO waits for whole episodes: 5-step ones instead of PickCube's 50, one group's worth per env
SHORT_EPISODES = ("env.max_episode_steps=5",)
LIBERO = ("env=libero_spatial", "env.num_workers=1", "env.settle_steps=0", "env.max_episode_steps=6")


def train(run_dir: Path, *overrides: str) -> dict:
    """One `embodied train` of the tiny float32 OpenVLA; the first update's metrics."""
    result = embodied(
        "train",
        "policy=openvla",
        "policy.precision=float32",
        *overrides,
        *NO_EVAL,
        *QUIET,
        f"run_dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.slow
def test_one_grpo_iteration_on_maniskill_cameras_with_lora(tmp_path):
    update = train(
        tmp_path / "run",
        *MANISKILL_RGB,
        *SHORT_EPISODES,
        "env.num_envs=2",
        *GRPO_ANY_OUTCOME,
        "algo.num_minibatches=2",
        "total_env_steps=10",
    )
    assert update["grpo/informative_groups"] == 1 and np.isfinite(update["loss/policy_loss"])
    assert update["loss/grad_norm"] > 0


@pytest.mark.slow
def test_one_ppo_iteration_on_maniskill_cameras(tmp_path):
    update = train(
        tmp_path / "run",
        *MANISKILL_RGB,
        "env.num_envs=2",
        "algo=ppo",
        "algo.rollout_steps=4",
        "algo.num_minibatches=1",
        "total_env_steps=8",
    )
    assert update["env_steps"] == 8 and update["loss/grad_norm"] > 0 and np.isfinite(update["loss/value_loss"])


@pytest.mark.slow
def test_one_grpo_iteration_on_libero_groups_of_one_task_and_initial_state(tmp_path):
    update = train(
        tmp_path / "run",
        "policy.decoder=parallel",
        "policy.chunk_size=2",
        *LIBERO,
        "env.task_ids=[0]",
        "env.num_envs=2",
        *GRPO_ANY_OUTCOME,
        "algo.rollout_steps=3",
        "algo.num_minibatches=1",
        "total_env_steps=6",
    )
    assert update["grpo/kept_groups"] == 1 and update["train/policy_version"] == 1


@pytest.fixture(scope="module")
def libero_checkpoint(tmp_path_factory) -> Path:
    """A tiny OpenVLA saved in the published layout with LIBERO's action statistics (the
    gripper unmasked), as an OpenVLA LIBERO fine-tune ships them."""
    spec = EnvSpec(
        state_dim=8,
        action_dim=7,
        action_low=(-1.0,) * 7,
        action_high=(1.0,) * 7,
        image_shapes={"agentview": (128, 128, 3)},
    )
    torch.manual_seed(0)
    policy = OpenVLAPolicy(OpenVLAConfig(**FLOAT32), spec)
    folder = policy.save_published(tmp_path_factory.mktemp("published") / "openvla_libero")
    action = {"q01": [-0.7] * 6 + [-1.0], "q99": [0.9] * 6 + [1.0], "mask": [True] * 6 + [False]}
    (folder / "dataset_statistics.json").write_text(json.dumps({"libero_spatial_no_noops": {"action": action}}))
    return folder


@pytest.mark.slow
def test_a_published_checkpoint_evaluates_on_libero_in_one_command(libero_checkpoint, tmp_path):
    result = embodied(
        "eval",
        "policy=openvla",
        f"policy.pretrained={libero_checkpoint}",
        "policy.statistics_key=libero_spatial",
        "suite=libero_spatial",
        "task_ids=[0]",
        "trials=1",
        *LIBERO,
        f"output={tmp_path / 'eval'}",
        "progress_bar=false",
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    trials = [json.loads(line) for line in (tmp_path / "eval" / "episodes.jsonl").read_text().splitlines()]
    assert [(t["task"], t["length"]) for t in trials] == [("libero_spatial/0", 6)]


@pytest.mark.slow
def test_one_ppo_iteration_on_libero_from_a_published_checkpoint_saves_only_what_lora_trains(
    libero_checkpoint, tmp_path
):
    from safetensors import safe_open

    from embodied.runs.checkpoint import load_checkpoint

    run_dir = tmp_path / "run"
    update = train(
        run_dir,
        f"policy.pretrained={libero_checkpoint}",
        "policy.statistics_key=libero_spatial",
        "policy.decoder=parallel",
        "policy.chunk_size=2",
        "policy.lora_rank=4",
        *LIBERO,
        "env.num_envs=2",
        "algo=ppo",
        "algo.rollout_steps=3",
        "algo.num_minibatches=1",
        "total_env_steps=12",
    )
    assert update["env_steps"] == 12 and np.isfinite(update["loss/policy_loss"])
    checkpoint = next((run_dir / "checkpoints").glob("iter_*"))
    with safe_open(str(checkpoint / "weights.safetensors"), "pt") as saved:
        names = set(saved.keys())
    assert any("lora_A" in name for name in names)
    assert not any(
        name.startswith(("vision.", "projector.")) or name.endswith("q_proj.base_layer.weight") for name in names
    )
    _, state = load_checkpoint(checkpoint)
    assert state["pretrained_frozen"]["source"] == str(libero_checkpoint)
    # the run's checkpoint evaluates: the frozen rest comes back from the published folder
    result = embodied("eval", f"checkpoint={run_dir}", "episodes=1", "progress_bar=false")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


@pytest.mark.slow
def test_the_real_size_benchmark_runs_at_tiny_size_on_a_cpu():
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "benchmarks/openvla_real_size.py", "--smoke"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    path = Path(result.stdout.strip().splitlines()[-1].removeprefix("results: "))
    results = json.loads(path.read_text())
    assert results["smoke"] and [row["decoder"] for row in results["runs"]] == ["causal", "parallel"]
    assert all(
        row["loss_finite"] and row["chunks_per_s"] > 0 and 0 < row["trainable"] < row["parameters"]
        for row in results["runs"]
    )
    assert (path.parent / "openvla_real_size.md").is_file()


@pytest.mark.slow
def test_lora_on_the_language_model_trains_sharded_over_two_learner_ranks(tmp_path):
    """FSDP units (the towers, the projector, the token embedding, each LM layer) under peft."""
    run_dir = tmp_path / "run"
    update = train(
        run_dir,
        "policy.lora_rank=4",
        *MANISKILL_RGB,
        *SHORT_EPISODES,
        "env.num_envs=4",
        *GRPO_ANY_OUTCOME,
        "algo.num_minibatches=2",
        "runtime=procs",
        "runtime.learner_ranks=2",
        "runtime.learner_sharding=fsdp",
        "runtime.device=cpu",
        "runtime.rollout_device=cpu",
        "total_env_steps=20",
    )
    assert update["grpo/informative_groups"] == 2 and update["loss/grad_norm"] > 0
    result = embodied("eval", f"checkpoint={run_dir}", "episodes=2", "progress_bar=false")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
