"""DSRL: the latent actor steers a frozen flow through its initial noise. The flow's ODE maps
the chosen noise to the chunk, only the latent actor learns, the SAC losses in noise space
match a float64 recomputation, an operator's correction becomes the noise that reproduces it,
and a run on real ManiSkill trains under runtime=procs and resumes."""

import copy
import json

import pytest
import torch

from embodied.algos.dsrl import DSRL, DSRLConfig
from embodied.algos.replay import Transitions
from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.policies.denoising.common import from_unit
from embodied.policies.denoising.flow import FlowPolicy, FlowPolicyConfig
from embodied.runtime.rollout import Rollout
from embodied.sim.gymnasium_env import GymnasiumConfig, make_gymnasium
from tests.embodied.test_cli import embodied
from tests.policies.tiny import TINY_PI0

SPEC = EnvSpec(state_dim=3, action_dim=2, action_low=(-2.0, -1.0), action_high=(2.0, 1.0), control_hz=10.0)
SMALL = dict(batch_size=8, num_critics=3, critic_subset=2, critic_hidden=[16], utd_ratio=2, replay_capacity=64)


def steered_flow(spec=SPEC, chunk_size=3, horizon=3, seed=0):
    """A flow with a latent actor, its velocity field scaled up so the ODE moves the noise."""
    torch.manual_seed(seed)
    cfg = FlowPolicyConfig(
        sampler="flow_sde",
        chunk_size=chunk_size,
        horizon=horizon,
        denoise_steps=4,
        hidden=[16],
        latent_actor=True,
        latent_hidden=[16],
        latent_bound=1.5,
    )
    policy = FlowPolicy(cfg, spec)
    with torch.no_grad():
        policy.velocity[-1].weight.mul_(20.0)
        policy.velocity[-1].bias.normal_(0, 0.2)
    return policy


def ode(policy, context, noise):
    """The flow's deterministic Euler steps, written out: x <- x - dt v(x, t)."""
    x = noise
    for step in range(policy.cfg.denoise_steps):
        t = torch.full((len(x),), policy.times[step])
        x = x - policy._dt(step) * policy._field(context, x, t, noise=False)[0]
    return x


def test_the_chunk_for_a_noise_is_the_flows_ode_from_that_noise():
    env = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0)
    policy = steered_flow(env.spec, chunk_size=2)
    observation = env.reset().to_torch()
    env.close()
    chunk = policy.act(observation, generator=torch.Generator().manual_seed(1))
    latent = chunk.record["latent"]
    assert latent.shape == (1, 3) and latent.abs().max() <= 1
    context = policy.latent_context(observation)
    x0 = ode(policy, context, 1.5 * latent).view(1, 3, 1)
    torch.testing.assert_close(chunk.actions, from_unit(x0[:, :2], policy.low, policy.high))
    again = policy.act(observation, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(again.record["latent"], latent)  # the latent actor samples


def test_running_the_ode_backwards_finds_the_noise_of_a_chunk():
    policy = steered_flow()
    context = torch.randn(16, 3)
    squashed = torch.rand(16, policy.dim) * 0.6 - 0.3
    x0 = policy.denoise(context, 1.5 * squashed)
    actions = from_unit(x0.view(16, 3, 2), policy.low, policy.high)
    assert x0.abs().max() < 1  # within the env's bounds, where actions are not clipped
    assert (x0 - 1.5 * squashed).abs().max() > 0.1  # the ODE is not the identity here
    torch.testing.assert_close(policy.invert(context, actions), squashed, atol=1e-4, rtol=0)


def pendulum_batches(policy, steps, seed=0):
    env = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), seed, 0)
    try:
        rollout = Rollout(env, policy, torch.device("cpu"), seed=seed)
        rollout.start()
        return [rollout.collect(1)[0] for _ in range(steps)]
    finally:
        env.close()


def test_only_the_latent_actor_learns_and_the_flow_and_its_statistics_stay():
    spec = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0).spec
    policy = steered_flow(spec, chunk_size=3, horizon=3)
    algo = DSRL(DSRLConfig(**SMALL), policy)
    before = {name: value.clone() for name, value in policy.state_dict().items()}
    for batch in pendulum_batches(policy, 4):
        metrics = algo.update(batch, 0.0)
        policy.update_normalization(batch.flat_observation(slice(None)))  # the learner's call: a no-op
    assert algo.critic_steps == 8 and len(algo.online) == 4 and "train/actor_loss" in metrics
    changed = {name for name, value in policy.state_dict().items() if not torch.equal(value, before[name])}
    assert changed and all(name.startswith("latent_actor.") for name in changed)
    assert algo.online.data.action.shape[1] == policy.dim  # the action is the noise


