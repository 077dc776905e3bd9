"""Diffusion policy and DPPO: golden math against diffusers' schedulers, per-step
likelihoods, the frozen base of last-k fine-tuning, SFT, and training on real ManiSkill."""

import json

import numpy as np
import pytest
import torch

from embodied.algos.ppo import PPO, PPOConfig
from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.policies.denoising.common import gaussian_log_prob
from embodied.policies.denoising.diffusion import DiffusionPolicy, DiffusionPolicyConfig, denoising_step, make_scheduler
from embodied.runtime.wire import published_weights
from tests.cli import GRPO_ANY_OUTCOME, NO_EVAL, ONE_PPO_ITERATION, QUIET, embodied
from tests.embodied.test_ppo import _batch
from tests.policies.sft import bc_losses

SPEC = EnvSpec(state_dim=4, action_dim=2, action_low=(-1.0, -2.0), action_high=(1.0, 2.0))


def small(**overrides) -> DiffusionPolicyConfig:
    return DiffusionPolicyConfig(
        **{"hidden": [32], "critic_hidden": [16], "denoise_steps": 5, "train_timesteps": 50, **overrides}
    )


@pytest.mark.parametrize("scheduler", ["ddpm", "ddim"])
def test_each_step_is_the_diffusers_scheduler_step(scheduler):
    """Mean + std x noise equals diffusers' own step for the same eps and noise, at every
    inference timestep (min_std = 0: the unfloored transition)."""
    cfg = DiffusionPolicyConfig(scheduler=scheduler, train_timesteps=100, denoise_steps=10, ddim_eta=0.7)
    reference = make_scheduler(cfg)
    abar = reference.alphas_cumprod.double()
    timesteps = [int(t) for t in reference.timesteps]
    generator = torch.Generator().manual_seed(0)
    for i, t in enumerate(timesteps):
        x_t = 1.5 * torch.randn(3, 8, generator=generator, dtype=torch.float64)
        eps = torch.randn(3, 8, generator=generator, dtype=torch.float64)
        abar_next = abar[timesteps[i + 1]] if i + 1 < len(timesteps) else torch.tensor(1.0, dtype=torch.float64)
        mean, std = denoising_step(x_t, eps, abar[t], abar_next, scheduler, 0.7)
        if scheduler == "ddpm":  # diffusers draws the noise itself, from the generator it is given
            expected = reference.step(eps, t, x_t, generator=torch.Generator().manual_seed(5)).prev_sample
            noise = torch.randn(3, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
            got = mean + (std * noise if t > 0 else 0)  # diffusers adds no noise at t = 0
        else:
            noise = torch.randn(3, 8, generator=generator, dtype=torch.float64)
            expected = reference.step(
                eps, t, x_t, eta=0.7, use_clipped_model_output=True, variance_noise=noise
            ).prev_sample
            got = mean + std * noise
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)  # diffusers keeps abar in float32


@pytest.mark.parametrize("scheduler", ["ddpm", "ddim"])
def test_chunk_log_prob_is_the_sum_of_floored_step_gaussians_recomputed_by_recompute(scheduler):
    torch.manual_seed(0)
    policy = DiffusionPolicy(small(scheduler=scheduler, min_std=0.2), SPEC)
    observation = Observation(state=torch.randn(6, 4))
    with torch.no_grad():
        chunk = policy.act(observation, generator=torch.Generator().manual_seed(1))
        recomputed = policy.recompute(observation, chunk)
        state = policy._state(observation)
        chain = chunk.record["chain"]
        expected = []
        for k, t in enumerate(policy.timesteps):
            eps = policy.denoiser(torch.cat([state, _time(policy, t, len(state))], -1), chain[:, k])
            mean, std = denoising_step(
                chain[:, k], eps, policy.abar_step[k], policy.abar_next[k], scheduler, policy.cfg.ddim_eta
            )
            expected.append(gaussian_log_prob(chain[:, k + 1], mean, std.clamp(min=0.2).expand_as(mean)))
    expected = torch.stack(expected, 1)
    torch.testing.assert_close(chunk.record["term_log_prob"], expected)
    torch.testing.assert_close(chunk.log_prob, expected.sum(-1))
    torch.testing.assert_close(recomputed.term_log_prob, expected)
    torch.testing.assert_close(recomputed.log_prob, chunk.log_prob)
    assert chunk.actions.shape == (6, 1, 2)
    assert (chunk.actions[..., 1].abs() <= 2.0).all()


