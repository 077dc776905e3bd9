import pytest
import torch

from embodied.core.types import EpisodeStats
from embodied.eval.episodes import summarize, wilson_interval, write_report


@pytest.mark.parametrize(
    "successes,trials,low,high",
    [
        (0, 10, 0.0, 0.2775),
        (5, 10, 0.2366, 0.7634),
        (10, 10, 0.7225, 1.0),
        (45, 50, 0.7864, 0.9565),
    ],
)
def test_wilson_interval_matches_published_values(successes, trials, low, high):
    got = wilson_interval(successes, trials)
    assert got == pytest.approx((low, high), abs=1e-4)


def test_report_groups_episodes_by_task(tmp_path):
    episodes = [
        EpisodeStats(0, "A", 1.0, 10, True),
        EpisodeStats(1, "A", 0.0, 20, False),
        EpisodeStats(0, "B", 3.0, 30, True),
    ]
    report = write_report(tmp_path, episodes, {"checkpoint": "x"})
    assert [t["task"] for t in report["tasks"]] == ["A", "B"]
    assert report["tasks"][0]["success_rate"] == 0.5 and report["tasks"][0]["mean_length"] == 15
    assert report["overall"]["episodes"] == 3
    assert "| all | 3 | 66.7% |" in (tmp_path / "report.md").read_text()
    assert summarize("none", []).success_ci95 == (0.0, 1.0)


def test_two_evaluations_of_one_flow_policy_on_one_seed_agree():
    """A flow policy's greedy mode still draws its initial noise: the evaluation's own
    stream makes it repeatable, whatever torch's global stream has done in between."""
    from embodied.build import build_env
    from embodied.eval.episodes import run_episodes
    from embodied.policies.denoising.flow import FlowPolicy, FlowPolicyConfig
    from embodied.sim.maniskill import ManiSkillConfig

    env = build_env(
        ManiSkillConfig(task="PushCube-v1", num_envs=2, num_workers=0, max_episode_steps=10), seed=3, stream=1
    )
    try:
        torch.manual_seed(0)
        policy = FlowPolicy(FlowPolicyConfig(sampler="flow_sde", hidden=[16]), env.spec)
        first, _ = run_episodes(env, policy, episodes=4, seed=5, progress=False)
        torch.randn(1000)  # the global stream moves on, as it does during training
        second, _ = run_episodes(env, policy, episodes=4, seed=5, progress=False)
        other, _ = run_episodes(env, policy, episodes=4, seed=6, progress=False)
    finally:
        env.close()
    assert [e.episode_return for e in first] == [e.episode_return for e in second]
    assert [e.episode_return for e in first] != [e.episode_return for e in other]
