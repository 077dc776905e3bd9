"""WSRL's hand-over from offline pretraining to online learning: the frozen policy's warm-up,
what is restored at the switch (exactly what pretraining learned), the demos kept for the
actor's BC term alone, the temperature restarted, and the critics' own warm-up."""

import copy
import math

import pytest
import torch

from embodied.algos.sac_config import SACConfig
from embodied.algos.sac_rlpd import SACRLPD
from embodied.core.errors import ConfigError
from embodied.runs.checkpoint import load_checkpoint, save_checkpoint
from embodied.sim.gymnasium_env import GymnasiumConfig, make_gymnasium
from tests.embodied.test_sac_rlpd import SMALL, collect, record_pendulum_demo, small_policy


@pytest.mark.slow
def test_wsrl_pretrains_warms_up_with_the_frozen_policy_then_drops_offline_data(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    spec = record_pendulum_demo(tmp_path / "demos", 12)
    policy = small_policy(spec)
    algo = SACRLPD(
        SACConfig(
            **SMALL,
            dataset=str(tmp_path / "demos"),
            offline_pretrain_steps=5,
            calql_alpha=1.0,
            warmup_steps=2,
            retain_offline=False,
        ),
        policy,
    )
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    metrics = algo.before_training()
    assert "pretrain/calql_penalty" in metrics and algo.critic_steps == 5
    pretrained = {k: v.clone() for k, v in policy.state_dict().items()}
    assert any(not torch.equal(before[k], pretrained[k]) for k in before)
    assert algo.before_training() == {}  # once per run
    batches = collect(policy, 3)
    for batch in batches[:2]:
        assert algo.update(batch, 0.0)["train/warming_up"] == 1.0
    assert all(torch.equal(pretrained[k], v) for k, v in policy.state_dict().items())  # frozen while warming up
    assert len(algo.offline) == 12
    algo.update(batches[2], 0.0)
    assert len(algo.offline) == 0 and algo.critic_steps == 5 + 2  # online from now on, offline data gone


def learner_state(algo):
    """Everything a SAC/RLPD learner has learned, as tensors: the policy, the critics and
    their targets, the temperature and the three optimizers' moments."""
    state = algo.state_dict()
    tensors = {f"policy.{k}": v for k, v in algo.policy.state_dict().items()}
    tensors.update({f"critics.{k}": v for k, v in state["critics"].items()})
    tensors.update({f"target_critics.{k}": v for k, v in state["target_critics"].items()})
    tensors["log_temperature"] = state["log_temperature"]
    for name in ("actor_optimizer", "critic_optimizer", "temperature_optimizer"):
        for index, moments in state[name]["state"].items():
            tensors.update({f"{name}.{index}.{k}": v for k, v in moments.items()})
    return {k: v.detach().clone() for k, v in tensors.items()}


def greedy_returns(policy, seed=5):
    """The policy's deterministic returns on three fixed Pendulum episodes."""
    from embodied.eval.episodes import run_episodes

    env = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), seed, 1)
    try:
        episodes, _ = run_episodes(env, policy, 3, seed, progress=False)
    finally:
        env.close()
    return [episode.episode_return for episode in episodes]


