"""Every policy family through `embodied train` on real ManiSkill: one PPO iteration, from
state or from 32-64 px cameras, that builds the policy from its config, acts in the env,
updates and leaves a checkpoint. Each family's own file tests its math; this is where they
meet the env and the command. pi0 and pi0.5 run theirs from the checkpoint lerobot wrote
(tests/policies/test_pi0.py), the diffusion policy its DPPO and GRPO runs with a resume
(tests/policies/test_diffusion.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.cli import NO_EVAL, ONE_PPO_ITERATION, QUIET, embodied

CAMERAS = ("env.obs_mode=rgb", "env.image_size=32")


def check_flow_vla_round_trip(run_dir: Path) -> None:
    """The checkpoint loads into a freshly built policy that acts deterministically."""
    from embodied.build import build_env, build_policy
    from embodied.config import TrainConfig, to_schema
    from embodied.core.compose import compose
    from embodied.runs.checkpoint import load_checkpoint

    weights, state = load_checkpoint(run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip())
    assert state["learner"]["policy_version"] == 1
    overrides = ["policy=flow_vla", "env.obs_mode=rgb", "env.image_size=64", "env.num_envs=1", "env.num_workers=0"]
    config = to_schema(TrainConfig, compose("train", overrides))
    env = build_env(config.env, seed=0)
    try:
        observation = env.reset().to_torch()
        policy = build_policy(config.policy, env.spec, torch.device("cpu"))
        policy.load_state_dict(weights)
        policy.eval()
        # deterministic = the ODE from the initial noise; the same noise gives the same chunk
        first = policy.act(observation, deterministic=True, generator=torch.Generator().manual_seed(3)).actions
        second = policy.act(observation, deterministic=True, generator=torch.Generator().manual_seed(3)).actions
    finally:
        env.close()
    assert torch.equal(first, second) and np.isfinite(first.detach().numpy()).all()


def check_token_vla_evaluation(run_dir: Path) -> None:
    first_update = next(m for m in metrics(run_dir) if "loss/approx_kl" in m)
    assert abs(first_update["loss/approx_kl"]) < 1.0
    assert (run_dir / "eval" / "PushCube-v1" / "report.md").is_file()


FAMILIES = {  # family: (overrides, what else its run must show)
    "flow": (["policy=flow", *NO_EVAL], None),
    "token_vla": (
        ["policy=token_vla", "policy.decoder=causal", "eval_episodes=2", "eval_every=1", "periodic_eval_episodes=2"],
        check_token_vla_evaluation,
    ),
    "vlm_expert": (["policy=vlm_expert", *CAMERAS, *NO_EVAL], None),
    "smolvla": (
        [
            "policy=smolvla",
            "policy.vlm=tiny",
            "policy.max_state_dim=64",
            "policy.max_action_dim=8",
            "policy.horizon=2",
            "policy.denoise_steps=2",
            "policy.sampler=flow_noise",
            *CAMERAS,
            *NO_EVAL,
        ],
        None,
    ),
    "flow_vla": (
        ["policy=flow_vla", "env.obs_mode=rgb", "env.image_size=64", "eval_episodes=0", "runtime.device=cpu"],
        check_flow_vla_round_trip,
    ),
}


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.slow
def test_one_ppo_iteration_on_maniskill_leaves_a_checkpoint(family, tmp_path):
    overrides, check = FAMILIES[family]
    run_dir = tmp_path / "run"
    # env workers are the runtime tests' business: here the envs step in the training process
    embodied(
        "train", *overrides, "env.num_envs=2", "env.num_workers=0", *ONE_PPO_ITERATION, *QUIET, f"run_dir={run_dir}"
    )
    first_update = next(m for m in metrics(run_dir) if "loss/policy_loss" in m)
    assert first_update["env_steps"] == 8 and np.isfinite(first_update["loss/policy_loss"])
    assert (run_dir / "checkpoints" / "latest").is_file()
    if check is not None:
        check(run_dir)
