import numpy as np
import pytest
import torch

from embodied.algos.buffers import TrajectoryBuilder
from embodied.algos.policy_gradient import ratio_log_probs, term_advantages
from embodied.algos.ppo import PPO, PPOConfig, ppo_loss
from embodied.core.types import EnvSpec, Observation, StepResult
from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig


def reference_terms(new_lp, old_lp, adv, new_v, old_v, ret, ent, clip, vf_coef, ent_coef):
    """The PPO objective in numpy, term by term."""
    ratio = np.exp(new_lp - old_lp)
    adv = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
    policy = np.mean(np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - clip, 1 + clip)))
    clipped_v = old_v + np.clip(new_v - old_v, -clip, clip)
    value = 0.5 * np.mean(np.maximum((new_v - ret) ** 2, (clipped_v - ret) ** 2))
    entropy = ent.mean()
    kl = np.mean((ratio - 1) - (new_lp - old_lp))
    clipfrac = np.mean(np.abs(ratio - 1) > clip)
    return policy, value, entropy, kl, clipfrac, policy - ent_coef * entropy + vf_coef * value


def test_ppo_loss_terms_match_a_reference_computation():
    rng = np.random.default_rng(0)
    n = 64
    old_lp = rng.normal(size=n)
    new_lp = old_lp + rng.normal(scale=0.3, size=n)
    adv, ret = rng.normal(size=n), rng.normal(size=n)
    old_v = rng.normal(size=n)
    new_v = old_v + rng.normal(scale=0.5, size=n)
    ent = rng.uniform(1, 2, size=n)
    cfg = PPOConfig(clip_coef=0.2, vf_coef=0.5, ent_coef=0.01)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    loss = ppo_loss(t(new_lp), t(old_lp), t(adv), t(new_v), t(old_v), t(ret), t(ent), cfg)
    expected = reference_terms(new_lp, old_lp, adv, new_v, old_v, ret, ent, 0.2, 0.5, 0.01)
    got = [loss.policy_loss, loss.value_loss, loss.entropy, loss.approx_kl, loss.clipfrac, loss.total]
    np.testing.assert_allclose([float(x) for x in got], expected, rtol=1e-10)


def test_term_ratios_clip_each_denoising_step_with_its_discounted_advantage():
    """DPPO: one ratio per term j of P, advantage A_i gamma^(P-1-j), mean over all terms."""
    rng = np.random.default_rng(1)
    n, terms, gamma, clip = 16, 3, 0.8, 0.2
    old_lp = rng.normal(size=(n, terms))
    new_lp = old_lp + rng.normal(scale=0.3, size=(n, terms))
    adv = rng.normal(size=n)
    weighted = adv[:, None] * gamma ** np.array([2.0, 1.0, 0.0])[None]
    ratio = np.exp(new_lp - old_lp)
    expected = np.mean(np.maximum(-weighted * ratio, -weighted * np.clip(ratio, 1 - clip, 1 + clip)))
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    advantages = term_advantages(t(adv), terms, gamma)
    np.testing.assert_allclose(advantages.numpy(), weighted, rtol=1e-12)
    z = torch.zeros(n, dtype=torch.float64)
    loss = ppo_loss(t(new_lp), t(old_lp), advantages, z, z, z, z, PPOConfig(normalize_advantages=False, clip_coef=clip))
    np.testing.assert_allclose(float(loss.policy_loss), expected, rtol=1e-10)
    np.testing.assert_allclose(float(loss.approx_kl), np.mean((ratio - 1) - (new_lp - old_lp)), rtol=1e-10)
    # ratio=chunk, or a policy without terms: the chunk's log-prob is the one term
    chunk = torch.arange(3.0)
    assert ratio_log_probs(chunk, torch.ones(3, 2), "chunk").shape == (3, 1)
    assert ratio_log_probs(chunk, None, "term").shape == (3, 1)
    assert ratio_log_probs(chunk, torch.ones(3, 2), "term").shape == (3, 2)


def test_unclipped_value_loss_is_half_the_squared_error():
    cfg = PPOConfig(clip_value_loss=False)
    z = torch.zeros(4)
    loss = ppo_loss(z, z, torch.ones(4), torch.tensor([1.0, 2, 3, 4]), z, z, z, cfg)
    assert float(loss.value_loss) == 0.5 * np.mean([1, 4, 9, 16])
    assert float(loss.approx_kl) == 0.0 and float(loss.clipfrac) == 0.0