def test_dsrl_critic_targets_and_loss_in_noise_space_match_a_float64_recomputation():
    policy = steered_flow()
    algo = DSRL(DSRLConfig(**SMALL, gamma=0.95, init_temperature=0.2), policy)
    g = torch.Generator().manual_seed(3)
    batch = Transitions(
        state=torch.randn(8, 3, generator=g),
        action=torch.rand(8, policy.dim, generator=g) * 2 - 1,
        reward=torch.randn(8, generator=g),
        next_state=torch.randn(8, 3, generator=g),
        discount=torch.tensor([1.0, 1, 0, 1, 1, 0, 1, 1]),
        intervened=torch.zeros(8, dtype=torch.bool),
        mc_return=torch.full((8,), -torch.inf),
    )
    subset_generator = copy.deepcopy(algo.generator)
    critics, targets = copy.deepcopy(algo.critics).double(), copy.deepcopy(algo.target_critics).double()
    actor = copy.deepcopy(policy.latent_actor.net).double()
    torch.manual_seed(5)
    metrics = algo.critic_step(batch, offline_rows=0)
    with torch.no_grad():
        mean, raw = actor(batch.next_state.double()).chunk(2, -1)
        log_std = -5 + 3.5 * (torch.tanh(raw) + 1)
        torch.manual_seed(5)
        u = mean + log_std.exp() * torch.randn(mean.shape).double()
        normal = torch.distributions.Normal(mean, log_std.exp())
        log_prob = (normal.log_prob(u) - torch.log(1 - torch.tanh(u) ** 2)).sum(-1)
        subset = torch.randperm(3, generator=subset_generator)[:2]
        next_q = targets(batch.next_state.double(), torch.tanh(u)).squeeze(-1)[subset].min(0).values
        target = batch.reward.double() + 0.95 * batch.discount.double() * (next_q - 0.2 * log_prob)
        q = critics(batch.state.double(), batch.action.double()).squeeze(-1)
        loss = (q - target).pow(2).mean(1).sum() / 3
    assert metrics["train/target_mean"] == pytest.approx(float(target.mean()), rel=1e-5, abs=1e-5)
    assert metrics["train/critic_loss"] == pytest.approx(float(loss), rel=1e-5)


def test_an_operators_correction_becomes_the_noise_whose_chunk_it_is():
    spec = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0).spec
    policy = steered_flow(spec, chunk_size=3, horizon=3)
    algo = DSRL(DSRLConfig(**SMALL), policy)
    batch = pendulum_batches(policy, 1)[0]
    corrected = torch.tensor([[[0.5], [-0.25], [1.0]]])
    batch.executed_action[0] = corrected
    batch.intervened[:] = True
    transitions = algo.transitions(batch)
    assert not torch.equal(transitions.action, batch.record["latent"][0])
    chunk = policy.denoise(transitions.state, 1.5 * transitions.action).view(1, 3, 1)
    torch.testing.assert_close(from_unit(chunk, policy.low, policy.high), corrected, atol=1e-4, rtol=0)
    algo.learn(transitions)
    assert len(algo.offline) == 1  # RLPD keeps corrections as demonstrations


def test_dsrl_refuses_what_it_cannot_steer():
    from embodied.policies.gaussian.mlp import MLPGaussianPolicy, MLPPolicyConfig

    with pytest.raises(ConfigError, match="policy.latent_actor=true"):
        DSRL(DSRLConfig(**SMALL), FlowPolicy(FlowPolicyConfig(hidden=[8]), SPEC))
    with pytest.raises(ConfigError, match="policy.latent_actor=true"):
        DSRL(DSRLConfig(**SMALL), MLPGaussianPolicy(MLPPolicyConfig(), SPEC))
    with pytest.raises(ConfigError, match="algo.dataset"):
        DSRL(DSRLConfig(**SMALL, dataset="data/demos"), steered_flow())
    env = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0)
    policy = steered_flow(env.spec)
    observation = env.reset().to_torch()
    env.close()
    with pytest.raises(ConfigError, match="algo=dsrl"):
        policy.recompute(observation, policy.act(observation))


def test_the_vlm_expert_has_no_latent_actor_yet():
    from embodied.policies.vla.vlm_expert import VLMExpertConfig, VLMExpertPolicy
    from tests.policies.test_vlm_expert import SPEC as VLM_SPEC

    with pytest.raises(ConfigError, match="DSRL runs on policy=flow, flow_vla, pi0, pi05, smolvla and diffusion"):
        VLMExpertPolicy(VLMExpertConfig(critic_hidden=[16], latent_actor=True), VLM_SPEC)