def _time(policy, t, batch):
    from embodied.policies.denoising.common import time_embedding

    return time_embedding(torch.full((batch,), t / policy.cfg.train_timesteps), policy.frequencies)


def test_one_denoising_step_is_the_clipped_x0_estimate_with_the_floor_as_std():
    """K = 1 (DDPM): the only step goes to abar = 1, whose variance is 0, so the step's
    mean is x0_hat and its std is min_std."""
    torch.manual_seed(0)
    policy = DiffusionPolicy(small(denoise_steps=1, min_std=0.3), SPEC)
    observation = Observation(state=torch.randn(5, 4))
    with torch.no_grad():
        chunk = policy.act(observation, generator=torch.Generator().manual_seed(0))
        x_t = chunk.record["chain"][:, 0]
        state = policy._state(observation)
        eps = policy.denoiser(torch.cat([state, _time(policy, policy.timesteps[0], 5)], -1), x_t)
        abar = policy.abar_step[0]
        x0_hat = ((x_t - (1 - abar).sqrt() * eps) / abar.sqrt()).clamp(-1, 1)
        expected = gaussian_log_prob(chunk.record["chain"][:, 1], x0_hat, torch.full_like(x0_hat, 0.3))
    torch.testing.assert_close(chunk.log_prob, expected)
    assert chunk.record["term_log_prob"].shape == (5, 1)


