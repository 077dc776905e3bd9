"""Genesis's PickCube (sim/genesis.py) through its env worker under .venv-genesis: the task's
rules (what its batched contract does not cover: tests/sim/test_batched_contract.py)."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.core.errors import ConfigError
from embodied.sim.genesis import GenesisConfig, check_config, make_genesis, pick_cube_expert


@pytest.mark.slow  # a scene of 16 envs: 35-50 s to build
def test_the_scripted_expert_picks_the_cube_and_success_ends_its_episode_as_terminated():
    env = make_genesis(GenesisConfig(num_envs=16), seed=0)
    try:
        first = env.reset()
        assert first.state.shape == (16, 42) and env.spec.action_dim == 4 and env.spec.control_hz == 20.0
        # the cube rests on the floor, 2 cm up; the goal is up to 30 cm above it
        assert np.allclose(first.state[:, 31], 0.02, atol=2e-3) and (first.state[:, 28] >= 0.02).all()
        episodes, ended_rewards = [], []
        for _ in range(100):
            result = env.step(env.expert_actions()[:, None])
            episodes += result.episodes
            assert (result.terminated <= result.success).all()  # only success terminates
            ended_rewards += result.reward[result.terminated].tolist()
        assert len(episodes) >= 16
        assert np.mean([episode.success for episode in episodes]) >= 0.5
        assert all(episode.length < 50 for episode in episodes if episode.success)
        assert all(episode.length == 50 for episode in episodes if not episode.success)
        np.testing.assert_allclose(ended_rewards, 1.0)  # the normalised reward's maximum, on success
    finally:
        env.close()


def test_the_expert_reads_the_state_layout_it_is_given():
    state = np.zeros((3, 42), np.float32)
    state[:, 19:22] = [0.6, 0.0, 0.2]  # the TCP
    state[:, 29:32] = [[0.6, 0.0, 0.02], [0.7, 0.0, 0.02], [0.6, 0.0, 0.19]]  # the cube
    state[:, 26:29] = [0.5, 0.1, 0.3]  # the goal
    state[2, 18] = 1.0  # grasped
    actions = pick_cube_expert(state)
    assert actions[0, 2] < 0 and actions[0, 3] == 1.0  # lined up above it: down, open
    assert actions[1, 0] > 0 and actions[1, 3] == 1.0  # not lined up: towards it first
    assert actions[2, 0] < 0 and actions[2, 1] > 0 and actions[2, 3] == -1.0  # holding it: to the goal, closed


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ConfigError, match="Did you mean 'PickCube'"):
        check_config(GenesisConfig(task="PickCub"))
    with pytest.raises(ConfigError, match="env.device must be one of"):
        check_config(GenesisConfig(device="tpu"))
    with pytest.raises(ConfigError, match="only with env.transport=zmq"):
        check_config(GenesisConfig(transport="pipe"))
    with pytest.raises(ConfigError, match="no Genesis interpreter at /nowhere/python"):
        make_genesis(GenesisConfig(python="/nowhere/python"), seed=0)