STEERED_ON_FRAMES = {
    "flow_vla": ["policy=flow_vla", "policy.hidden=[16]"],
    "pi0": [*TINY_PI0[1:], "policy=pi0"],
    "pi05": [*TINY_PI0[1:], "policy=pi05"],
    # ManiSkill's sizes, so no padded action dimensions
    "smolvla": ["policy=smolvla", "policy.max_state_dim=64", "policy.max_action_dim=8", "policy.horizon=2"],
}


@pytest.mark.parametrize("model", list(STEERED_ON_FRAMES))
@pytest.mark.slow
def test_dsrl_steers_a_vla_through_its_noise_from_camera_frames(model):
    """The latent actor reads the built-in VLA's context, or a VLM's prefix pooled (and pi0's
    state); the chunk is the model's own ODE from the chosen noise, reproduced step by step;
    the rollout keeps the next frames and the critics see the next contexts; only the latent
    actor learns; an operator's chunk comes back from the noise found for it."""
    from embodied.build import build_env, build_policy
    from embodied.config import TrainConfig, to_schema
    from embodied.core.compose import compose

    steer = ["policy.latent_actor=true", "policy.latent_hidden=[16]", "policy.denoise_steps=2"]
    env_overrides = ["env.obs_mode=rgb", "env.num_envs=2", "env.num_workers=0", "env.image_size=32"]
    config = to_schema(TrainConfig, compose("train", [*STEERED_ON_FRAMES[model], *steer, *env_overrides, "algo=dsrl"]))
    env = build_env(config.env, seed=0)
    try:
        torch.manual_seed(0)
        policy = build_policy(config.policy, env.spec, torch.device("cpu"))
        algo = DSRL(DSRLConfig(**SMALL), policy)
        rollout = Rollout(env, policy, torch.device("cpu"))
        rollout.start()
        batch, _, _ = rollout.collect(2)
    finally:
        env.close()
    assert set(batch.next_images) == set(env.spec.image_shapes)
    observation = batch.flat_observation(torch.arange(2))
    context = policy._state(observation)
    latent = batch.record["latent"][0]
    torch.testing.assert_close(
        batch.actions[0], policy._actions(ode(policy, context, policy.cfg.latent_bound * latent)), atol=1e-5, rtol=0
    )
    transitions = algo.transitions(batch)
    assert transitions.state.shape == (4, policy.latent_width) and transitions.action.shape == (4, policy.dim)
    torch.testing.assert_close(transitions.next_state[:2], transitions.state[2:], atol=1e-5, rtol=0)
    before = {name: value.clone() for name, value in policy.state_dict().items()}
    algo.learn(transitions)
    changed = {name for name, value in policy.state_dict().items() if not torch.equal(value, before[name])}
    assert changed and all(name.startswith("latent_actor.") for name in changed)
    # an operator's chunk: the noise found for it gives it back through the model's ODE
    wanted = policy._actions(ode(policy, context, 0.9 * torch.tanh(torch.randn(2, policy.dim))))
    found = policy.latent_for_actions(observation, wanted)
    reproduced = policy._actions(ode(policy, context, policy.cfg.latent_bound * found))
    torch.testing.assert_close(reproduced, wanted, atol=1e-4, rtol=0)


