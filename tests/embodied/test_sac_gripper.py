"""A discrete gripper for SAC/RLPD (HIL-SERL's grasp critic): the command of highest Q,
double DQN targets beside the arm's ensemble, resume, and the refusals."""

import copy

import numpy as np
import pytest
import torch

from embodied.algos.sac_config import SACConfig
from embodied.algos.sac_rlpd import SACRLPD
from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.policies.gaussian.squashed_gaussian import SquashedGaussianConfig, SquashedGaussianPolicy
from tests.embodied.test_sac_rlpd import SMALL, transitions

ARM_AND_GRIPPER = EnvSpec(
    state_dim=3, action_dim=3, action_low=(-2.0, -1.0, -1.0), action_high=(2.0, 1.0, 1.0), control_hz=10.0
)


def gripper_policy(commands=(-1.0, 0.0, 1.0)):
    torch.manual_seed(0)
    return SquashedGaussianPolicy(
        SquashedGaussianConfig(hidden=[32, 32], gripper_commands=list(commands)), ARM_AND_GRIPPER
    )


def constant_gripper(critic, values):
    last = critic.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor(values))


def test_a_discrete_gripper_takes_the_command_of_highest_q_and_the_gaussian_covers_the_arm():
    policy = gripper_policy()
    constant_gripper(policy.gripper_critic, [0.0, 5.0, 1.0])
    observation = Observation(state=np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32))
    for deterministic in (True, False):
        chunk = policy.act(observation, deterministic=deterministic)
        assert chunk.actions.shape == (4, 1, 3)
        assert torch.equal(chunk.actions[:, 0, 2], torch.zeros(4))  # command 0.0, sampled or not
    mean, _ = policy.distribution(policy.inputs(observation))
    assert mean.shape == (4, 2)  # the arm's two dimensions only
    arm = policy.act(observation, deterministic=True).actions[:, 0, :2]
    torch.testing.assert_close(arm, policy.to_env(torch.cat([torch.tanh(mean), torch.zeros(4, 1)], -1))[:, :2])
    # a stored action's gripper entry maps to the nearest command
    squashed = torch.tensor([[0.0, 0.0, -0.9], [0.0, 0.0, 0.2], [0.0, 0.0, 0.7], [0.0, 0.0, 1.0]])
    assert policy.gripper_index(squashed).tolist() == [0, 1, 2, 2]


def test_the_gripper_critic_learns_double_dqn_targets_and_the_ensemble_sees_the_arm_only():
    policy = gripper_policy(commands=(-1.0, 1.0))
    algo = SACRLPD(SACConfig(**SMALL, gamma=0.9, tau=0.005), policy)
    assert algo.critics.net[0].weight.shape[1] == 3 + 2  # state and the arm's actions
    gripper = set(policy.gripper_critic.parameters())
    assert not gripper & {p for group in algo.actor_optimizer.param_groups for p in group["params"]}
    assert gripper == {p for group in algo.gripper_optimizer.param_groups for p in group["params"]}
    # online picks the next command (index 0: 3 > 1), the target values it: 10, not its own max 20
    constant_gripper(policy.gripper_critic, [3.0, 1.0])
    constant_gripper(algo.target_gripper, [10.0, 20.0])
    batch = transitions(4, action_dim=3)
    batch.action[:, 2] = torch.tensor([-1.0, 1.0, 1.0, -1.0])
    batch.reward[:] = torch.tensor([0.0, 1.0, 2.0, 3.0])
    batch.discount[:] = torch.tensor([1.0, 1.0, 0.0, 1.0])
    target = batch.reward.double() + 0.9 * batch.discount.double() * 10.0
    q = torch.tensor([3.0, 1.0, 1.0, 3.0], dtype=torch.float64)  # of the commands the batch took
    metrics = algo.gripper_step(batch)
    assert metrics["train/gripper_critic_loss"] == pytest.approx(float(((q - target) ** 2).mean()), rel=1e-6)
    assert metrics["train/gripper_q_mean"] == pytest.approx(2.0)
    # the target moved a Polyak step towards the online critic
    torch.testing.assert_close(
        algo.target_gripper.net[-1].bias, torch.tensor([10.0, 20.0]).lerp(torch.tensor([3.0, 1.0]), 0.005)
    )
    actor_before = [p.clone() for p in policy.net.parameters()]
    algo.gripper_step(batch)
    assert all(torch.equal(a, b) for a, b in zip(actor_before, policy.net.parameters()))


def test_a_discrete_gripper_resumes_with_its_target_and_optimizer():
    batches = [transitions(4, seed=seed, action_dim=3) for seed in range(4)]
    first = SACRLPD(SACConfig(**SMALL), policy := gripper_policy())
    for batch in batches[:2]:
        first.learn(batch)
    resumed = SACRLPD(SACConfig(**SMALL), resumed_policy := gripper_policy())
    resumed_policy.load_state_dict(policy.state_dict())
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    for batch in batches[2:]:
        torch.manual_seed(2)
        a = first.learn(batch)
        torch.manual_seed(2)
        assert resumed.learn(batch) == a
    for x, y in zip(first.target_gripper.state_dict().values(), resumed.target_gripper.state_dict().values()):
        assert torch.equal(x, y)


@pytest.mark.parametrize(
    "commands, message",
    [([1.0], "at least two different"), ([-1.0, -1.0], "at least two different"), ([-1.0, 2.0], "outside")],
)
def test_gripper_commands_the_gripper_cannot_take_are_refused(commands, message):
    with pytest.raises(ConfigError, match=message):
        gripper_policy(commands)


def test_a_discrete_gripper_is_refused_by_learners_that_need_its_likelihood():
    policy = gripper_policy()
    observation = Observation(state=np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(ConfigError, match="only algo=sac_rlpd trains"):
        policy.recompute(observation, policy.act(observation))
    with pytest.raises(ConfigError, match="only algo=sac_rlpd trains"):
        policy.bc_loss(observation, torch.zeros(2, 1, 3))
    from embodied.algos.ppo import PPOConfig
    from embodied.build import build_algo

    with pytest.raises(ConfigError, match="algo 'ppo' cannot train policy.gripper_commands"):
        build_algo(PPOConfig(), policy)  # refused when the run is built, before any rollout
