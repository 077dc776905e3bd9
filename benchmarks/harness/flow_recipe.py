"""flow_rl.py's recipe on PickCube-v1 (state, end-effector control), which dsrl.py starts from
and compares against: scripted-expert demos, SFT of the flow and the diffusion policy on them,
and the PPO settings RL fine-tunes them with."""

from __future__ import annotations

from pathlib import Path

from harness.commands import embodied, sft_or_resume
from harness.runs import RUNS

DEMOS = RUNS / "flow-demos"
DEMO_EPISODES, SFT_STEPS = 50, 3000  # scripted-expert episodes; SFT steps per policy
ENV = ["env=maniskill_pickcube", "env.control_mode=pd_ee_delta_pos"]
POLICIES = {"flow": ["policy=flow"], "diffusion": ["policy=diffusion"]}
RL = [
    "algo=ppo_maniskill",
    "algo.lr=1e-4",
    "algo.critic_warmup_iterations=3",
    "eval_every=5",
    "periodic_eval_episodes=32",
    "checkpoint_every=10",
    "seed=1",
]
FLOW_SDE_SAMPLER = ["policy.sampler=flow_sde"]  # one stochastic denoising step per chunk
# DSRL's latent actor and critics, sized for a CPU core per run (DSRL's paper uses 256-wide networks)
DSRL_LEARNER = [
    "policy.latent_actor=true",
    "policy.latent_hidden=[128,128]",
    "algo=dsrl",
    "algo.critic_hidden=[128,128]",
    "algo.batch_size=128",
    "algo.utd_ratio=2",
]


def sft_dir(policy: str) -> Path:
    """Where the policy's SFT run is."""
    return RUNS / f"{policy}-sft"


def demos_and_sft(demos: int, sft_steps: int, policies: list[str]) -> None:
    """The demos, then each policy's SFT on them (an interrupted SFT run continues)."""
    embodied("demos", *ENV, f"episodes={demos}", f"dataset={DEMOS}", "progress_bar=false")
    for policy in policies:
        sft_or_resume(sft_dir(policy), sft_steps, [*ENV, *POLICIES[policy], f"dataset={DEMOS}"])
