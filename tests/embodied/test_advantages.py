import torch

from embodied.algos.advantages import explained_variance, gae


def reference_gae(reward, value, terminated, truncated, bootstrap, last_value, gamma, lam):
    """Plain-Python GAE written from the definition, one env at a time."""
    steps, envs = len(reward), len(reward[0])
    advantages = [[0.0] * envs for _ in range(steps)]
    for b in range(envs):
        running = 0.0
        for t in reversed(range(steps)):
            if terminated[t][b]:
                next_value, carry = 0.0, 0.0
            elif truncated[t][b]:
                next_value, carry = bootstrap[t][b], 0.0
            else:
                next_value = last_value[b] if t == steps - 1 else value[t + 1][b]
                carry = 1.0
            delta = reward[t][b] + gamma * next_value - value[t][b]
            running = delta + gamma * lam * carry * running
            advantages[t][b] = running
    return advantages


def test_gae_matches_hand_computed_values_for_a_terminated_episode():
    # One env, 3 steps, terminated at the last step: the tail bootstraps from 0.
    reward = torch.tensor([[1.0], [0.0], [2.0]])
    value = torch.tensor([[0.5], [0.4], [0.3]])
    terminated = torch.tensor([[False], [False], [True]])
    truncated = torch.zeros_like(terminated)
    advantages, returns = gae(reward, value, terminated, truncated, torch.zeros(3, 1), torch.tensor([9.0]), 0.9, 0.8)
    d2 = 2.0 - 0.3
    d1 = 0.0 + 0.9 * 0.3 - 0.4
    d0 = 1.0 + 0.9 * 0.4 - 0.5
    a2 = d2
    a1 = d1 + 0.9 * 0.8 * a2
    a0 = d0 + 0.9 * 0.8 * a1
    torch.testing.assert_close(advantages[:, 0], torch.tensor([a0, a1, a2]))
    torch.testing.assert_close(returns, advantages + value)


def test_gae_bootstraps_truncated_episodes_from_the_final_observation_value():
    reward = torch.tensor([[1.0], [1.0]])
    value = torch.tensor([[0.2], [0.7]])
    terminated = torch.tensor([[False], [False]])
    truncated = torch.tensor([[True], [False]])
    bootstrap = torch.tensor([[5.0], [0.0]])
    advantages, _ = gae(reward, value, terminated, truncated, bootstrap, torch.tensor([3.0]), 0.99, 0.95)
    a1 = 1.0 + 0.99 * 3.0 - 0.7
    a0 = 1.0 + 0.99 * 5.0 - 0.2  # from the final observation, not value[1] of the next episode
    torch.testing.assert_close(advantages[:, 0], torch.tensor([a0, a1]))


def test_gae_matches_reference_on_random_batches_with_mixed_episode_ends():
    generator = torch.Generator().manual_seed(0)
    steps, envs = 7, 5
    reward = torch.randn(steps, envs, generator=generator)
    value = torch.randn(steps, envs, generator=generator)
    ends = torch.rand(steps, envs, generator=generator)
    terminated, truncated = ends < 0.15, (ends >= 0.15) & (ends < 0.3)
    bootstrap = torch.where(truncated, torch.randn(steps, envs, generator=generator), torch.zeros(steps, envs))
    last_value = torch.randn(envs, generator=generator)
    advantages, _ = gae(reward, value, terminated, truncated, bootstrap, last_value, 0.97, 0.9)
    expected = reference_gae(
        reward.tolist(),
        value.tolist(),
        terminated.tolist(),
        truncated.tolist(),
        bootstrap.tolist(),
        last_value.tolist(),
        0.97,
        0.9,
    )
    torch.testing.assert_close(advantages, torch.tensor(expected))


def test_explained_variance_is_one_for_perfect_predictions_and_zero_for_the_mean():
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(target, target) == 1.0
    assert abs(explained_variance(torch.full_like(target, target.mean()), target)) < 1e-6
