"""SAC/RLPD, Cal-QL and HL-Gauss: the math against float64 references, the sampling rules,
offline data from recorded LeRobotDatasets, and resume (WSRL's hand-over: test_wsrl.py)."""

import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from embodied.algos import replay
from embodied.algos.critics import HLGauss
from embodied.algos.replay import ReplayBuffer, Transitions, discounted_returns, from_dataset
from embodied.algos.sac_config import SACConfig
from embodied.algos.sac_rlpd import SACRLPD
from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.policies.gaussian.squashed_gaussian import SquashedGaussianConfig, SquashedGaussianPolicy, squash_log_prob
from embodied.robots.recording import DatasetRecorder, RecordingConfig
from embodied.runs.checkpoint import load_checkpoint, save_checkpoint
from embodied.runtime.rollout import Rollout
from embodied.sim.gymnasium_env import GymnasiumConfig, make_gymnasium
from tests.cli import embodied

SPEC = EnvSpec(state_dim=3, action_dim=2, action_low=(-2.0, -1.0), action_high=(2.0, 1.0), control_hz=10.0)
SMALL = dict(batch_size=32, num_critics=4, critic_subset=2, critic_hidden=[32, 32], utd_ratio=2)


def small_policy(spec=SPEC):
    torch.manual_seed(0)
    return SquashedGaussianPolicy(SquashedGaussianConfig(hidden=[32, 32]), spec)


def transitions(count, reward=0.0, intervened=False, mc_return=-math.inf, seed=0, action_dim=2):
    g = torch.Generator().manual_seed(seed)
    return Transitions(
        state=torch.randn(count, 3, generator=g),
        action=torch.rand(count, action_dim, generator=g) * 2 - 1,
        reward=torch.full((count,), reward),
        next_state=torch.randn(count, 3, generator=g),
        discount=torch.ones(count),
        intervened=torch.full((count,), intervened),
        mc_return=torch.full((count,), mc_return),
    )


def constant_critics(critics, values):
    """Each member outputs its constant, whatever the input."""
    last = critics.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor(values, dtype=torch.float32).view(-1, 1, 1))


def test_squashed_log_prob_is_the_change_of_variables_through_tanh():
    u = torch.linspace(-6, 6, 25, dtype=torch.float64).view(-1, 1)
    mean, log_std = torch.tensor([[0.3]], dtype=torch.float64), torch.tensor([[-0.7]], dtype=torch.float64)
    reference = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform()]
    )
    expected = reference.log_prob(torch.tanh(u).clamp(-1 + 1e-15, 1 - 1e-15)).sum(-1)
    interior = u.abs().view(-1) < 4  # float64 tanh saturates beyond; the stable form does not
    torch.testing.assert_close(squash_log_prob(u, mean, log_std)[interior], expected[interior], rtol=1e-9, atol=1e-9)
    assert torch.isfinite(squash_log_prob(u, mean, log_std)).all()


def test_actions_map_onto_the_env_bounds_and_back():
    policy = small_policy()
    squashed = torch.tensor([[-1.0, 1.0], [0.0, 0.5]])
    env = policy.to_env(squashed)
    torch.testing.assert_close(env, torch.tensor([[-2.0, 1.0], [0.0, 0.5]]))
    torch.testing.assert_close(policy.to_squashed(env), squashed)


def test_hl_gauss_targets_are_the_normal_mass_on_each_bin():
    hl = HLGauss(-10.0, 10.0, bins=21, sigma_ratio=0.75)
    targets = torch.tensor([-3.3, 0.0, 9.9])
    edges = np.linspace(-10, 10, 22)
    sigma = 0.75 * 20 / 21
    for target, probs in zip(targets.tolist(), hl.target_probs(targets)):
        cdf = norm.cdf(edges, loc=target, scale=sigma)
        expected = np.diff(cdf) / (cdf[-1] - cdf[0])
        np.testing.assert_allclose(probs.numpy(), expected, atol=1e-6)
    logits = torch.log(hl.target_probs(targets) + 1e-12)  # a critic that predicts the target distribution
    torch.testing.assert_close(hl.value(logits)[:2], targets[:2], atol=1e-3, rtol=0)  # inside the support
    assert hl.loss(logits, targets).min() >= 0
    worse = hl.loss(logits.roll(3, dims=-1), targets)
    assert (worse > hl.loss(logits, targets)).all()  # cross-entropy is lowest at the target


