"""robosuite 1.5 adapter on real robosuite (CPU, offscreen EGL rendering)."""

import numpy as np
import pytest

from embodied.core.errors import ConfigError
from embodied.sim.robosuite_env import RobosuiteConfig, RobosuiteEnv, make_robosuite


@pytest.mark.parametrize("obs_mode", ["state", "rgb"])
@pytest.mark.slow
def test_lift_observation_and_action_shapes(obs_mode):
    env = make_robosuite(RobosuiteConfig(task="Lift", num_envs=2, obs_mode=obs_mode, image_size=64), seed=0)
    try:
        observation = env.reset()
        result = env.step(np.zeros((2, 2, env.spec.action_dim), np.float32))
    finally:
        env.close()
    assert env.spec.action_dim == 7 and env.spec.control_hz == 20.0 and env.spec.max_episode_steps == 200
    if obs_mode == "state":
        assert observation.state.shape == (2, env.spec.state_dim) and env.spec.state_dim > 50  # robot + cube
        assert observation.images == {}
    else:
        assert set(observation.images) == {"agentview", "robot0_eye_in_hand"}
        assert observation.images["agentview"].shape == (2, 64, 64, 3)
        assert observation.images["agentview"].dtype == np.uint8
    assert result.reward.shape == (2,) and (result.executed_steps == 2).all()
    assert observation.instruction == ["lift the cube"] * 2


def test_same_seed_same_start_and_truncation_at_the_limit():
    env = make_robosuite(RobosuiteConfig(task="Lift", num_envs=1, max_episode_steps=3), seed=0)
    try:
        first, again, other = env.reset(seeds=[5]), env.reset(seeds=[5]), env.reset(seeds=[6])
        result = env.step(np.zeros((1, 3, 7), np.float32))
    finally:
        env.close()
    np.testing.assert_array_equal(first.state, again.state)
    assert not np.array_equal(first.state, other.state)  # the cube starts elsewhere
    assert result.truncated[0] and not result.terminated[0] and result.episodes[0].length == 3


def test_lift_success_fires_when_the_cube_is_above_the_table():
    env = RobosuiteEnv(RobosuiteConfig(task="Lift", terminate_on_success=True))
    try:
        env.reset(0)
        assert not env.step(np.zeros(7)).success
        sim, cube = env.env.sim, env.env.cube
        joint = sim.model.get_joint_qpos_addr(cube.joints[0])
        sim.data.qpos[joint[0] + 2] += 0.2  # lift the cube 20 cm
        sim.forward()
        assert env.env._check_success()
        step = env.step(np.zeros(7))
    finally:
        env.close()
    # One physics step later the cube has begun to fall but is still well above the table.
    assert step.success and step.terminated and not step.truncated


@pytest.mark.slow
def test_robosuite_runs_in_zmq_env_workers():
    env = make_robosuite(RobosuiteConfig(task="Lift", num_envs=2, num_workers=2, transport="zmq"), seed=0)
    try:
        observation = env.reset()
        assert observation.state.shape[0] == 2
        env.step(np.zeros((2, 1, 7), np.float32))
    finally:
        env.close()


def test_unknown_robosuite_task_lists_known_ones():
    with pytest.raises(ConfigError, match="Did you mean 'Lift'"):
        make_robosuite(RobosuiteConfig(task="Lfit"), seed=0)
