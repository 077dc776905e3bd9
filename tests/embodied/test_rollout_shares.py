"""Several rollouts (`runtime.num_rollouts`): each holds a share of the config's envs, and the
shares together run the episodes one rollout with every env would."""

import numpy as np
import pytest
import torch

from embodied.algos.grpo import GRPOConfig
from embodied.algos.ppo import PPOConfig
from embodied.build import build_env
from embodied.config import TrainConfig
from embodied.core.env import episode_seed
from embodied.core.errors import ConfigError
from embodied.runtime.procs import check_rollouts
from embodied.runtime.rollout import Rollout, env_share, sampling_seed
from embodied.sim.maniskill import ManiSkillConfig  # registers the maniskill env


@pytest.mark.parametrize(
    "num_envs,num_workers,num_rollouts,group_size",
    [(4, 2, 2, 0), (7, 3, 3, 0), (8, 0, 2, 4), (12, 5, 2, 2), (5, 5, 5, 0)],
)
def test_shares_split_envs_in_order_and_keep_groups_whole(num_envs, num_workers, num_rollouts, group_size):
    shares = [env_share(num_envs, num_workers, num_rollouts, index, group_size) for index in range(num_rollouts)]
    ids = [i for env_ids, _ in shares for i in env_ids]
    assert ids == list(range(num_envs))  # every env once, contiguous blocks in rollout order
    assert all(env_ids for env_ids, _ in shares)
    assert sum(workers for _, workers in shares) == num_workers
    assert all(workers >= 1 for _, workers in shares) or num_workers == 0
    if group_size:
        for env_ids, _ in shares:
            groups = {i // group_size for i in env_ids}
            assert len(env_ids) == group_size * len(groups)  # no group split across rollouts


def test_each_rollout_samples_from_its_own_stream():
    assert sampling_seed(3, 0) == sampling_seed(3) == 3 + 7919  # one rollout: as before several existed
    assert len({sampling_seed(3, index) for index in range(4)}) == 4


@pytest.mark.slow
def test_shares_of_a_maniskill_env_reset_to_the_whole_envs_episodes_and_tasks():
    cfg = ManiSkillConfig(tasks=["PushCube-v1", "PickCube-v1"], num_envs=4)
    whole = build_env(cfg, seed=5)
    shares = [build_env(cfg, seed=5, env_ids=env_share(4, 0, 2, index)[0]) for index in (0, 1)]
    try:
        assert [share.env_ids for share in shares] == [[0, 1], [2, 3]]
        assert shares[0].tasks + shares[1].tasks == whole.tasks == ["PushCube-v1"] * 2 + ["PickCube-v1"] * 2
        assert shares[1].instructions == whole.instructions[2:]
        first = whole.reset()
        np.testing.assert_array_equal(np.concatenate([share.reset().state for share in shares]), first.state)
        # GRPO's grouped starts: a group's envs start from one state, the same in either layout.
        rollouts = [Rollout(env, None, torch.device("cpu")) for env in (whole, *shares)]
        for rollout in rollouts:
            rollout.start_groups(group_size=2, round_index=1, base_seed=5)
        grouped = rollouts[0].observation.state
        np.testing.assert_array_equal(grouped[0], grouped[1])
        assert not np.array_equal(grouped[1], grouped[2])
        np.testing.assert_array_equal(np.concatenate([r.observation.state for r in rollouts[1:]]), grouped)
    finally:
        for env in (whole, *shares):
            env.close()


def test_a_share_of_the_batched_scene_seeds_from_its_first_env():
    """The physx_cuda path (run on physx_cpu, one env): a share starts from its own env's seed."""
    from embodied.sim.maniskill_batched import ManiSkillBatchedEnv

    env = ManiSkillBatchedEnv(
        ManiSkillConfig(task="PushCube-v1", num_envs=4), base_seed=2, sim_backend="physx_cpu", env_ids=[3]
    )
    try:
        assert env.num_envs == 1 and env.env_ids == [3]
        assert env.first_seed == episode_seed(2, 3, 0)
    finally:
        env.close()


def test_rollouts_without_envs_or_env_workers_are_refused():
    config = TrainConfig(env=ManiSkillConfig(num_envs=4, num_workers=2), algo=PPOConfig())
    check_rollouts(config, 2)
    with pytest.raises(ConfigError, match="env.num_envs=4 cannot give each of runtime.num_rollouts=5"):
        check_rollouts(config, 5)
    with pytest.raises(ConfigError, match="env.num_workers=2 cannot give each of runtime.num_rollouts=3"):
        check_rollouts(config, 3)
    config.algo = GRPOConfig(group_size=4)
    with pytest.raises(ConfigError, match="in whole groups of algo.group_size=4"):
        check_rollouts(config, 2)