def test_the_td_target_takes_the_min_over_a_random_subset_of_target_critics():
    policy = small_policy()
    algo = SACRLPD(SACConfig(**{**SMALL, "critic_subset": 2}, backup_entropy=False, gamma=0.9), policy)
    values = [5.0, 4.0, -1.0, 7.0]
    constant_critics(algo.target_critics, values)
    batch = transitions(6, reward=1.0)
    batch.discount[0] = 0.0  # terminated: no bootstrap
    state = algo.generator.get_state()
    target = algo.td_target(batch)
    algo.generator.set_state(state)
    subset = torch.randperm(4, generator=algo.generator)[:2]
    expected = 1.0 + 0.9 * min(values[i] for i in subset.tolist())
    torch.testing.assert_close(target[1:], torch.full((5,), expected))
    assert target[0] == 1.0
    assert expected != 1.0 + 0.9 * min(values)  # this subset misses the global min: a plain min would fail
    assert len({float(algo.td_target(batch)[1]) for _ in range(20)}) > 1  # a new subset each time


@pytest.mark.parametrize("layer_norm, bins", [(True, 1), (False, 1), (True, 11)])
def test_chosen_members_of_the_ensemble_compute_what_the_whole_ensemble_does_for_them(layer_norm, bins):
    from embodied.algos.critics import CriticEnsemble

    torch.manual_seed(0)
    critics = CriticEnsemble(10, 5, 2, [16, 16], layer_norm=layer_norm, bins=bins)
    for parameter in critics.parameters():  # LayerNorm's ones and zeros would hide a wrong member
        parameter.data.normal_()
    state, action = torch.randn(7, 5), torch.randn(7, 2)
    members = torch.tensor([7, 2, 9])
    chosen = critics(state, action, members)
    assert chosen.shape == (3, 7, bins)
    torch.testing.assert_close(chosen, critics(state, action)[members], atol=1e-6, rtol=0)


def test_the_td_target_subtracts_the_entropy_bonus_of_the_next_action():
    policy = small_policy()
    algo = SACRLPD(SACConfig(**{**SMALL, "critic_subset": 4}, init_temperature=0.5, gamma=0.9), policy)
    constant_critics(algo.target_critics, [2.0, 2.0, 2.0, 2.0])
    batch = transitions(5)
    torch.manual_seed(3)
    target = algo.td_target(batch)
    torch.manual_seed(3)
    _, next_log_prob = policy.sample(batch.next_state)
    torch.testing.assert_close(target, 0.9 * (2.0 - 0.5 * next_log_prob.detach()))


def test_calql_floors_policy_action_values_at_the_monte_carlo_return():
    policy = small_policy()
    algo = SACRLPD(SACConfig(**SMALL, calql_actions=3), policy)
    constant_critics(algo.critics, [1.0] * 4)
    for mc_return, floor in ((4.0, 4.0), (-math.inf, 1.0)):
        batch = transitions(5, mc_return=mc_return)
        q_data = algo.q_values(algo.critics, batch.state, batch.action)
        torch.manual_seed(7)
        penalty = algo.calql_penalty(batch, q_data, offline_rows=5)
        torch.manual_seed(7)
        _, log_prob = policy.sample(batch.state.repeat_interleave(3, dim=0))
        scores = torch.cat(
            [
                torch.full((5, 3), 1.0 + 2 * math.log(2), dtype=torch.float64),
                floor - log_prob.detach().double().view(5, 3),
            ],
            dim=-1,
        )
        expected = 4 * (torch.logsumexp(scores, dim=-1) - 1.0).mean()  # summed over the 4 critics
        torch.testing.assert_close(penalty.double(), expected, rtol=1e-5, atol=1e-5)


