"""Real-time chunking: the soft mask and guidance weight written out, the guided velocity
against its closed form on a linear field, and flow policies (the state flow, the tiny pi0)
sampling chunks that agree with the actions still pending."""

import math

import numpy as np
import pytest
import torch

from embodied.core.errors import ConfigError
from embodied.core.types import ChunkPrefix, EnvSpec, Observation
from embodied.policies.denoising.flow import FlowPolicy, FlowPolicyConfig
from embodied.policies.denoising.realtime import guidance_weight, guided_velocity, prefix_weights
from tests.policies.tiny import tiny_pi0

SPEC = EnvSpec(state_dim=4, action_dim=2, action_low=(-1.0, -2.0), action_high=(1.0, 2.0))


def test_the_soft_mask_holds_the_delay_decays_over_the_overlap_and_ignores_the_rest():
    # horizon 8, 6 actions pending, delay 2: c_i = (6 - i) / 5 for i = 2..5
    c = np.array([4, 3, 2, 1]) / 5
    exp = c * np.expm1(c) / math.expm1(1.0)
    np.testing.assert_allclose(prefix_weights(8, 6, 2).numpy(), [1, 1, *exp, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(prefix_weights(8, 6, 2, "linear").numpy(), [1, 1, *c, 0, 0], rtol=1e-6)
    assert prefix_weights(4, 4, 4).tolist() == [1.0] * 4  # everything pending executes: all held
    with pytest.raises(ValueError, match="delay <= pending"):
        prefix_weights(8, 3, 4)
    with pytest.raises(ConfigError, match="rtc_schedule"):
        prefix_weights(8, 6, 2, "cosine")


def test_the_guidance_weight_follows_pi_gdm_and_is_capped_by_beta():
    assert guidance_weight(0.5, 5.0) == pytest.approx(2.0)  # (0.25 + 0.25) / 0.25
    assert guidance_weight(0.2, 50.0) == pytest.approx((0.64 + 0.04) / 0.16)
    assert guidance_weight(0.05, 5.0) == 5.0 and guidance_weight(1.0, 5.0) == 5.0 and guidance_weight(0.0, 3.0) == 3.0


def test_the_guided_velocity_is_the_closed_form_on_a_linear_field():
    """v(x) = A x + b: x0_hat = x - t v, its Jacobian I - t A, so the correction is
    (I - t A)^T (W * (Y - x0_hat)), exactly."""
    torch.manual_seed(0)
    a, b = torch.randn(6, 6, dtype=torch.float64) * 0.3, torch.randn(6, dtype=torch.float64)
    x, target = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64)
    weights = torch.rand(3, 6, dtype=torch.float64)
    t, beta = 0.7, 5.0
    got = guided_velocity(lambda point: point @ a.T + b, x, t, target, weights, beta)
    velocity = x @ a.T + b
    residual = weights * (target - (x - t * velocity))
    correction = residual @ (torch.eye(6, dtype=torch.float64) - t * a)
    torch.testing.assert_close(got, velocity - guidance_weight(t, beta) * correction)


def flow(**settings) -> FlowPolicy:
    torch.manual_seed(0)
    config = dict(horizon=8, chunk_size=8, denoise_steps=10, sampler="ode", hidden=[32, 32], critic_hidden=[8])
    return FlowPolicy(FlowPolicyConfig(**{**config, **settings}), SPEC)


def chunk(policy, observation, prefix=None, seed=3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        return policy.act(observation, deterministic=True, generator=generator, prefix=prefix).actions


def test_a_guided_chunk_agrees_with_the_pending_actions_where_they_execute():
    policy = flow()
    observation = Observation(state=torch.randn(5, 4))
    pending = torch.stack([torch.linspace(-0.8, 0.8, 6), torch.linspace(1.5, -1.5, 6)], -1).expand(5, 6, 2)
    plain = chunk(policy, observation)
    guided = chunk(policy, observation, ChunkPrefix(actions=pending, delay=3))
    held_plain = (plain[:, :3] - pending[:, :3]).abs().max()
    held_guided = (guided[:, :3] - pending[:, :3]).abs().max()
    assert held_plain > 0.5 and held_guided < held_plain / 5, (held_plain, held_guided)
    # beyond the pending actions there is nothing to agree with: the chunk is left as sampled
    torch.testing.assert_close(guided[:, 6:], plain[:, 6:], atol=0.05, rtol=0)
    # without guidance (beta 0) the guided sampler is the plain ODE
    unguided = chunk(flow(rtc_beta=0.0), observation, ChunkPrefix(actions=pending, delay=3))
    torch.testing.assert_close(unguided, plain, atol=1e-6, rtol=0)


def test_rows_of_one_batch_are_guided_each_by_its_own_pending_actions_and_delay():
    policy = flow()
    observation = Observation(state=torch.randn(2, 4))
    pending = torch.tensor([[[0.5, 1.0], [0.4, 0.8], [0.3, 0.6]], [[-0.5, -1.0], [-0.6, -1.2], [-0.6, -1.2]]])
    prefix = ChunkPrefix(actions=pending, delay=np.array([3, 1]), pending=np.array([3, 2]))
    _, weights = policy._prefix_guide(prefix, 2)
    per_action = weights.view(2, 8, 2)[:, :, 0]
    torch.testing.assert_close(per_action[0], prefix_weights(8, 3, 3))
    torch.testing.assert_close(per_action[1], prefix_weights(8, 2, 1))  # its padded third action unweighted
    guided = chunk(policy, observation, prefix)
    assert (guided[0, :3] - pending[0]).abs().max() < 0.1 and (guided[1, :1] - pending[1, :1]).abs().max() < 0.1


def test_prefixes_the_sampler_cannot_honour_are_refused():
    observation = Observation(state=torch.randn(2, 4))
    pending = ChunkPrefix(actions=torch.zeros(2, 4, 2), delay=1)
    with pytest.raises(ValueError, match="deterministic"):
        flow(sampler="flow_sde").act(observation, deterministic=False, prefix=pending)
    with pytest.raises(ValueError, match=r"pending actions must be \(batch=2, P >= 1, action_dim=2\)"):
        chunk(flow(), observation, ChunkPrefix(actions=torch.zeros(2, 4, 3), delay=1))
    with pytest.raises(ValueError, match="delay <= pending"):
        chunk(flow(), observation, ChunkPrefix(actions=torch.zeros(2, 2, 2), delay=3))
    with pytest.raises(ValueError, match="at least one pending action"):
        chunk(flow(), observation, ChunkPrefix(actions=torch.zeros(2, 0, 2), delay=0))
    with pytest.raises(ConfigError, match="rtc_beta"):
        flow(rtc_beta=-1.0)


def test_pi0_samples_guided_chunks_through_its_action_expert():
    """The guidance differentiates through pi0's expert, over its padded action width."""
    torch.manual_seed(0)
    spec = EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    settings = dict(max_state_dim=4, max_action_dim=4, horizon=4, chunk_size=4, denoise_steps=10, sampler="ode")
    policy = tiny_pi0(spec, **settings)
    observation = Observation(state=torch.randn(2, 3))
    pending = torch.tensor([[0.6, -0.6], [0.5, -0.5], [0.4, -0.4]]).expand(2, 3, 2)
    plain = chunk(policy, observation)
    guided = chunk(policy, observation, ChunkPrefix(actions=pending, delay=2))
    assert (guided[:, :2] - pending[:, :2]).abs().max() < (plain[:, :2] - pending[:, :2]).abs().max() / 3
