import numpy as np
import pytest
import torch

from embodied.algos.advantages import group_normalized
from embodied.algos.grpo import DynamicSampling, Group, grpo_loss
from tests.cli import GRPO_ANY_OUTCOME, NO_EVAL, QUIET, embodied


def test_group_advantages_on_hand_made_groups():
    returns = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 5.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    advantages = group_normalized(returns, groups)
    std = np.std([1, 0, 0, 1], ddof=1)
    np.testing.assert_allclose(advantages[:4].numpy(), np.array([0.5, -0.5, -0.5, 0.5]) / (std + 1e-6), rtol=1e-6)
    assert advantages[4:].tolist() == [0.0, 0.0, 0.0]  # no spread, and a group of one: nothing to compare


def test_grpo_loss_matches_a_reference_with_asymmetric_clip_and_token_mean():
    rng = np.random.default_rng(0)
    old = rng.normal(size=(4, 6))
    new = old + rng.normal(scale=0.4, size=(4, 6))
    advantages = np.array([1.0, -1.0, 0.5, -2.0])
    mask = np.ones((4, 6))
    mask[2, 3:] = 0  # a shorter rollout
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    loss = grpo_loss(t(new), t(old), t(advantages), t(mask), clip_low=0.2, clip_high=0.28)
    ratio = np.exp(new - old)
    a = advantages[:, None]
    per_token = -np.minimum(ratio * a, np.clip(ratio, 0.8, 1.28) * a)
    np.testing.assert_allclose(float(loss.policy_loss), (per_token * mask).sum() / mask.sum(), rtol=1e-12)
    clipped = ((ratio < 0.8) | (ratio > 1.28)) * mask
    np.testing.assert_allclose(float(loss.clipfrac), clipped.sum() / mask.sum(), rtol=1e-12)


def test_clip_higher_lets_a_positive_advantage_push_further_up_than_down():
    a = torch.tensor([1.0])
    mask = torch.ones(1, 1)
    up = grpo_loss(torch.log(torch.tensor([[1.25]])), torch.zeros(1, 1), a, mask)
    down = grpo_loss(torch.log(torch.tensor([[0.75]])), torch.zeros(1, 1), -a, mask)
    assert float(up.policy_loss) == pytest.approx(-1.25)  # inside 1 + 0.28: still has gradient
    assert float(down.policy_loss) == pytest.approx(0.8)  # clipped at 1 - 0.2


def test_dynamic_sampling_keeps_informative_groups_and_reports_tasks_never_covered():
    sampler = DynamicSampling(groups_per_batch=2)
    offers = [
        Group("push", 8, 8),
        Group("pick", 3, 8),
        Group("stack", 0, 8),
        Group("push", 8, 8),
        Group("pick", 5, 8),
        Group("pick", 4, 8),
    ]
    kept = [sampler.offer(g) for g in offers]
    assert kept == [False, True, False, False, True, False]  # the last is informative, but the batch is full
    assert sampler.full and [g.success_rate for g in sampler.take_batch()] == [3 / 8, 5 / 8]
    assert sampler.uncovered() == ["push", "stack"]
    assert sampler.metrics() == {
        "sampling/pick/informative_fraction": 1.0,
        "sampling/push/informative_fraction": 0.0,
        "sampling/stack/informative_fraction": 0.0,
    }


@pytest.mark.slow
def test_one_grpo_iteration_end_to_end_on_maniskill_with_a_token_vla(tmp_path):
    import json

    run_dir = tmp_path / "run"
    # PushCube episodes are 50 steps; 4 envs in 2 groups of 2 from two initial states.
    result = embodied(
        "train",
        "policy=token_vla",
        *GRPO_ANY_OUTCOME,
        "algo.num_minibatches=2",
        "env.num_envs=4",
        "total_env_steps=200",
        *NO_EVAL,
        *QUIET,
        f"run_dir={run_dir}",
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    update = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "grpo/success_rate" in line
    ][0]
    assert update["env_steps"] == 200
    assert update["grpo/informative_groups"] == 2 and "loss/policy_loss" in update
    assert abs(update["loss/approx_kl"]) < 0.5


def test_grouped_starts_share_the_initial_state_within_a_group():
    import numpy as np
    import torch

    from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig
    from embodied.runtime.rollout import Rollout
    from embodied.sim.maniskill import make_maniskill
    from embodied.sim.maniskill_common import ManiSkillConfig

    env = make_maniskill(ManiSkillConfig(num_envs=4), seed=0)
    try:
        rollout = Rollout(env, MLPGaussianPolicy(MLPPolicyConfig(), env.spec), torch.device("cpu"))
        rollout.start_groups(2, round_index=0, base_seed=0)
        first = rollout.observation.state
        rollout.start_groups(2, round_index=1, base_seed=0)
        second = rollout.observation.state
    finally:
        env.close()
    np.testing.assert_array_equal(first[0], first[1])
    np.testing.assert_array_equal(first[2], first[3])
    assert not np.array_equal(first[0], first[2]) and not np.array_equal(first[0], second[0])