def test_the_bc_term_is_the_modes_squared_error_to_the_offline_rows_actions_only():
    policy = small_policy()
    algo = SACRLPD(SACConfig(**SMALL, bc_weight=2.5, init_temperature=0.5), policy)
    constant_critics(algo.critics, [1.0, 2.0, 3.0, 4.0])
    batch = transitions(6)
    start = {k: v.clone() for k, v in policy.state_dict().items()}
    torch.manual_seed(5)
    metrics = algo.actor_step(batch, offline_rows=4)
    policy.load_state_dict(start)  # the step changed the weights: recompute from the ones it started from
    torch.manual_seed(5)
    with torch.no_grad():
        _, log_prob = policy.sample(batch.state)
        mode, _ = policy.sample(batch.state[:4], deterministic=True)
    bc = ((mode - batch.action[:4]).double() ** 2).sum(-1).mean()
    expected = 0.5 * log_prob.double().mean() - 2.5 + 2.5 * bc
    assert metrics["train/bc_loss"] == pytest.approx(float(bc), rel=1e-5)
    assert metrics["train/actor_loss"] == pytest.approx(float(expected), rel=1e-5)
    assert "train/bc_loss" not in algo.actor_step(batch, offline_rows=0)  # an all-online batch: no BC


def test_the_actor_step_differentiates_through_the_critics_without_training_them():
    policy = small_policy()
    algo = SACRLPD(SACConfig(**SMALL, init_temperature=0.5), policy)
    frozen_bias = algo.critics.net[0].bias.requires_grad_(False)  # a parameter frozen before stays frozen
    batch = transitions(8)
    start = {k: v.clone() for k, v in policy.state_dict().items()}
    torch.manual_seed(3)
    algo.actor_step(batch)
    assert all(p.grad is None for p in algo.critics.parameters())
    assert all(p.requires_grad == (p is not frozen_bias) for p in algo.critics.parameters())
    policy.load_state_dict(start)  # the gradient the step took, recomputed from the weights it started from
    torch.manual_seed(3)
    action, log_prob = policy.sample(batch.state)
    loss = (0.5 * log_prob - algo.q_values(algo.critics, batch.state, action).mean(0)).mean()
    expected = torch.autograd.grad(loss, list(policy.parameters()))
    for parameter, gradient in zip(policy.parameters(), expected):
        torch.testing.assert_close(parameter.grad, gradient)


@pytest.mark.slow
def test_the_bc_term_pulls_the_policy_onto_corrections():
    policy = small_policy()
    algo = SACRLPD(SACConfig(**SMALL, bc_weight=10.0, actor_lr=3e-3, init_temperature=1e-3), policy)
    constant_critics(algo.critics, [0.0] * 4)  # no pull from Q: only BC moves the actor
    batch = transitions(32)
    batch.action = torch.tensor([[0.5, -0.5]]).expand(32, 2).clone()

    def error():
        with torch.no_grad():
            return float((policy.sample(batch.state, deterministic=True)[0] - batch.action).pow(2).sum(-1).mean())

    before = error()
    for _ in range(300):
        algo.actor_step(batch, offline_rows=32)
    assert error() < 0.1 * before


def test_batches_are_half_offline_and_interventions_join_the_offline_data():
    algo = SACRLPD(SACConfig(**SMALL), small_policy())
    algo.offline.add(transitions(10, reward=1.0))
    algo.online.add(transitions(50, reward=0.0))
    batch, offline_rows = algo.sample()
    assert offline_rows == 16 and batch.reward[:16].eq(1).all() and batch.reward[16:].eq(0).all()
    algo.offline = ReplayBuffer(10, 3, 2)
    batch, offline_rows = algo.sample()  # nothing offline: all online
    assert offline_rows == 0 and len(batch) == 32


