"""The scripted operator (`operator.policy=scripted`): the env's scripted expert reads the
simulator's privileged state, so it can correct a policy that sees only camera frames, as a
person at a real robot would. Real ManiSkill, through an env worker process."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embodied.core.errors import ConfigError
from embodied.core.operator import OperatorConfig
from embodied.core.types import Observation
from embodied.runtime.operator import SCRIPTED, SimOperator, StallRule
from embodied.sim.gymnasium_env import GymnasiumConfig, make_gymnasium
from embodied.sim.maniskill import make_maniskill
from embodied.sim.maniskill_common import ManiSkillConfig
from tests.embodied.test_cli import embodied
from tests.embodied.test_sac_pixels import PIXEL_SAC

PICKCUBE_FROM_PIXELS = ManiSkillConfig(
    task="PickCube-v1", control_mode="pd_ee_delta_pos", num_envs=2, num_workers=1, obs_mode="rgb", image_size=32
)


@pytest.mark.slow
def test_the_expert_takes_over_mid_episode_and_grasps_again_after_a_drop():
    """Env 0: the expert drives throughout. Env 1: it drives, then another hand opens the
    gripper and lifts for 8 steps (the cube falls) while the expert only watches, then it
    drives again: its plan starts over from the scene as it is, and the cube still arrives."""
    env = make_maniskill(PICKCUBE_FROM_PIXELS, seed=0)
    try:
        observation = env.reset()
        assert set(observation.images) and observation.state.shape[0] == 2  # the policy's view: no cube pose
        ended: dict[int, bool] = {}
        for t in range(env.spec.max_episode_steps):
            actions = env.expert_actions()
            assert actions.shape == (2, 4) and actions.dtype == np.float32
            if 15 <= t < 23:
                actions[1] = [0.0, 0.0, 1.0, 1.0]  # up, gripper open
            result = env.step(actions[:, None])
            for i in np.flatnonzero(result.terminated | result.truncated):
                ended.setdefault(int(i), bool(result.success[i]))
            if len(ended) == 2:
                break
        assert ended == {0: True, 1: True}
    finally:
        env.close()


def test_an_env_without_a_scripted_expert_is_refused_when_the_operator_is_built():
    env = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0)
    try:
        with pytest.raises(ConfigError, match="no scripted expert"):
            SimOperator(OperatorConfig(policy=SCRIPTED), num_envs=1, chunk_size=1, env=env)
    finally:
        env.close()


def test_the_stall_rule_steps_in_when_the_reward_stops_rising_and_leaves_success_alone():
    """Env 0 makes no progress: after `patience` steps the operator drives `max_takeover` steps,
    then the policy gets its full patience again. Env 1 keeps improving, then succeeds and
    stalls: it is never taken over."""
    rule = StallRule(progress=0.1, patience=2, max_takeover=3, envs=2)
    nothing = np.zeros((2, 1))
    driven = []
    rewards = [(0.5, 0.1), (0.5, 0.3), (0.55, 0.5), (0.5, 0.7), (0.9, 1.0)] + [(0.9, 1.0)] * 4
    success = [False, False, False, False, True, False, False, False, False]
    for (r0, r1), succeeded in zip(rewards, success):
        driven.append(rule.step(nothing, nothing).tolist())
        rule.observe(np.array([r0, r1]), np.array([False, succeeded]))
    # env 0: 0.5 sets the mark, 0.5 and 0.55 (+0.05) are no progress: driven at steps 3-5 (its
    # 0.9 raises the mark); then 0.9, 0.9 without progress, and it steps in again at step 8
    assert [d[0] for d in driven] == [False, False, False, True, True, True, False, False, True]
    assert not any(d[1] for d in driven)
    rule.reset(np.array([True, False]))
    assert not rule.step(nothing, nothing)[0]  # a new episode starts with the policy driving


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(trigger="worry"), "operator.trigger must be one of drift, stall"),
        (dict(trigger="stall", max_takeover=0), "max_takeover >= 1"),
    ],
)
def test_a_stall_operator_without_a_known_trigger_or_a_takeover_length_is_refused(overrides, message):
    env = make_gymnasium(GymnasiumConfig(task="Pendulum-v1"), 0, 0)
    try:
        with pytest.raises(ConfigError, match=message):
            SimOperator(OperatorConfig(policy="runs/any", **overrides), num_envs=1, chunk_size=1, env=env)
    finally:
        env.close()


def test_the_robot_clients_oracle_refuses_the_stall_trigger():
    from embodied.robot_cli import oracle_teleop
    from embodied.robots.teleop import TeleopConfig

    config = TeleopConfig(name="oracle", operator=OperatorConfig(policy="runs/any", trigger="stall"))
    with pytest.raises(ConfigError, match="only training in simulation has"):
        oracle_teleop(config, 4, True, None)


@pytest.mark.slow
def test_on_pickcube_a_stalled_policy_gets_the_experts_steps_flagged():
    """A policy that holds still makes no progress: the expert drives the next steps (the
    executed actions are its own), then hands back."""
    config = ManiSkillConfig(task="PickCube-v1", control_mode="pd_ee_delta_pos", num_envs=2, num_workers=0)
    env = make_maniskill(config, seed=0)
    try:
        operator_config = OperatorConfig(policy=SCRIPTED, trigger="stall", patience=3, max_takeover=4)
        operator = SimOperator(operator_config, num_envs=2, chunk_size=1, env=env)
        asked = operator.infer  # the expert keeps a plan: each call moves it on, so it is asked once a step
        expert: list[np.ndarray] = []
        operator.infer = lambda observation: expert.append(asked(observation)) or expert[-1]
        observation, flags = env.reset(), []
        for _ in range(14):
            still = np.zeros((2, 1, 4), dtype=np.float32)
            actions, intervened = operator.apply(observation, still)
            assert np.array_equal(actions[intervened], expert[-1][intervened]) and not actions[~intervened].any()
            assert actions[intervened].any() or not intervened.any()
            result = env.step(actions)
            operator.stepped(result.reward, result.success, result.done)
            observation = result.observation
            flags.append(intervened[0])
        first = flags.index(True)
        assert 3 <= first <= 5 and flags[first : first + 4] == [True] * 4 and not flags[first + 4]
    finally:
        env.close()


@pytest.mark.slow
def test_a_pixel_policy_trains_with_the_scripted_operator_taking_over(tmp_path):
    """Every drifting step is taken over (threshold ~0): the executed actions are the expert's,
    flagged, and RLPD holds them among its offline rows."""
    run_dir = tmp_path / "run"
    pickcube = ["env=maniskill_pickcube", "env.control_mode=pd_ee_delta_pos", "env.num_workers=1"]
    settings = [a for a in PIXEL_SAC if not a.startswith(("env=", "env.num_workers=", "checkpoint_every="))]
    operator = ["operator.policy=scripted", "operator.threshold=1e-3", "operator.patience=1"]
    embodied("train", *settings, *pickcube, *operator, "total_env_steps=12", f"run_dir={run_dir}")
    updates = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "train/iteration" in line
    ]
    shares = [u["replay/intervened"] for u in updates]  # of each update's new steps
    assert len(shares) == 6 and all(share == 1.0 for share in shares[1:])  # taken over, never handed back
    assert updates[-1]["replay/offline"] >= 10 and updates[-1]["replay/online"] == 12


@pytest.mark.slow
def test_a_discrete_gripper_trains_on_the_scripted_operators_corrections_and_serves_its_commands(tmp_path):
    """PickCube from state with a two-command gripper: the operator's gripper actions become
    the gripper critic's data, and the saved policy acts with one of the commands."""
    from embodied.runtime.configs import DeviceConfig
    from embodied.serve import ServeConfig, load_checkpoint_policy

    run_dir = tmp_path / "run"
    pickcube = ["env=maniskill_pickcube", "env.control_mode=pd_ee_delta_pos", "env.num_workers=1"]
    settings = [a for a in PIXEL_SAC if not a.startswith(("env", "policy.image", "checkpoint_every="))]
    operator = ["operator.policy=scripted", "operator.threshold=1e-3", "operator.patience=1"]
    gripper = ["policy.gripper_commands=[-1.0,1.0]", "policy.gripper_hidden=[8]"]
    embodied("train", *settings, *pickcube, *operator, *gripper, "total_env_steps=12", f"run_dir={run_dir}")
    updates = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "train/iteration" in line
    ]
    assert all(np.isfinite(u["train/gripper_critic_loss"]) for u in updates[1:])
    infer, spec, _ = load_checkpoint_policy(ServeConfig(checkpoint=str(run_dir), runtime=DeviceConfig(device="cpu")))
    states = np.random.default_rng(0).normal(size=(8, spec.state_dim)).astype(np.float32)
    actions = infer(Observation(state=states))
    assert actions.shape[-1] == 4 and set(np.unique(actions[..., -1])) <= {-1.0, 1.0}