def test_mean_reduction_averages_over_steps_and_dimensions():
    observation = Observation(state=torch.randn(3, 4))
    results = {}
    for reduction in ("sum", "mean"):
        torch.manual_seed(0)
        policy = DiffusionPolicy(small(log_prob_reduction=reduction), SPEC)
        with torch.no_grad():
            results[reduction] = policy.act(observation, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(results["mean"].log_prob, results["sum"].log_prob / (5 * policy.dim))
    torch.testing.assert_close(
        results["mean"].record["term_log_prob"], results["sum"].record["term_log_prob"] / policy.dim
    )


def test_last_k_fine_tuning_keeps_the_early_steps_on_the_weights_rl_started_from():
    torch.manual_seed(0)
    policy = DiffusionPolicy(small(finetune_steps=2, denoiser="transformer", width=16, heads=2), SPEC)
    # SFT weights (no pinned base) become both the trained denoiser and the frozen base.
    sft = DiffusionPolicy(small(finetune_steps=2, denoiser="transformer", width=16, heads=2), SPEC)
    policy.load_state_dict(sft.state_dict())
    for name, parameter in sft.denoiser.named_parameters():
        torch.testing.assert_close(getattr(policy, "base__" + name.replace(".", "__")), parameter)

    observation = Observation(state=torch.randn(8, 4))
    with torch.no_grad():
        chunk = policy.act(observation, generator=torch.Generator().manual_seed(0))
    assert chunk.record["term_log_prob"].shape == (8, 2)  # only the last two steps are terms
    recomputed = policy.recompute(observation, chunk)
    assert bool(policy.base_pinned)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
    (-recomputed.log_prob.mean()).backward()
    optimizer.step()

    state, x = policy._state(observation), chunk.record["chain"][:, 0]
    with torch.no_grad():
        early_before, _ = sft._transition(state, x, 0)
        early_after, _ = policy._transition(state, x, 0)
        last_before, _ = sft._transition(state, chunk.record["chain"][:, 4], 4)
        last_after, _ = policy._transition(state, chunk.record["chain"][:, 4], 4)
    torch.testing.assert_close(early_after, early_before)  # the frozen base
    assert not torch.allclose(last_after, last_before)  # the trained steps moved

    # A resumed run (and every weight update) brings the pinned base along.
    assert any(key.startswith("base__") for key in published_weights(policy))
    resumed = DiffusionPolicy(small(finetune_steps=2, denoiser="transformer", width=16, heads=2), SPEC)
    resumed.load_state_dict(policy.state_dict())
    with torch.no_grad():
        a = policy.act(observation, generator=torch.Generator().manual_seed(3)).actions
        b = resumed.act(observation, generator=torch.Generator().manual_seed(3)).actions
    torch.testing.assert_close(a, b)

    # Weights of a policy trained on all steps load into one that trains the last k, and back.
    everything = DiffusionPolicy(small(denoiser="transformer", width=16, heads=2), SPEC)
    everything.load_state_dict(policy.state_dict())
    policy.load_state_dict(everything.state_dict())


@pytest.mark.slow
def test_sft_epsilon_loss_decreases_on_a_tiny_dataset():
    torch.manual_seed(0)
    policy = DiffusionPolicy(small(hidden=[64, 64], horizon=2), SPEC)
    state = torch.randn(32, 4)
    actions = (torch.tanh(state[:, :2]) * torch.tensor([1.0, 2.0])).unsqueeze(1).expand(-1, 2, -1)  # (32, C=2, A=2)
    observation = Observation(state=state)
    policy.update_normalization(observation)
    losses = bc_losses(policy, observation, actions, steps=300, lr=3e-3)
    assert np.mean(losses[-30:]) < 0.5 * np.mean(losses[:30])


def test_bad_settings_are_config_errors():
    for overrides in (
        {"scheduler": "euler"},
        {"denoiser": "unet"},
        {"finetune_steps": 6},
        {"min_std": 0.0},
        {"denoise_steps": 60},
        {"chunk_size": 5},
        {"log_prob_reduction": "max"},
    ):
        with pytest.raises(ConfigError, match="policy."):
            DiffusionPolicy(small(**overrides), SPEC)
    image_spec = EnvSpec(
        state_dim=4, action_dim=2, action_low=(-1.0,) * 2, action_high=(1.0,) * 2, image_shapes={"base": (64, 64, 3)}
    )
    with pytest.raises(ConfigError, match="state"):
        DiffusionPolicy(small(), image_spec)


def test_dppo_update_with_one_ratio_per_step():
    """ratio=term: the first minibatch sees every step's ratio at one; the decoupled
    (off-policy) form of an on-policy batch is the same update."""
    results = []
    for off_policy in (False, True):
        torch.manual_seed(0)
        policy = DiffusionPolicy(small(finetune_steps=3), SPEC)
        batch = _batch(policy)
        cfg = PPOConfig(update_epochs=1, num_minibatches=1, ratio="term", denoise_discount=0.9)
        metrics = PPO(cfg, policy).update(batch, 0.0, off_policy=off_policy)
        results.append((metrics, [p.detach().clone() for p in policy.denoiser.parameters()]))
    (plain, plain_weights), (decoupled, decoupled_weights) = results
    assert abs(plain["loss/approx_kl"]) < 1e-6 and plain["loss/clipfrac"] == 0.0
    assert decoupled["loss/behaviour_weight"] == 1.0
    for a, b in zip(plain_weights, decoupled_weights):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "algo",
    [
        [
            "algo.ratio=term",
            "algo.denoise_discount=0.9",
            *ONE_PPO_ITERATION,
            "env.num_envs=2",
        ],
        [
            *GRPO_ANY_OUTCOME,
            "algo.num_minibatches=2",
            "env.num_envs=4",
            "total_env_steps=200",
        ],
    ],
    ids=["dppo", "grpo"],
)
@pytest.mark.slow
def test_one_rl_iteration_end_to_end_on_maniskill_then_resume(tmp_path, algo):
    run_dir = tmp_path / "run"
    common = [
        "train",
        "policy=diffusion",
        "policy.finetune_steps=2",
        "policy.denoise_steps=4",
        "policy.hidden=[64]",
        *NO_EVAL,
        *QUIET,
    ]
    embodied(*common, *algo, f"run_dir={run_dir}")
    updates = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "loss/policy_loss" in line
    ]
    assert updates and np.isfinite(updates[0]["loss/policy_loss"])
    steps = updates[-1]["env_steps"]
    result = embodied("train", f"resume={run_dir}", f"total_env_steps={2 * steps}", check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    updates = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "loss/policy_loss" in line
    ]
    assert updates[-1]["env_steps"] == 2 * steps