def collect(policy, steps, seed=0):
    env = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), seed, 0)
    rollout = Rollout(env, policy, torch.device("cpu"), seed=seed)
    rollout.start()
    batches = [rollout.collect(1)[0] for _ in range(steps)]
    env.close()
    return batches


def test_an_update_adds_the_batch_and_takes_utd_critic_steps_per_transition():
    spec = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0).spec
    policy = small_policy(spec)
    algo = SACRLPD(SACConfig(**SMALL), policy)
    batches = collect(policy, 3)
    for batch in batches:
        batch.intervened[:] = True  # as if an operator drove these steps
        metrics = algo.update(batch, 0.0)
    assert len(algo.online) == 3 and len(algo.offline) == 3 and algo.critic_steps == 6
    assert metrics["replay/intervened"] == 1.0 and math.isfinite(metrics["train/critic_loss"])
    first = batches[1]
    torch.testing.assert_close(algo.online.data.next_state[0], first.observation.state[0, 0].float())


@pytest.mark.parametrize("actor_every, actor_steps", [(None, 3), (1, 12), (2, 6), (8, 1)])
def test_the_actor_steps_once_per_actor_every_critic_steps(actor_every, actor_steps):
    spec = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0).spec
    policy = small_policy(spec)
    algo = SACRLPD(SACConfig(**{**SMALL, "utd_ratio": 4}, actor_every=actor_every), policy)
    for batch in collect(policy, 3):
        algo.update(batch, 0.0)
    first_parameter = algo.actor_optimizer.state_dict()["state"][0]
    assert algo.critic_steps == 12 and int(first_parameter["step"]) == actor_steps


def record_demos(root, episodes):
    recorder = DatasetRecorder(RecordingConfig(dataset=str(root)), SPEC, 10.0, "reach")
    recorder.open()
    for rewards, success, terminated in episodes:
        for t, reward in enumerate(rewards):
            recorder.add(np.full(3, t, np.float32), {}, np.array([2.0, -1.0]) * (t % 2), None, t == 0, reward)
        recorder.end_episode(success, terminated=terminated)
    recorder.close()


@pytest.mark.slow
def test_recorded_episodes_become_transitions_with_monte_carlo_returns(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    # terminated on success; a failure cut off; a success that ran on to its time limit (ignore_terminations)
    episodes = [([0.0, 0.0, 1.0], True, True), ([0.5, 0.5], False, False), ([0.0, 1.0], True, False)]
    record_demos(tmp_path / "demos", episodes)
    policy = small_policy()
    data = from_dataset(tmp_path / "demos", policy.to_squashed, 0.9, 3, 2)
    # the terminated episode: 3 transitions, the last terminal; the cut-off ones lose their last frame
    assert len(data) == 5
    assert data.discount.tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]
    torch.testing.assert_close(data.mc_return, torch.tensor([0.81, 0.9, 1.0, 0.5 + 0.9 * 0.5, 0.9]))
    torch.testing.assert_close(data.next_state[:, 0], torch.tensor([1.0, 2.0, 2.0, 1.0, 1.0]))
    torch.testing.assert_close(data.action[1], torch.tensor([1.0, -1.0]))  # squashed from the env's bounds
    assert data.intervened.tolist() == [True, False, False, True, True]
    np.testing.assert_allclose(discounted_returns(np.array([1.0, 1.0]), 0.5), [1.5, 1.0])
    # a dataset from before next.terminated: its episodes ended where the task succeeded
    original = replay.read_frames

    def without_terminated(*args, **kwargs):
        frames = original(*args, **kwargs)
        frames.pop("next.terminated")
        return frames

    monkeypatch.setattr(replay, "read_frames", without_terminated)
    older = from_dataset(tmp_path / "demos", policy.to_squashed, 0.9, 3, 2)
    assert older.discount.tolist() == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]