def _batch(policy, steps=8, envs=4, seed=0, rewards=None):
    """A rollout of `policy` on random states; rewards random, or `rewards` (envs,) each step."""
    generator = torch.Generator().manual_seed(seed)
    builder = TrajectoryBuilder()
    for _ in range(steps):
        observation = Observation(state=torch.randn(envs, policy.spec.state_dim, generator=generator).numpy())
        with torch.no_grad():
            chunk = policy.act(observation.to_torch())
        reward = torch.randn(envs, generator=generator).numpy().astype(np.float32)
        reward = reward if rewards is None else np.asarray(rewards, np.float32)
        result = StepResult(
            observation=observation,
            reward=reward,
            terminated=np.zeros(envs, bool),
            truncated=np.zeros(envs, bool),
            success=np.zeros(envs, bool),
            executed_steps=np.ones(envs, np.int64),
            executed_action=chunk.actions.numpy(),
            final_observation=observation,
        )
        builder.add(observation, chunk, result, torch.zeros(envs))
    return builder.build(torch.zeros(envs))


def test_first_minibatch_of_an_update_sees_ratio_one_and_logs_diagnostics():
    spec = EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    torch.manual_seed(0)
    policy = MLPGaussianPolicy(MLPPolicyConfig(chunk_size=2), spec)
    batch = _batch(policy)
    rows = torch.arange(8)
    recomputed = policy.recompute(batch.flat_observation(rows), batch.chunk(rows))
    torch.testing.assert_close(recomputed.log_prob, batch.chunk(rows).log_prob)
    metrics = PPO(PPOConfig(update_epochs=2, num_minibatches=4), policy).update(batch, progress=0.0)
    for key in ("loss/policy_loss", "loss/value_loss", "loss/approx_kl", "loss/clipfrac", "loss/explained_variance"):
        assert np.isfinite(metrics[key]), key
    assert metrics["train/lr"] == 3e-4


def test_an_update_favours_rewarded_actions_over_punished_ones():
    """The learning signal itself: if the loss stopped depending on the advantages (or their
    sign flipped), this fails while every loss-term test could still pass. (The Gaussian's
    spread may grow for all rows at once; what the advantages decide is the difference.)"""
    spec = EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    torch.manual_seed(0)
    policy = MLPGaussianPolicy(MLPPolicyConfig(), spec)
    batch = _batch(policy, steps=16, envs=4, rewards=[1.0, 1.0, -1.0, -1.0])  # envs 0, 1 rewarded
    rows = torch.arange(16 * 4)
    before = policy.recompute(batch.flat_observation(rows), batch.chunk(rows)).log_prob.detach()
    PPO(PPOConfig(update_epochs=10, num_minibatches=2, ent_coef=0.0, lr=1e-3), policy).update(batch, progress=0.0)
    after = policy.recompute(batch.flat_observation(rows), batch.chunk(rows)).log_prob.detach()
    change = (after - before).view(16, 4)  # time-major rows: step x env
    assert change[:, :2].mean() - change[:, 2:].mean() > 0.03, change.mean(0)


def test_out_of_range_hyperparameters_are_config_errors():
    import pytest

    from embodied.core.errors import ConfigError

    spec = EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    policy = MLPGaussianPolicy(MLPPolicyConfig(), spec)
    with pytest.raises(ConfigError, match="algo.gamma must be in"):
        PPO(PPOConfig(gamma=1.5), policy)
    with pytest.raises(ConfigError, match="algo.ratio must be one of"):
        PPO(PPOConfig(ratio="token"), policy)
    with pytest.raises(ConfigError, match="algo.denoise_discount must be in"):
        PPO(PPOConfig(denoise_discount=0.0), policy)
    with pytest.raises(ConfigError, match="algo.value_lr must be > 0"):
        PPO(PPOConfig(value_lr=0.0), policy)
    with pytest.raises(ConfigError, match="algo.num_minibatches=64"):
        PPO(PPOConfig(num_minibatches=64), policy).update(_batch(policy), progress=0.0)


def test_decoupled_loss_reweights_by_proximal_over_behaviour_policy():
    rng = np.random.default_rng(1)
    n = 32
    behaviour, proximal = rng.normal(size=n), rng.normal(size=n)
    new_lp = proximal + rng.normal(scale=0.3, size=n)
    adv, ret, old_v, ent = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n), rng.uniform(1, 2, size=n)
    cfg = PPOConfig(clip_coef=0.2)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    weight = np.minimum(np.exp(proximal - behaviour), cfg.behaviour_weight_cap)
    loss = ppo_loss(t(new_lp), t(proximal), t(adv), t(old_v), t(old_v), t(ret), t(ent), cfg, t(weight))
    # the ratio is clipped around the proximal policy; the weight corrects for the behaviour one
    ratio = np.exp(new_lp - proximal)
    norm_adv = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
    expected = np.mean(weight * np.maximum(-norm_adv * ratio, -norm_adv * np.clip(ratio, 0.8, 1.2)))
    np.testing.assert_allclose(float(loss.policy_loss), expected, rtol=1e-10)