def _episodes(instructions, steps=3, ends_at=2, success=None):
    """A batch of one short episode per env, ending at step `ends_at` (None: never)."""
    from embodied.algos.buffers import TrajectoryBuilder
    from embodied.core.types import ActionChunk, Observation, StepResult

    envs = len(instructions)
    builder = TrajectoryBuilder()
    for t in range(steps):
        observation = Observation(state=np.zeros((envs, 3), np.float32), instruction=list(instructions))
        done = np.full(envs, ends_at is not None and t == ends_at)
        result = StepResult(
            observation=observation,
            reward=np.ones(envs, np.float32),
            terminated=np.zeros(envs, bool),
            truncated=done,
            success=(np.arange(envs) % 2 == 0) if success is None else np.asarray(success, bool),
            executed_steps=np.ones(envs, np.int64),
            executed_action=np.zeros((envs, 1, 2), np.float32),
            final_observation=observation,
        )
        chunk = ActionChunk(torch.zeros(envs, 1, 2), torch.zeros(envs), torch.zeros(envs))
        builder.add(observation, chunk, result, torch.zeros(envs))
    return builder.build(torch.zeros(envs))


def test_grpo_refuses_groups_that_mix_tasks_or_episodes_that_did_not_end():
    from embodied.algos.grpo import GRPO, GRPOConfig
    from embodied.core.errors import ConfigError
    from embodied.core.types import EnvSpec
    from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig

    policy = MLPGaussianPolicy(
        MLPPolicyConfig(), EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    )
    grpo = GRPO(GRPOConfig(group_size=2, num_minibatches=1, success_band=[0.0, 1.0]), policy)
    with pytest.raises(ConfigError, match="run different tasks"):
        grpo.update(_episodes(["push", "lift", "push", "lift"]), 0.0)
    with pytest.raises(ConfigError, match="did not reach the end of the first episode"):
        grpo.update(_episodes(["push"] * 4, ends_at=None), 0.0)
    metrics = grpo.update(_episodes(["push", "push", "lift", "lift"]), 0.0)
    assert metrics["grpo/informative_groups"] == 2.0 and "loss/policy_loss" in metrics


def test_resampling_collects_batches_until_enough_informative_groups_and_survives_a_checkpoint():
    import json

    from embodied.algos.grpo import GRPO, GRPOConfig
    from embodied.core.types import EnvSpec
    from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig
    from embodied.runs.checkpoint import flatten, unflatten

    def make():
        torch.manual_seed(0)
        policy = MLPGaussianPolicy(
            MLPPolicyConfig(), EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
        )
        return policy, GRPO(
            GRPOConfig(group_size=2, num_minibatches=2, groups_per_batch=2, max_batches_per_update=3), policy
        )

    policy, grpo = make()
    before = [p.detach().clone() for p in policy.parameters()]
    solved_or_not = grpo.update(_episodes(["push"] * 4, success=[1, 1, 0, 0]), 0.0)  # no informative group
    assert solved_or_not["grpo/resampling"] == 1.0 and solved_or_not["grpo/kept_groups"] == 0.0
    one = grpo.update(_episodes(["push"] * 4, success=[1, 0, 1, 1]), 0.0)
    assert one["grpo/resampling"] == 1.0 and one["grpo/kept_groups"] == 1.0 and "loss/policy_loss" not in one
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))  # no step while resampling

    tensors = {}  # through a checkpoint's own encoding: JSON around safetensors-able tensors
    skeleton = json.dumps(flatten(grpo.state_dict(), tensors))
    saved = unflatten(json.loads(skeleton), tensors)
    restored_policy, restored = make()
    restored.load_state_dict(saved)
    last = _episodes(["push"] * 4, success=[0, 1, 0, 0])
    torch.manual_seed(1)
    full = grpo.update(last, 0.0)
    torch.manual_seed(1)
    restored.update(last, 0.0)
    assert full["grpo/kept_groups"] == 2.0 and full["grpo/batches_per_update"] == 3.0 and "loss/policy_loss" in full
    assert all(torch.equal(a, b) for a, b in zip(policy.parameters(), restored_policy.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))

    for _ in range(2):  # never informative: after max_batches_per_update it gives up on this update
        assert grpo.update(_episodes(["push"] * 4, success=[1, 1, 1, 1]), 0.0)["grpo/resampling"] == 1.0
    gave_up = grpo.update(_episodes(["push"] * 4, success=[0, 0, 0, 0]), 0.0)
    assert gave_up["grpo/batches_per_update"] == 3.0 and "grpo/resampling" not in gave_up
    assert "loss/policy_loss" not in gave_up
