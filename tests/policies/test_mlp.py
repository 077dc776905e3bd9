import numpy as np
import torch

from embodied.core.types import EnvSpec, Observation
from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig
from embodied.policies.normalization import RunningNormalizer

SPEC = EnvSpec(state_dim=5, action_dim=3, action_low=(-1.0,) * 3, action_high=(1.0,) * 3)


def test_act_returns_chunks_whose_log_prob_evaluate_recomputes():
    torch.manual_seed(0)
    policy = MLPGaussianPolicy(MLPPolicyConfig(chunk_size=4), SPEC)
    observation = Observation(state=torch.randn(6, 5))
    chunk = policy.act(observation)
    assert chunk.actions.shape == (6, 4, 3) and chunk.log_prob.shape == (6,) and chunk.value.shape == (6,)
    recomputed = policy.recompute(observation, chunk)
    torch.testing.assert_close(recomputed.log_prob, chunk.log_prob)
    torch.testing.assert_close(recomputed.value, chunk.value)
    assert (recomputed.entropy > 0).all()


def test_deterministic_actions_are_the_mean_and_repeatable():
    policy = MLPGaussianPolicy(MLPPolicyConfig(), SPEC)
    observation = Observation(state=torch.randn(2, 5))
    assert torch.equal(policy.act(observation, True).actions, policy.act(observation, True).actions)


def test_bc_loss_falls_when_fitting_demonstrations():
    torch.manual_seed(0)
    policy = MLPGaussianPolicy(MLPPolicyConfig(chunk_size=2), SPEC)
    observation = Observation(state=torch.randn(64, 5))
    actions = torch.tanh(observation.state[:, :3]).unsqueeze(1).repeat(1, 2, 1)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    first = float(policy.bc_loss(observation, actions))
    for _ in range(200):
        loss = policy.bc_loss(observation, actions)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss) < first - 2.0


def test_running_normalizer_matches_batch_statistics():
    data = np.random.default_rng(0).normal(3.0, 2.0, size=(1000, 4))
    normalizer = RunningNormalizer(4)
    for part in np.split(data, 10):
        normalizer.update(torch.tensor(part))
    np.testing.assert_allclose(normalizer.mean.numpy(), data.mean(0), rtol=1e-6)
    np.testing.assert_allclose(normalizer.var.numpy(), data.var(0), rtol=1e-3)
    out = normalizer(torch.tensor(data, dtype=torch.float32))
    assert abs(float(out.mean())) < 0.01 and out.abs().max() <= 10.0