@pytest.mark.parametrize("scheduler, eta", [("ddim", 0.0), ("ddpm", 1.0)])
def test_a_diffusion_policy_is_steered_through_its_noise_too(scheduler, eta):
    """Its deterministic sampler (DDIM with eta 0; DDPM's means) from the chosen noise gives
    the chunk, the sampler run backwards finds the noise of a chunk, and DSRL trains only the
    latent actor."""
    from embodied.policies.denoising.diffusion import DiffusionPolicy, DiffusionPolicyConfig

    env = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0)
    spec, observation = env.spec, env.reset().to_torch()
    env.close()
    torch.manual_seed(0)
    cfg = DiffusionPolicyConfig(
        scheduler=scheduler,
        ddim_eta=eta,
        horizon=3,
        chunk_size=3,
        denoise_steps=5,
        hidden=[16],
        latent_actor=True,
        latent_hidden=[16],
    )
    policy = DiffusionPolicy(cfg, spec)
    # A little SFT first: an untrained denoiser's x0 estimates all hit the clip, where no noise
    # can be told apart from another (DSRL steers a trained policy)
    optimizer, g = torch.optim.Adam(policy.denoiser.parameters(), lr=3e-3), torch.Generator().manual_seed(0)
    for _ in range(300):
        states = torch.randn(64, 3, generator=g)
        loss = policy.bc_loss(Observation(state=states), torch.tanh(states[:, :1]).unsqueeze(1).expand(64, 3, 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    chunk = policy.act(observation, generator=torch.Generator().manual_seed(1))
    context = policy.latent_context(observation)
    x = 1.5 * chunk.record["latent"]
    for step in range(cfg.denoise_steps):
        x = policy._transition(context, x, step)[0]
    torch.testing.assert_close(chunk.actions, policy._actions(x))
    squashed = torch.tensor([[0.5, -0.5, 0.3]])
    wanted = policy._actions(policy.denoise(context, 1.5 * squashed))
    found = policy.latent_for_actions(observation, wanted)
    torch.testing.assert_close(found, squashed, atol=1e-4, rtol=0)
    torch.testing.assert_close(policy._actions(policy.denoise(context, 1.5 * found)), wanted, atol=1e-4, rtol=0)
    algo = DSRL(DSRLConfig(**SMALL), policy)
    before = {name: value.clone() for name, value in policy.state_dict().items()}
    for batch in pendulum_batches(policy, 3):
        algo.update(batch, 0.0)
    changed = {name for name, value in policy.state_dict().items() if not torch.equal(value, before[name])}
    assert changed and all(name.startswith("latent_actor.") for name in changed)


DSRL_RUN = [
    "env=maniskill_pushcube",
    "env.num_envs=2",
    "env.num_workers=0",
    "policy=flow",
    "policy.hidden=[16]",
    "policy.horizon=4",
    "policy.chunk_size=2",
    "policy.latent_actor=true",
    "policy.latent_hidden=[16]",
    "algo=dsrl",
    "algo.critic_hidden=[16]",
    "algo.num_critics=2",
    "algo.batch_size=8",
    "algo.utd_ratio=1",
    "algo.replay_capacity=100",
    "eval_episodes=0",
    "checkpoint_every=2",
    "logger.progress_bar=false",
    "runtime.device=cpu",
]


@pytest.mark.slow
def test_dsrl_steers_a_flow_on_maniskill_under_procs_and_resumes(tmp_path):
    """An SFT-less flow stands in for the pretrained one: what is checked is the plumbing (the
    noise recorded by the rollout process, sent, learned from, checkpointed and resumed)."""
    run_dir = tmp_path / "run"
    embodied(
        "train", *DSRL_RUN, "runtime=procs", "runtime.rollout_device=cpu", "total_env_steps=16", f"run_dir={run_dir}"
    )
    embodied("train", f"resume={run_dir}", "total_env_steps=24")
    updates = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "train/iteration" in line
    ]
    assert [u["replay/online"] for u in updates] == [2, 4, 6, 8, 10, 12]  # one transition per chunk and env
    assert all(u["train/critic_loss"] == u["train/critic_loss"] for u in updates)


@pytest.mark.slow
def test_dsrl_from_a_trained_flow_keeps_its_weights_bit_for_bit_with_an_operator_correcting(tmp_path):
    """init= a flow trained without a latent actor: the latent actor starts fresh, every
    weight of the flow in DSRL's checkpoints is the trained one, and a scripted operator's
    steps reach the offline data."""
    from safetensors.torch import load_file

    from embodied.runs.checkpoint import resolve_checkpoint

    pendulum = ["env=mujoco_invertedpendulum", "env.task=Pendulum-v1", "policy=flow", "policy.hidden=[16]"]
    common = ["eval_episodes=0", "logger.progress_bar=false", "runtime.device=cpu"]
    embodied(
        "train",
        *pendulum,
        *common,
        "algo=ppo",
        "algo.rollout_steps=8",
        "algo.num_minibatches=2",
        "total_env_steps=16",
        f"run_dir={tmp_path / 'flow'}",
    )
    steered = embodied(
        "train",
        *pendulum,
        *common,
        "policy.latent_actor=true",
        "policy.latent_hidden=[16]",
        "algo=dsrl",
        "algo.critic_hidden=[16]",
        "algo.num_critics=2",
        "algo.batch_size=8",
        f"init={tmp_path / 'flow'}",
        f"operator.policy={tmp_path / 'flow'}",
        "operator.threshold=1e-3",
        "operator.patience=1",
        "total_env_steps=6",
        f"run_dir={tmp_path / 'dsrl'}",
    )
    assert "latent_actor" in steered.stderr and "start fresh" in steered.stderr
    flow = load_file(str(resolve_checkpoint(tmp_path / "flow") / "weights.safetensors"))
    dsrl = load_file(str(resolve_checkpoint(tmp_path / "dsrl") / "weights.safetensors"))
    assert {k for k in dsrl if not k.startswith("latent_actor.")} == set(flow)
    for name, value in flow.items():
        assert torch.equal(dsrl[name], value), name
    updates = [
        json.loads(line)
        for line in (tmp_path / "dsrl" / "metrics.jsonl").read_text().splitlines()
        if "train/iteration" in line
    ]
    assert sum(u["replay/intervened"] for u in updates) >= 3 and updates[-1]["replay/offline"] >= 3