def record_pendulum_demo(root, frames):
    """One successful Pendulum episode of `frames` steps, recorded as the robot client does."""
    spec = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0).spec
    recorder = DatasetRecorder(RecordingConfig(dataset=str(root)), spec, 20.0, "")
    recorder.open()
    for t in range(frames):
        recorder.add(np.array([1.0, 0.0, t / 10], np.float32), {}, np.array([0.5]), None, False, -1.0)
    recorder.end_episode(True, terminated=True)
    recorder.close()
    return spec


def test_resume_restores_critics_optimizers_buffers_and_counters(tmp_path):
    spec = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0).spec
    batches = collect(small_policy(spec), 5, seed=1)
    config = SACConfig(**SMALL, critic_loss="hl_gauss", hl_gauss_bins=11, hl_gauss_low=-20, hl_gauss_high=5)
    first = SACRLPD(config, policy := small_policy(spec))
    first.offline.add(transitions(4, mc_return=1.0, action_dim=1))
    for batch in batches[:3]:
        first.update(batch, 0.0)
    path = save_checkpoint(tmp_path, "iter_000003", policy.state_dict(), {"algo": first.state_dict()}, "")
    weights, state = load_checkpoint(path)
    resumed = SACRLPD(config, resumed_policy := small_policy(spec))
    resumed_policy.load_state_dict(weights)
    resumed.load_state_dict(state["algo"])
    for batch in batches[3:]:
        torch.manual_seed(11)
        a = first.update(batch, 0.0)
        torch.manual_seed(11)
        b = resumed.update(batch, 0.0)
        assert a == b
    for one, two in (
        (first.critics, resumed.critics),
        (first.target_critics, resumed.target_critics),
        (policy, resumed_policy),
    ):
        for (name, x), y in zip(one.state_dict().items(), two.state_dict().values()):
            assert torch.equal(x, y), name
    assert (
        (first.env_steps, first.critic_steps, len(first.online), len(first.offline))
        == (resumed.env_steps, resumed.critic_steps, len(resumed.online), len(resumed.offline))
        == (5, 10, 5, 4)
    )


def test_a_policy_without_a_squashed_distribution_is_refused():
    from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig

    with pytest.raises(ConfigError, match="squashed_gaussian"):
        SACRLPD(SACConfig(**SMALL), MLPGaussianPolicy(MLPPolicyConfig(), SPEC))
    with pytest.raises(ConfigError, match="algo.dataset"):
        SACRLPD(SACConfig(**SMALL, calql_alpha=1.0), small_policy())


TINY_SAC = [
    "env=mujoco_invertedpendulum",
    "env.task=Pendulum-v1",
    "policy=squashed_gaussian",
    "policy.hidden=[32,32]",
    "algo=sac_rlpd",
    "algo.critic_hidden=[32,32]",
    "algo.num_critics=2",
    "algo.batch_size=16",
    "algo.utd_ratio=1",
    "eval_episodes=0",
    "logger.progress_bar=false",
    "runtime.device=cpu",
]


