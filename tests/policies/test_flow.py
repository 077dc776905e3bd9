"""Flow-matching policy: golden math for the samplers' log-likelihoods, and training."""

import math

import numpy as np
import pytest
import torch

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.policies.denoising.flow import FlowPolicy, FlowPolicyConfig, gaussian_log_prob, sde_step
from tests.cli import GRPO_ANY_OUTCOME, NO_EVAL, QUIET, embodied
from tests.policies.sft import bc_losses

SPEC = EnvSpec(state_dim=4, action_dim=2, action_low=(-1.0, -2.0), action_high=(1.0, 2.0))


def reference_sde_log_prob(x_t, v, t, dt, a, x_next):
    """Flow-SDE transition in float64 numpy, written out from the equations."""
    sigma = a * math.sqrt(t / (1 - t))
    x0_hat, x1_hat = x_t - t * v, x_t + (1 - t) * v
    mean = (1 - (t - dt)) * x0_hat + ((t - dt) - sigma**2 * dt / (2 * t)) * x1_hat
    std = math.sqrt(dt) * sigma
    return np.sum(-0.5 * ((x_next - mean) / std) ** 2 - math.log(std) - 0.5 * math.log(2 * math.pi))


def test_flow_sde_step_log_prob_matches_a_float64_reference():
    rng = np.random.default_rng(0)
    x_t, v, x_next = rng.normal(size=6), rng.normal(size=6), rng.normal(size=6)
    t, dt, a = 0.75, 0.25, 0.5
    sigma = torch.tensor(a * math.sqrt(t / (1 - t)), dtype=torch.float64)
    mean, std = sde_step(torch.tensor(x_t), torch.tensor(v), torch.tensor(t, dtype=torch.float64), dt, sigma)
    got = gaussian_log_prob(torch.tensor(x_next), mean, std.expand(6))
    assert float(got) == pytest.approx(reference_sde_log_prob(x_t, v, t, dt, a, x_next), rel=1e-12)


def test_noise_level_zero_reduces_the_sde_step_to_the_ode_step():
    x_t, v = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    mean, std = sde_step(x_t, v, torch.tensor(0.6, dtype=torch.float64), 0.2, torch.tensor(0.0, dtype=torch.float64))
    torch.testing.assert_close(mean, x_t - 0.2 * v)
    assert float(std) == 0.0


@pytest.mark.parametrize("sampler,steps", [("flow_sde", 4), ("flow_sde", 2), ("flow_noise", 4), ("flow_noise", 1)])
def test_sampled_log_prob_equals_the_recomputation_from_the_recorded_chain(sampler, steps):
    torch.manual_seed(0)
    policy = FlowPolicy(
        FlowPolicyConfig(sampler=sampler, denoise_steps=steps, chunk_size=2, horizon=3, hidden=[32, 32]), SPEC
    )
    observation = Observation(state=torch.randn(6, 4))
    chunk = policy.act(observation, generator=torch.Generator().manual_seed(1))
    assert chunk.record["chain"].shape == (6, steps + 1, 6) and chunk.actions.shape == (6, 2, 2)
    recomputed = policy.recompute(observation, chunk)
    torch.testing.assert_close(recomputed.log_prob, chunk.log_prob)
    assert torch.isfinite(chunk.log_prob).all()
    low, high = torch.tensor(SPEC.action_low), torch.tensor(SPEC.action_high)
    assert ((chunk.actions >= low) & (chunk.actions <= high)).all()


def test_flow_noise_log_prob_has_k_plus_one_terms():
    torch.manual_seed(0)
    cfg = FlowPolicyConfig(sampler="flow_noise", denoise_steps=3, hidden=[16], noise_std_min=0.1, noise_std_max=0.1)
    policy = FlowPolicy(cfg, SPEC)
    observation = Observation(state=torch.randn(2, 4))
    chunk = policy.act(observation, generator=torch.Generator().manual_seed(0))
    chain, state = chunk.record["chain"], policy._state(observation)
    start = gaussian_log_prob(chain[:, 0], torch.zeros_like(chain[:, 0]), torch.ones_like(chain[:, 0]))
    times = torch.linspace(1, 0, 4)
    steps = []
    for k in range(3):
        t = torch.full((2,), float(times[k]))
        velocity = policy.velocity(policy._inputs(state, chain[:, k], t))
        steps.append(
            gaussian_log_prob(
                chain[:, k + 1],
                chain[:, k] - float(times[k] - times[k + 1]) * velocity,
                torch.full_like(chain[:, k], 0.1),
            )
        )
    torch.testing.assert_close(chunk.log_prob, start + sum(steps))
    # each denoising step is one term (ReinFlow-style ratios); the parameter-free start is none
    torch.testing.assert_close(chunk.record["term_log_prob"], torch.stack(steps, 1))
    torch.testing.assert_close(policy.recompute(observation, chunk).term_log_prob, torch.stack(steps, 1))


def test_single_step_or_noiseless_flow_sde_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match=">= 2 for flow_sde"):
        FlowPolicy(FlowPolicyConfig(sampler="flow_sde", denoise_steps=1), SPEC)
    with pytest.raises(ConfigError, match="noise_level must be > 0"):
        FlowPolicy(FlowPolicyConfig(sampler="flow_sde", noise_level=0.0), SPEC)


def test_deterministic_act_follows_the_ode():
    torch.manual_seed(0)
    policy = FlowPolicy(FlowPolicyConfig(sampler="flow_sde", hidden=[16]), SPEC)
    observation = Observation(state=torch.randn(3, 4))
    a = policy.act(observation, deterministic=True, generator=torch.Generator().manual_seed(0))
    b = policy.act(observation, deterministic=True, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a.actions, b.actions)
    chain = a.record["chain"]
    state = policy._state(observation)
    t = torch.full((3,), 1.0)
    torch.testing.assert_close(chain[:, 1], chain[:, 0] - 0.25 * policy.velocity(policy._inputs(state, chain[:, 0], t)))


def test_flow_matching_sft_loss_falls_on_a_tiny_dataset():
    torch.manual_seed(0)
    policy = FlowPolicy(FlowPolicyConfig(sampler="ode", hidden=[64, 64], horizon=2, chunk_size=1), SPEC)
    observation = Observation(state=torch.randn(16, 4))
    actions = torch.tanh(observation.state[:, :2])[:, None].repeat(1, 2, 1) * torch.tensor([1.0, 2.0])
    losses = bc_losses(policy, observation, actions, steps=300, lr=1e-3)
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20])


def test_mean_reduction_divides_the_chunk_log_prob_by_its_terms():
    observation = Observation(state=torch.randn(3, 4))
    results = {}
    for reduction in ("sum", "mean"):
        torch.manual_seed(0)
        policy = FlowPolicy(
            FlowPolicyConfig(sampler="flow_noise", denoise_steps=3, hidden=[16], log_prob_reduction=reduction), SPEC
        )
        chunk = policy.act(observation, generator=torch.Generator().manual_seed(0))
        results[reduction] = (chunk.log_prob, policy.recompute(observation, chunk).entropy)
    torch.testing.assert_close(results["mean"][0], results["sum"][0] / (4 * policy.dim))
    torch.testing.assert_close(results["mean"][1], results["sum"][1] / (4 * policy.dim))  # entropy on the same scale


@pytest.mark.slow
def test_one_grpo_iteration_end_to_end_on_maniskill(tmp_path):
    import json

    run_dir = tmp_path / "run"
    result = embodied(
        "train",
        "policy=flow",
        "policy.sampler=flow_noise",
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
    assert update["grpo/informative_groups"] == 2 and np.isfinite(update["loss/policy_loss"])
