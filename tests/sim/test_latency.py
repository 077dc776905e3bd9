"""`env.latency`: observations and actions reach their destination exactly the configured number
of ticks late, resets clear the queues, random delays repeat with the seed, and the option
travels through every way single envs are built (in process, pipe and ZeroMQ workers)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from embodied.build import build_env
from embodied.core.env import SingleEnv, SingleObservation, SingleStep
from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec
from embodied.sim.gymnasium_env import GymnasiumConfig
from embodied.sim.latency import DelayedEnv, LatencyConfig, with_latency
from embodied.sim.worker import single_env_factory


class Ticker(SingleEnv):
    """state = (steps taken, last action applied); the reward is the action applied."""

    def __init__(self, env_id: int = 0, limit: int | None = None):
        self.spec = EnvSpec(
            state_dim=2, action_dim=1, action_low=(-100.0,), action_high=(100.0,), max_episode_steps=limit
        )
        self.task = self.instruction = "tick"
        self.limit = limit
        self.applied: list[float] = []

    def _observation(self) -> SingleObservation:
        last = self.applied[-1] if self.applied else -1.0
        return SingleObservation(state=np.array([len(self.applied), last], dtype=np.float32))

    def reset(self, seed: int) -> SingleObservation:
        self.applied = []
        return self._observation()

    def step(self, action: np.ndarray) -> SingleStep:
        self.applied.append(float(action[0]))
        ended = self.limit is not None and len(self.applied) >= self.limit
        return SingleStep(
            self._observation(), reward=float(action[0]), terminated=False, truncated=ended, success=False
        )


def run(env: SingleEnv, actions: list[float], seed: int = 0) -> list[SingleStep]:
    env.reset(seed)
    return [env.step(np.array([a], dtype=np.float32)) for a in actions]


def test_observations_and_actions_arrive_exactly_the_configured_ticks_late() -> None:
    env = DelayedEnv(Ticker(), LatencyConfig(observation_ticks=2, action_ticks=3))
    actions = [10.0 + t for t in range(8)]
    steps = run(env, actions)
    # the robot waits 3 ticks for the first action, then applies them in order
    assert env.env.applied == actions[:5]
    assert [s.reward for s in steps] == [0.0, 0.0, 0.0, *actions[:5]]
    # tick t (1-based) shows the world as it was at tick t - 2 (the reset observation before that)
    true_steps = [0, 0, 0, 1, 2, 3, 4, 5]  # simulator steps taken after each tick
    for t, step in enumerate(steps, start=1):
        seen = true_steps[t - 3] if t >= 3 else 0
        assert step.observation.state[0] == seen, f"tick {t}"


def test_a_reset_clears_both_queues() -> None:
    env = DelayedEnv(Ticker(), LatencyConfig(observation_ticks=1, action_ticks=2))
    run(env, [1.0, 2.0, 3.0, 4.0])
    assert env.env.applied == [1.0, 2.0]
    first = env.reset(7)
    assert first.state.tolist() == [0.0, -1.0]
    steps = [env.step(np.array([a], dtype=np.float32)) for a in (5.0, 6.0, 7.0)]
    # nothing queued before the reset is applied after it, and no old observation comes back
    assert env.env.applied == [5.0]
    assert [s.observation.state.tolist() for s in steps] == [[0.0, -1.0], [0.0, -1.0], [0.0, -1.0]]


def test_episodes_end_when_the_world_says_so_and_last_longer_by_the_action_delay() -> None:
    env = DelayedEnv(Ticker(limit=4), LatencyConfig(action_ticks=2))
    assert env.spec.max_episode_steps == 6
    steps = run(env, [1.0] * 6)
    assert [s.truncated for s in steps] == [False] * 5 + [True]


def test_random_delays_are_drawn_per_episode_from_the_seed_within_their_range() -> None:
    latency = LatencyConfig(observation_ticks=1, observation_ticks_max=3, action_ticks=0, action_ticks_max=2)
    env = DelayedEnv(Ticker(), latency)
    draws = {}
    for seed in range(40):
        env.reset(seed)
        draws[seed] = (env.observation_ticks, env.action_ticks)
    assert {d[0] for d in draws.values()} == {1, 2, 3}
    assert {d[1] for d in draws.values()} == {0, 1, 2}
    for seed in (0, 13):
        env.reset(seed)
        assert (env.observation_ticks, env.action_ticks) == draws[seed]


def test_no_latency_leaves_the_env_unwrapped_and_bad_values_are_refused() -> None:
    assert with_latency(Ticker, LatencyConfig()) is Ticker
    with pytest.raises(ConfigError, match="action_ticks must be >= 0"):
        with_latency(Ticker, LatencyConfig(action_ticks=-1))
    with pytest.raises(ConfigError, match="observation_ticks_max=1 is below"):
        with_latency(Ticker, {"observation_ticks": 2, "observation_ticks_max": 1})


def pendulum_states(config: GymnasiumConfig, actions: np.ndarray) -> np.ndarray:
    """The states a batched gymnasium env returns over `actions` (T, A), one env, one action a step."""
    env = build_env(config, seed=3)
    try:
        states = [env.reset().state[0]]
        for action in actions:
            states.append(env.step(action[None, None]).observation.state[0])
        return np.stack(states)
    finally:
        env.close()


@pytest.mark.parametrize("workers, transport", [(0, "pipe"), (1, "pipe"), (1, "zmq")])
def test_a_real_env_is_delayed_in_process_and_in_workers(workers: int, transport: str) -> None:
    actions = np.random.default_rng(0).uniform(-2, 2, size=(12, 1)).astype(np.float32)
    plain = GymnasiumConfig(task="Pendulum-v1", num_workers=workers, transport=transport)
    delayed = dataclasses.replace(plain, latency=LatencyConfig(observation_ticks=1, action_ticks=2))
    world = pendulum_states(plain, actions)
    seen = pendulum_states(delayed, actions)
    # delayed tick t shows the world after t - 1 ticks, of which the first 2 waited for an action:
    # world step t - 3 of the same actions (the first state while t - 3 < 0)
    for t in range(len(seen)):
        np.testing.assert_array_equal(seen[t], world[max(t - 3, 0)], err_msg=f"tick {t}")


def test_a_zmq_worker_builds_the_delay_from_the_config_it_receives() -> None:
    config = dataclasses.asdict(GymnasiumConfig(task="Pendulum-v1", latency=LatencyConfig(action_ticks=4)))
    env = single_env_factory(config)(0)
    try:
        assert isinstance(env, DelayedEnv)
        assert env.latency == LatencyConfig(action_ticks=4)
    finally:
        env.close()


def test_a_batched_maniskill_backend_refuses_latency() -> None:
    from embodied.sim.maniskill_common import ManiSkillConfig, check_config

    check_config(ManiSkillConfig(latency=LatencyConfig(action_ticks=1)))  # the cpu backend's single envs
    with pytest.raises(ConfigError, match="env.latency delays the cpu backend"):
        check_config(ManiSkillConfig(backend="cpu_batched", latency=LatencyConfig(action_ticks=1)))


def test_a_resumed_worker_replays_its_episodes_through_the_delays_to_the_same_state() -> None:
    from embodied.sim.worker_envs import WorkerEnvs

    make = with_latency(Ticker, LatencyConfig(observation_ticks=1, action_ticks=2, action_ticks_max=3))
    first = WorkerEnvs(make, [0, 1], base_seed=5)
    first.reset()
    for value in range(1, 5):
        stepped = first.step(np.full((2, 2, 1), value, dtype=np.float32))
    saved = first.resume_state()
    second = WorkerEnvs(make, [0, 1], base_seed=5)
    restored = second.restore(saved)
    np.testing.assert_array_equal(restored["state"], stepped["state"])
    for before, after in zip(first.envs, second.envs):
        assert after.action_ticks == before.action_ticks and after.env.applied == before.env.applied
        assert [a.tolist() for a in after._queued] == [a.tolist() for a in before._queued]
    np.testing.assert_array_equal(
        second.step(np.full((2, 2, 1), 9, dtype=np.float32))["state"],
        first.step(np.full((2, 2, 1), 9, dtype=np.float32))["state"],
    )


def test_unknown_latency_keys_are_named_and_demos_and_the_simulated_robot_leave_latency_out(tmp_path) -> None:
    from omegaconf import OmegaConf

    from embodied.demos import DemosConfig, _check
    from embodied.robots.sim_robot import SimRobotConfig, env_config_of
    from embodied.sim.maniskill_common import ManiSkillConfig

    with pytest.raises(ConfigError, match=r"env.latency has no \['action_tick'\]"):
        LatencyConfig.from_value({"action_tick": 2})
    delayed = ManiSkillConfig(latency=LatencyConfig(action_ticks=2))
    with pytest.raises(ConfigError, match="record demos without it"):
        _check(DemosConfig(env=delayed, dataset=str(tmp_path / "demos")))
    # a run trained under latency, deployed to the simulated robot: the world has no delay of its own
    OmegaConf.save({"env": dataclasses.asdict(delayed)}, tmp_path / "config.yaml")
    assert "latency" not in env_config_of(SimRobotConfig(env_from=str(tmp_path)))
    assert env_config_of(SimRobotConfig(env={"name": "gymnasium", "latency": {"action_ticks": 1}}))["latency"]