def train_run(run_dir, *args):
    result = embodied("train", *TINY_SAC, f"run_dir={run_dir}", *args, check=False)
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.slow
def test_offline_to_online_training_from_recorded_demos_runs_under_procs_and_resumes(tmp_path, monkeypatch):
    """Demos recorded by the robot client -> Cal-QL pretraining -> online RLPD with the rollout
    in its own process -> resume continues with the saved buffers, not a new pretraining."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    record_pendulum_demo(tmp_path / "demos", 10)
    run_dir = tmp_path / "run"
    first = train_run(
        run_dir,
        f"algo.dataset={tmp_path / 'demos'}",
        "algo.offline_pretrain_steps=3",
        "algo.calql_alpha=1.0",
        "checkpoint_every=4",
        "runtime=procs",
        "runtime.device=cpu",
        "runtime.rollout_device=cpu",
        "total_env_steps=8",
    ).stderr
    assert "pretraining on 10 offline transitions for 3 steps" in first
    resumed = embodied("train", f"resume={run_dir}", "total_env_steps=12", check=False)
    assert resumed.returncode == 0, resumed.stderr
    resumed = resumed.stderr
    assert "pretraining on" not in resumed  # the checkpoint says it is done
    updates = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "train/iteration" in line
    ]
    assert [u["replay/online"] for u in updates] == list(range(1, 13))  # the buffer came back whole
    assert all(u["replay/offline"] == 10 for u in updates)


@pytest.mark.slow
def test_a_scripted_operator_takes_over_in_simulation_and_its_steps_become_offline_data(tmp_path):
    """The expert (a trained run) drives envs where the policy drifts; the rollout executes its
    action and flags the step; RLPD then holds those steps as demonstrations too."""
    from embodied.core.operator import OperatorConfig
    from embodied.runtime.configs import DeviceConfig
    from embodied.runtime.operator import SimOperator
    from embodied.serve import ServeConfig, load_checkpoint_policy

    train_run(tmp_path / "expert", "total_env_steps=2")
    operator = SimOperator(
        OperatorConfig(policy=str(tmp_path / "expert"), threshold=1e-3, patience=2, release=100),
        num_envs=1,
        chunk_size=1,
    )
    env = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0)
    torch.manual_seed(5)
    rollout = Rollout(
        env,
        SquashedGaussianPolicy(SquashedGaussianConfig(hidden=[8]), env.spec),
        torch.device("cpu"),
        operator=operator,
    )
    rollout.start()
    batch, _, _ = rollout.collect(6)
    env.close()
    flags = batch.intervened[:, 0].tolist()
    assert flags == [False, True, True, True, True, True]  # patience 2: the second drifting step takes over
    expert, _, _ = load_checkpoint_policy(
        ServeConfig(checkpoint=str(tmp_path / "expert"), runtime=DeviceConfig(device="cpu"))
    )
    for t in range(1, 6):
        state = batch.observation.state[t].numpy()
        wanted = np.clip(expert(Observation(state=state))[0, 0], -2, 2)
        np.testing.assert_allclose(batch.executed_action[t, 0, 0].numpy(), wanted, atol=1e-5)
    assert not np.allclose(batch.executed_action[0, 0, 0].numpy(), batch.actions[1, 0, 0].numpy())

    run = tmp_path / "run"
    train_run(
        run,
        "total_env_steps=6",
        f"operator.policy={tmp_path / 'expert'}",
        "operator.threshold=1e-3",
        "operator.patience=1",
    )
    updates = [
        json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "train/iteration" in line
    ]
    assert sum(u["replay/intervened"] for u in updates) >= 5 and updates[-1]["replay/offline"] >= 5


def test_on_policy_algorithms_refuse_a_scripted_operator(tmp_path):
    result = embodied(
        "train",
        "env=mujoco_invertedpendulum",
        "env.task=Pendulum-v1",
        "algo=ppo",
        f"operator.policy={tmp_path}",
        f"run_dir={tmp_path / 'run'}",
        check=False,
        timeout=300,
    )
    assert result.returncode != 0 and "off-policy algorithm" in result.stderr


def test_hl_gauss_still_learns_from_targets_outside_its_support():
    hl = HLGauss(-10.0, 10.0, bins=21)
    logits = torch.zeros(2, 21, requires_grad=True)
    loss = hl.loss(logits, torch.tensor([150.0, -130.0])).sum()
    loss.backward()
    assert loss > 0 and logits.grad.abs().sum() > 0
    probs = hl.target_probs(torch.tensor([150.0]))
    assert probs[0, -1] == probs.max()  # all the mass at the nearest edge
