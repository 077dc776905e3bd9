"""Latency between the world and the policy, in env ticks: `env.latency.*` on every CPU env.

A robot's policy sees an observation some ticks after the camera took it and its action reaches
the motors some ticks after it was chosen. `DelayedEnv` puts both delays around any single env,
so a policy is trained and evaluated under the latency it will meet on the robot:

- observation delay d_o: each step returns the observation of d_o ticks earlier (the first
  observation of the episode while there is no older one);
- action delay d_a: an action is applied d_a ticks after it is given, in order. Until the first
  action of an episode arrives the robot waits: the simulator is not stepped for those d_a
  ticks, which count as steps with reward 0 (the best reward there is in a task whose rewards
  are all negative, such as Pendulum's), so an episode lasts up to d_a ticks longer.

Rewards, success and episode ends are the world's own, undelayed: they are what the learner is
told, not what the policy sees (a reward classifier judges the observations the env returns,
delayed ones included). A delay is fixed, or drawn per episode (uniformly between a
minimum and a maximum, from the episode's seed so that runs repeat). A reset clears both queues."""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from embodied.core.env import SingleEnv, SingleObservation, SingleStep
from embodied.core.errors import ConfigError

# Separates the delay draws from the simulator's own use of the episode seed.
_DELAY_STREAM = 0x1A7E


@dataclass
class LatencyConfig:
    observation_ticks: int = 0  # the policy sees the observation of this many ticks ago
    action_ticks: int = 0  # an action reaches the robot this many ticks after it is given
    observation_ticks_max: Optional[int] = None  # random: each episode draws from [observation_ticks, this]
    action_ticks_max: Optional[int] = None  # random: each episode draws from [action_ticks, this]

    @property
    def active(self) -> bool:
        return bool(self.observation_ticks or self.action_ticks or self.observation_ticks_max or self.action_ticks_max)

    @classmethod
    def from_value(cls, value: "LatencyConfig | dict[str, Any] | None") -> "LatencyConfig":
        """The config from itself, its dict (an env config after a trip over the wire) or None."""
        if value is None or isinstance(value, LatencyConfig):
            return value or cls()
        keys = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(keys))
        if unknown:
            raise ConfigError(f"env.latency has no {unknown}; its keys: {keys}")
        return cls(**value)


def check_latency(latency: LatencyConfig) -> None:
    for kind in ("observation", "action"):
        low, high = getattr(latency, f"{kind}_ticks"), getattr(latency, f"{kind}_ticks_max")
        if low < 0:
            raise ConfigError(f"env.latency.{kind}_ticks must be >= 0, got {low}")
        if high is not None and high < low:
            raise ConfigError(
                f"env.latency.{kind}_ticks_max={high} is below env.latency.{kind}_ticks={low}: "
                "a random delay is drawn from [ticks, ticks_max]"
            )


def with_latency(make_env: Callable[[int], SingleEnv], latency: Any) -> Callable[[int], SingleEnv]:
    """`make_env`, its envs wrapped in the configured delays (itself where there are none)."""
    latency = LatencyConfig.from_value(latency)
    check_latency(latency)
    if not latency.active:
        return make_env
    return _DelayedFactory(make_env, latency)


@dataclass
class _DelayedFactory:
    """A picklable `make_env` (pipe workers are spawned with it)."""

    make_env: Callable[[int], SingleEnv]
    latency: LatencyConfig

    def __call__(self, env_id: int) -> SingleEnv:
        return DelayedEnv(self.make_env(env_id), self.latency)


class DelayedEnv(SingleEnv):
    def __init__(self, env: SingleEnv, latency: LatencyConfig):
        self.env = env
        self.latency = latency
        self.task, self.instruction = env.task, env.instruction
        longest = latency.action_ticks if latency.action_ticks_max is None else latency.action_ticks_max
        limit = env.spec.max_episode_steps
        self.spec = dataclasses.replace(env.spec, max_episode_steps=None if limit is None else limit + longest)
        self.observation_ticks = self.action_ticks = 0
        self._observed: deque[SingleObservation] = deque(maxlen=1)  # the last d_o + 1 observations
        self._queued: deque[np.ndarray] = deque()  # actions given, not yet applied

    def reset(self, seed: int) -> SingleObservation:
        draws = np.random.default_rng([seed, _DELAY_STREAM])
        self.observation_ticks = _draw(draws, self.latency.observation_ticks, self.latency.observation_ticks_max)
        self.action_ticks = _draw(draws, self.latency.action_ticks, self.latency.action_ticks_max)
        observation = self.env.reset(seed)
        self._observed = deque([observation] * (self.observation_ticks + 1), maxlen=self.observation_ticks + 1)
        self._queued.clear()
        return observation

    def step(self, action: np.ndarray) -> SingleStep:
        self._queued.append(np.array(action, copy=True))
        if len(self._queued) > self.action_ticks:
            result = self.env.step(self._queued.popleft())
        else:  # the episode's first action is still on its way: the robot waits
            result = SingleStep(self._observed[-1], reward=0.0, terminated=False, truncated=False, success=False)
        self._observed.append(result.observation)
        return dataclasses.replace(result, observation=self._observed[0])

    def render(self) -> np.ndarray:
        return self.env.render()

    def end_effector_position(self) -> np.ndarray | None:
        return self.env.end_effector_position()

    def expert_action(self) -> np.ndarray:
        return self.env.expert_action()

    def close(self) -> None:
        self.env.close()


def _draw(draws: np.random.Generator, low: int, high: int | None) -> int:
    return low if high is None else int(draws.integers(low, high + 1))