def test_off_policy_update_of_an_on_policy_batch_equals_the_plain_update():
    spec = EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    results = []
    for off_policy in (False, True):
        torch.manual_seed(0)
        policy = MLPGaussianPolicy(MLPPolicyConfig(chunk_size=2), spec)
        batch = _batch(policy)
        metrics = PPO(PPOConfig(update_epochs=2, num_minibatches=4), policy).update(batch, 0.0, off_policy=off_policy)
        results.append((metrics, [p.detach().clone() for p in policy.parameters()]))
    (plain, plain_weights), (decoupled, decoupled_weights) = results
    assert decoupled["loss/behaviour_weight"] == 1.0  # proximal == behaviour: every weight is one
    for a, b in zip(plain_weights, decoupled_weights):
        torch.testing.assert_close(a, b)


def test_critic_warmup_trains_only_the_value_function():
    spec = EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    torch.manual_seed(0)
    policy = MLPGaussianPolicy(MLPPolicyConfig(), spec)
    batch = _batch(policy)
    ppo = PPO(PPOConfig(update_epochs=2, num_minibatches=4, critic_warmup_iterations=1), policy)
    actor = [p.detach().clone() for p in policy.actor.parameters()] + [policy.log_std.detach().clone()]
    critic = [p.detach().clone() for p in policy.critic.parameters()]
    first = ppo.update(batch, 0.0)
    assert first["train/critic_warmup"] == 1.0
    for before, after in zip(actor, [*policy.actor.parameters(), policy.log_std]):
        torch.testing.assert_close(before, after)
    assert any(not torch.equal(b, a) for b, a in zip(critic, policy.critic.parameters()))
    assert ppo.update(batch, 0.0)["train/critic_warmup"] == 0.0
    assert not torch.equal(actor[-1], policy.log_std)  # after warm-up the policy moves too


def test_value_lr_steps_the_value_function_at_its_own_annealed_rate():
    spec = EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    torch.manual_seed(0)
    policy = MLPGaussianPolicy(MLPPolicyConfig(), spec)
    batch = _batch(policy)
    ppo = PPO(PPOConfig(update_epochs=1, num_minibatches=1, lr=1e-4, value_lr=1e-2), policy)
    actor = [p.detach().clone() for p in policy.actor.parameters()]
    critic = [p.detach().clone() for p in policy.critic.parameters()]
    metrics = ppo.update(batch, 0.5)  # half-way: both rates annealed to half

    def largest_step(before, module):
        return max(float((b - a).abs().max()) for b, a in zip(before, module.parameters()))

    # Adam's first step moves each parameter by its learning rate (the gradient's sign)
    assert largest_step(actor, policy.actor) == pytest.approx(0.5e-4, rel=1e-3)
    assert largest_step(critic, policy.critic) == pytest.approx(0.5e-2, rel=1e-3)
    assert metrics["train/lr"] == pytest.approx(0.5e-4) and metrics["train/value_lr"] == pytest.approx(0.5e-2)
    assert metrics["loss/value_grad_norm"] > 0  # the value function's gradient is clipped on its own
    restored = PPO(PPOConfig(lr=1e-4, value_lr=1e-2), policy)
    restored.load_state_dict(ppo.state_dict())  # a checkpoint keeps the two groups
    assert [g.get("value", False) for g in restored.optimizer.param_groups] == [False, True]


def test_dual_clip_caps_negative_advantage_losses_and_huber_value_loss():
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    adv, ratio = np.array([-1.0, -1.0, 1.0]), np.array([5.0, 1.1, 5.0])
    new_lp, old_lp = np.log(ratio), np.zeros(3)
    zeros = np.zeros(3)
    cfg = PPOConfig(clip_coef=0.2, normalize_advantages=False, dual_clip=3.0, clip_value_loss=False)
    loss = ppo_loss(t(new_lp), t(old_lp), t(adv), t(zeros), t(zeros), t(zeros), t(zeros), cfg)
    # sample 0: -A * r = 5 is capped at 3; sample 1 unaffected (1.1); sample 2 positive: clipped at 1.2
    assert float(loss.policy_loss) == pytest.approx((3.0 + 1.1 - 1.2) / 3)
    huber = PPOConfig(value_loss="huber", huber_delta=1.0, clip_value_loss=False)
    value = ppo_loss(t(zeros), t(zeros), t(zeros), t([0.0, 0.5, 4.0]), t(zeros), t(zeros), t(zeros), huber)
    assert float(value.value_loss) == pytest.approx((0.0 + 0.125 + 3.5) / 3)
