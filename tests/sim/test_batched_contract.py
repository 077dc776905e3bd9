"""What every batched env promises the rollout, checked on each: ManiSkill's batched scene (the
physx_cuda code path, on physx_cpu, where ManiSkill allows one env) and Genesis's, at 64 envs
in one scene. A partial reset leaves the other envs as they were; a chunk's reward is the sum
of its steps' and the chunk stops at an episode's end; the observation kept for bootstrapping
a finished episode is the one its last step reached, not the next episode's first."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.core.env import BatchedEnv

LIMIT = 6  # steps per episode: a chunk of 4 runs into it on its second chunk
CHUNK = 4


def maniskill() -> BatchedEnv:
    from embodied.sim.maniskill_batched import ManiSkillBatchedEnv
    from embodied.sim.maniskill_common import ManiSkillConfig

    config = ManiSkillConfig(task="PickCube-v1", control_mode="pd_ee_delta_pos", num_envs=1, max_episode_steps=LIMIT)
    return ManiSkillBatchedEnv(config, base_seed=0, sim_backend="physx_cpu")


def genesis() -> BatchedEnv:
    from embodied.sim.genesis import GenesisConfig, make_genesis

    return make_genesis(GenesisConfig(num_envs=64, max_episode_steps=LIMIT), seed=0)


# Genesis's scene of 64 envs takes 35-55 s to build beside other tests: out of the fast lane
@pytest.fixture(
    scope="module",
    params=[
        pytest.param(maniskill, id="maniskill-physx_cpu-1"),
        pytest.param(genesis, id="genesis-64", marks=pytest.mark.slow),
    ],
)
def env(request):
    built = request.param()
    yield built
    built.close()


def actions(env: BatchedEnv, steps: int, seed: int = 0) -> np.ndarray:
    """Moves that stir the scene (B, steps, A), within the env's bounds."""
    low, high = np.array(env.spec.action_low), np.array(env.spec.action_high)
    unit = np.random.default_rng(seed).uniform(-1.0, 1.0, (env.num_envs, steps, env.spec.action_dim))
    return (low + (unit + 1) / 2 * (high - low)).astype(np.float32)


def test_a_partial_reset_leaves_the_other_envs_untouched(env):
    env.rewind()
    before = env.step(actions(env, 3)).observation.state
    reset = [0] if env.num_envs == 1 else [1, 5, 63]
    after = env.reset(env_idx=reset).state
    others = np.setdiff1d(np.arange(env.num_envs), reset)
    np.testing.assert_array_equal(after[others], before[others])
    assert all(not np.array_equal(after[i], before[i]) for i in reset)
    # and they go on as they would have: the same moves from the same states
    env.rewind()
    env.step(actions(env, 3))
    undisturbed = env.step(actions(env, 2, seed=1)).observation.state
    env.rewind()
    env.step(actions(env, 3))
    env.reset(env_idx=reset)
    disturbed = env.step(actions(env, 2, seed=1)).observation.state
    np.testing.assert_allclose(disturbed[others], undisturbed[others], rtol=0, atol=1e-5)


def test_a_chunk_sums_its_steps_rewards_stops_at_the_end_and_keeps_the_last_observation(env):
    moves = actions(env, 2 * CHUNK)
    env.rewind()
    chunks = [env.step(moves[:, k * CHUNK : (k + 1) * CHUNK]) for k in range(2)]
    env.rewind()
    steps = [env.step(moves[:, j : j + 1]) for j in range(LIMIT)]
    assert chunks[0].executed_steps.tolist() == [CHUNK] * env.num_envs
    assert chunks[1].executed_steps.tolist() == [LIMIT - CHUNK] * env.num_envs  # it stopped at the limit
    assert chunks[1].truncated.all() and not chunks[1].terminated.any() and not steps[-2].truncated.any()
    np.testing.assert_array_equal(chunks[1].executed_action[:, LIMIT - CHUNK :], 0.0)
    for chunk, window in zip(chunks, (steps[:CHUNK], steps[CHUNK:LIMIT])):
        summed = np.sum([step.reward for step in window], axis=0)
        np.testing.assert_allclose(chunk.reward, summed, rtol=1e-5, atol=1e-5)
    # the observation kept for bootstrapping is the one the episode's last step reached ...
    last = steps[-1]
    assert last.truncated.all()
    np.testing.assert_allclose(chunks[1].final_observation.state, last.final_observation.state, rtol=0, atol=1e-5)
    assert not np.allclose(last.final_observation.state, steps[-2].observation.state)  # one step on
    # ... while the observation returned is the next episode's first
    assert not np.allclose(chunks[1].final_observation.state, chunks[1].observation.state)
    assert [episode.length for episode in chunks[1].episodes] == [LIMIT] * env.num_envs
    assert env.resume_state() is None  # their envs step together: a resumed run starts fresh episodes
