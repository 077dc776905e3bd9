"""Real-time chunking: the soft mask and guidance weight written out, the guided velocity and
the guided noise against their closed forms on a linear field (and against each other), and
flow and diffusion policies (the state flow, the tiny pi0, DDIM and DDPM) sampling chunks that
agree with the actions still pending."""

import math

import numpy as np
import pytest
import torch

from embodied.core.errors import ConfigError
from embodied.core.types import ChunkPrefix, EnvSpec, Observation
from embodied.policies.denoising.diffusion import DiffusionPolicy, DiffusionPolicyConfig
from embodied.policies.denoising.flow import FlowPolicy, FlowPolicyConfig
from embodied.policies.denoising.realtime import guidance_weight, guided_noise, guided_velocity, prefix_weights
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


def linear_problem(seed: int) -> tuple[torch.Tensor, ...]:
    """A field's matrix (6, 6) and bias (6,), points x (3, 6), a target and its weights, float64."""
    torch.manual_seed(seed)
    matrix, bias = torch.randn(6, 6, dtype=torch.float64) * 0.3, torch.randn(6, dtype=torch.float64)
    x, target = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64)
    return matrix, bias, x, target, torch.rand(3, 6, dtype=torch.float64)


def test_the_guided_velocity_is_the_closed_form_on_a_linear_field():
    """v(x) = A x + b: x0_hat = x - t v, its Jacobian I - t A, so the correction is
    (I - t A)^T (W * (Y - x0_hat)), exactly."""
    a, b, x, target, weights = linear_problem(0)
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


@pytest.mark.parametrize("family", ["flow", "ddim", "ddpm"])
def test_a_guided_chunk_agrees_with_the_pending_actions_where_they_execute(family):
    make = flow if family == "flow" else lambda **settings: diffusion(scheduler=family, **settings)
    policy = make()
    observation = Observation(state=torch.randn(5, 4))
    pending = torch.stack([torch.linspace(-0.8, 0.8, 6), torch.linspace(1.5, -1.5, 6)], -1).expand(5, 6, 2)
    plain = chunk(policy, observation)
    guided = chunk(policy, observation, ChunkPrefix(actions=pending, delay=3))
    held_plain = (plain[:, :3] - pending[:, :3]).abs().max()
    held_guided = (guided[:, :3] - pending[:, :3]).abs().max()
    assert held_plain > 0.5 and held_guided < held_plain / 5, (held_plain, held_guided)
    if family == "flow":
        # beyond the pending actions there is nothing to agree with: the chunk is left as sampled
        # (the untrained diffusion denoisers couple a chunk's actions more: their guided chains
        # move those too, through later steps' predictions)
        torch.testing.assert_close(guided[:, 6:], plain[:, 6:], atol=0.05, rtol=0)
    # without guidance (beta 0) the guided sampler is the plain one
    unguided = chunk(make(rtc_beta=0.0), observation, ChunkPrefix(actions=pending, delay=3))
    torch.testing.assert_close(unguided, plain, atol=1e-6, rtol=0)
    assert policy.accepts_prefix(True) and not (family != "flow" and policy.accepts_prefix(False))


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


def test_the_guided_noise_is_the_closed_form_on_a_linear_field():
    """eps(x) = A x + b: x0_hat = (x - sqrt(1 - abar) eps) / sqrt(abar), its Jacobian
    (I - sqrt(1 - abar) A) / sqrt(abar); eps' = eps - sqrt(abar) w(s) (W * (Y - x0_hat)) J."""
    a_matrix, bias, x, target, weights = linear_problem(1)
    abar, beta = 0.6, 5.0
    got = guided_noise(lambda point: point @ a_matrix.T + bias, x, abar, target, weights, beta)
    a, b = math.sqrt(abar), math.sqrt(1 - abar)
    noise = x @ a_matrix.T + bias
    jacobian = (torch.eye(6, dtype=torch.float64) - b * a_matrix) / a
    correction = (weights * (target - (x - b * noise) / a)) @ jacobian
    torch.testing.assert_close(got, noise - a * guidance_weight(b / (a + b), beta) * correction)


@pytest.mark.parametrize("abar", [0.05, 0.5, 0.97])
def test_the_guided_noise_moves_the_clean_estimate_as_the_flow_guidance_does_at_the_same_noise_level(abar):
    """The diffusion point x is the flow's point y = x / (a + b) at s = b / (a + b), whose velocity
    is (y - x0_hat) / s: both guidances give the same corrected estimate of the clean chunk."""
    a_matrix, bias, x, target, weights = linear_problem(2)
    a, b = math.sqrt(abar), math.sqrt(1 - abar)
    s = b / (a + b)

    def noise_at(point):
        return torch.tanh(point @ a_matrix.T + bias)  # not linear: the Jacobians must agree too

    def velocity_at(point):
        return (point - (point * (a + b) - b * noise_at(point * (a + b))) / a) / s

    guided_eps = guided_noise(noise_at, x, abar, target, weights, 50.0)
    y = x / (a + b)
    guided_v = guided_velocity(velocity_at, y, s, target, weights, 50.0)
    torch.testing.assert_close((x - b * guided_eps) / a, y - s * guided_v)


def diffusion(**settings) -> DiffusionPolicy:
    torch.manual_seed(0)
    config = dict(horizon=8, chunk_size=8, scheduler="ddim", ddim_eta=0.0, hidden=[32, 32], critic_hidden=[8])
    return DiffusionPolicy(DiffusionPolicyConfig(**{**config, **settings}), SPEC)


def test_a_diffusion_policy_refuses_prefixes_it_cannot_honour():
    policy, observation = diffusion(), Observation(state=torch.randn(2, 4))
    with pytest.raises(ValueError, match="deterministic"):
        policy.act(observation, deterministic=False, prefix=ChunkPrefix(actions=torch.zeros(2, 4, 2), delay=1))
    with pytest.raises(ConfigError, match="rtc_schedule"):
        diffusion(rtc_schedule="cosine")