@pytest.mark.slow
def test_wsrl_hands_over_exactly_what_pretraining_learned(tmp_path, monkeypatch, caplog):
    """WSRL's hand-over, the step where its published collapse would come from a bug: through
    the warm-up nothing learned moves (policy, critics, targets, temperature, optimizer
    moments), so the frozen policy scores exactly what the pretrained one scored; a run
    checkpointed and resumed at the switch takes the same first online update as one that
    was not; and that update learns from online data only, at the temperature pretraining
    left."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    spec = record_pendulum_demo(tmp_path / "demos", 12)
    config = SACConfig(
        **SMALL,
        dataset=str(tmp_path / "demos"),
        offline_pretrain_steps=6,
        calql_alpha=1.0,
        warmup_steps=4,
        init_temperature=0.3,
        retain_offline=False,
    )
    algo = SACRLPD(config, policy := small_policy(spec))
    with caplog.at_level("INFO", logger="embodied.algos.sac_rlpd"):
        algo.before_training()
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pretraining step")]
    assert [line.split(":")[0] for line in progress] == [f"pretraining step {i}/6" for i in range(1, 6)]
    assert all(
        f"{key}=" in progress[-1] for key in ("q_mean", "target_mean", "calql_penalty", "entropy", "temperature")
    )
    pretrained, pretrained_returns = learner_state(algo), greedy_returns(policy)
    assert len(pretrained_returns) == 3
    batches = collect(policy, 5, seed=2)
    for batch in batches[:4]:
        assert algo.update(batch, 0.0)["train/warming_up"] == 1.0
    after_warmup = learner_state(algo)
    assert after_warmup.keys() == pretrained.keys()
    assert [k for k in pretrained if not torch.equal(pretrained[k], after_warmup[k])] == []
    assert greedy_returns(policy) == pretrained_returns  # zero online updates: the pretrained score

    path = save_checkpoint(tmp_path / "ckpt", "warm", policy.state_dict(), {"algo": algo.state_dict()}, "")
    weights, state = load_checkpoint(path)
    resumed = SACRLPD(config, resumed_policy := small_policy(spec))
    resumed_policy.load_state_dict(weights)
    resumed.load_state_dict(state["algo"])
    restored = learner_state(resumed)
    assert [k for k in pretrained if not torch.equal(pretrained[k], restored[k])] == []
    assert (resumed.pretrained, resumed.online_started, resumed.env_steps) == (True, False, 4)

    temperature = algo.temperature.item()
    torch.manual_seed(3)
    first = algo.update(batches[4], 0.0)
    torch.manual_seed(3)
    assert resumed.update(batches[4], 0.0) == first  # the same first online update, resumed or not
    assert (len(algo.offline), len(algo.online)) == (0, 5)  # online data only from here
    assert first["train/temperature"] == pytest.approx(temperature, rel=1e-2)  # one small step from it


def test_online_bc_keeps_the_demos_for_the_actor_alone_after_the_hand_over(tmp_path, monkeypatch):
    """Without online_bc the BC term goes with the offline data at WSRL's hand-over; with it
    the actor keeps regressing onto the demos while the critics' batches are online only."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    spec = record_pendulum_demo(tmp_path / "demos", 12)
    common = dict(**SMALL, dataset=str(tmp_path / "demos"), warmup_steps=2, retain_offline=False, bc_weight=1.0)
    batches = collect(small_policy(spec), 4)
    runs = {}
    for online_bc in (False, True):
        algo = SACRLPD(SACConfig(**common, online_bc=online_bc), small_policy(spec))
        for batch in batches[:2]:
            algo.update(batch, 0.0)
        runs[online_bc] = (algo, algo.update(batches[2], 0.0))
    (plain, plain_metrics), (kept, kept_metrics) = runs[False], runs[True]
    assert len(plain.offline) == len(kept.offline) == 0  # the critics' batches are online in both
    assert "train/bc_loss" not in plain_metrics and plain.bc_demos is None
    assert kept_metrics["train/bc_loss"] > 0 and len(kept.bc_demos) == 12
    sample = kept.bc_batch()
    assert len(sample) == 16 and torch.allclose(sample.action, torch.full((16, 1), 0.5 / 2.0))  # squashed
    resumed = SACRLPD(SACConfig(**common, online_bc=True), resumed_policy := small_policy(spec))
    resumed_policy.load_state_dict(kept.policy.state_dict())
    resumed.load_state_dict(copy.deepcopy(kept.state_dict()))  # as a checkpoint would: shares no tensor
    torch.manual_seed(5)
    a = kept.update(batches[3], 0.0)
    torch.manual_seed(5)
    b = resumed.update(batches[3], 0.0)
    assert a == b and len(resumed.bc_demos) == 12  # a resumed run keeps the BC demos and their sampling


@pytest.mark.parametrize("overrides", [dict(online_bc=True), dict(online_bc=True, retain_offline=False)])
def test_online_bc_without_its_preconditions_is_refused(overrides):
    with pytest.raises(ConfigError, match="online_bc"):
        SACRLPD(SACConfig(**SMALL, **overrides), small_policy())


def test_online_temperature_restarts_the_temperature_once_at_the_hand_over():
    spec = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0).spec
    config = SACConfig(**SMALL, warmup_steps=2, init_temperature=1.0, online_temperature=0.01)
    algo = SACRLPD(config, policy := small_policy(spec))
    batches = collect(policy, 4)
    for batch in batches[:2]:
        algo.update(batch, 0.0)
    assert algo.temperature.item() == pytest.approx(1.0)  # warming up: nothing learns
    algo.update(batches[2], 0.0)
    # the hand-over, then one temperature step (Adam's first moves log-temperature by its lr)
    assert math.log(algo.temperature.item()) == pytest.approx(math.log(0.01), abs=1.01 * config.temperature_lr)
    resumed = SACRLPD(config, resumed_policy := small_policy(spec))
    resumed_policy.load_state_dict(policy.state_dict())
    resumed.load_state_dict(algo.state_dict())
    torch.manual_seed(5)
    algo.update(batches[3], 0.0)
    torch.manual_seed(5)
    resumed.update(batches[3], 0.0)
    assert resumed.temperature.item() == algo.temperature.item()  # a resumed run does not restart it again


def test_a_critic_warm_up_trains_the_critics_alone_after_the_hand_over():
    """For critic_warmup_steps env steps after WSRL's warm-up the critics learn and the actor
    and temperature stay as they were; then the actor learns as usual."""
    spec = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0).spec
    algo = SACRLPD(SACConfig(**SMALL, warmup_steps=2, critic_warmup_steps=2), policy := small_policy(spec))
    batches = collect(policy, 5)
    for batch in batches[:2]:
        assert algo.update(batch, 0.0)["train/warming_up"] == 1.0
    actor = {k: v.clone() for k, v in policy.state_dict().items()}
    temperature = algo.temperature.item()
    for batch in batches[2:4]:
        critics = copy.deepcopy(algo.critics.state_dict())
        metrics = algo.update(batch, 0.0)
        assert metrics["train/critics_only"] == 1.0 and "train/actor_loss" not in metrics
        assert any(not torch.equal(critics[k], v) for k, v in algo.critics.state_dict().items())
    assert all(torch.equal(actor[k], v) for k, v in policy.state_dict().items())
    assert algo.temperature.item() == temperature and algo.critic_steps == 2 * SMALL["utd_ratio"]
    metrics = algo.update(batches[4], 0.0)
    assert "train/critics_only" not in metrics and "train/actor_loss" in metrics
    assert any(not torch.equal(actor[k], v) for k, v in policy.state_dict().items())
