"""An operator for training in simulation (`operator.*`): a trained policy, or the env's
scripted expert, that takes over an env when the learning policy drifts from it (the robot
client's oracle rule, batched; `operator.trigger=drift`) or when the episode stops making
progress (`operator.trigger=stall`, read from the env's reward), so interventions reach the
learner as they would from a person at a real robot.

The executed action is the operator's where it intervenes and the flag travels with the
transition; off-policy learners use both (RLPD treats intervened steps as demonstrations).
On-policy ratios are meaningless for actions the policy did not take, so PPO and GRPO refuse
an operator."""

from __future__ import annotations

from typing import Any

import numpy as np

from embodied.core.env import BatchedEnv
from embodied.core.errors import ConfigError
from embodied.core.operator import SCRIPTED, TRIGGERS, OperatorConfig
from embodied.core.types import Observation
from embodied.robots.teleop import OracleRule
from embodied.runs.loading import load_run_policy, numpy_infer

OFF_POLICY_ALGOS = ("sac_rlpd", "dsrl")


class StallRule:
    """When a simulated operator takes over, for `envs` envs at once: once an episode's best
    step reward has not risen by more than `progress` for `patience` steps (the policy is stuck,
    hovering, or has dropped the object), it drives `max_takeover` steps and hands back. Unlike
    the drift rule it leaves a policy alone that makes headway its own way, so it steps in less
    as the policy improves, as a person at a robot does; an episode that has succeeded is left
    alone. It reads the env's reward, so it exists in simulation only."""

    def __init__(self, progress: float, patience: int, max_takeover: int, envs: int):
        if progress < 0 or patience < 1 or max_takeover < 1:
            raise ConfigError(
                "operator.trigger=stall needs operator.progress >= 0, operator.patience >= 1 and "
                f"operator.max_takeover >= 1 (got {progress}, {patience}, {max_takeover})"
            )
        self.progress, self.patience, self.max_takeover = progress, patience, max_takeover
        self.intervening = np.zeros(envs, dtype=bool)
        self.best = np.full(envs, -np.inf)  # the episode's best step reward so far
        self.stalled = np.zeros(envs, dtype=np.int64)  # steps since it last rose (while the policy drives)
        self.driven = np.zeros(envs, dtype=np.int64)  # steps of this takeover so far
        self.succeeded = np.zeros(envs, dtype=bool)

    def reset(self, rows: np.ndarray | slice = slice(None)) -> None:
        self.intervening[rows] = False
        self.best[rows] = -np.inf
        self.stalled[rows] = 0
        self.driven[rows] = 0
        self.succeeded[rows] = False

    def step(self, policy_actions: np.ndarray, operator_actions: np.ndarray) -> np.ndarray:
        """Which envs the operator drives this step (the actions are not what decides)."""
        take_over = ~self.intervening & ~self.succeeded & (self.stalled >= self.patience)
        hand_back = self.intervening & ((self.driven >= self.max_takeover) | self.succeeded)
        self.intervening = (self.intervening | take_over) & ~hand_back
        self.stalled[hand_back] = 0  # the policy gets its full patience again
        self.driven = np.where(self.intervening, self.driven + 1, 0)
        return self.intervening.copy()

    def observe(self, rewards: np.ndarray, success: np.ndarray) -> None:
        """What the step just taken earned: progress resets the count, success ends the watch."""
        rose = rewards > self.best + self.progress
        self.best = np.maximum(self.best, rewards)
        self.stalled = np.where(rose | self.intervening, 0, self.stalled + 1)
        self.succeeded |= np.asarray(success, dtype=bool)


class SimOperator:
    """`cfg.policy` a trained run (its policy reads what the learning policy reads), or
    SCRIPTED: the env's scripted expert, which reads the simulator's privileged state, as a
    person reads the scene; the operator for a policy that learns from pixels."""

    def __init__(self, cfg: OperatorConfig, num_envs: int, chunk_size: int, env: BatchedEnv | None = None):
        if cfg.trigger not in TRIGGERS:
            raise ConfigError(f"operator.trigger must be one of {', '.join(TRIGGERS)}, got '{cfg.trigger}'")
        self.rule: OracleRule | StallRule = (
            StallRule(cfg.progress, cfg.patience, cfg.max_takeover, num_envs)
            if cfg.trigger == "stall"
            else OracleRule(cfg.threshold, cfg.patience, cfg.release, envs=num_envs, max_takeover=cfg.max_takeover)
        )
        if cfg.policy == SCRIPTED:
            if env is None:
                raise ValueError("operator.policy=scripted needs the env whose expert it asks")
            if chunk_size != 1:
                raise ConfigError(
                    f"the scripted expert acts one step at a time; the policy acts in chunks of {chunk_size}"
                )
            env.expert_actions()  # an env without one says so here, not at the first step
            self.infer = lambda observation: env.expert_actions()[:, None]
        else:
            self.infer = numpy_infer(load_run_policy(cfg.policy))
        self.chunk_size = chunk_size

    def apply(self, observation: Observation, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The actions to execute (B, C, A) and which envs the operator drove (B,)."""
        operated = np.asarray(self.infer(observation), dtype=np.float32)
        if operated.shape[1] < self.chunk_size or operated.shape[2] != actions.shape[2]:
            raise ConfigError(f"the operator acts in chunks of {operated.shape[1:]}, the policy in {actions.shape[1:]}")
        operated = operated[:, : self.chunk_size]
        intervened = self.rule.step(actions[:, 0], operated[:, 0])
        return np.where(intervened[:, None, None], operated, actions), intervened

    def stepped(self, rewards: np.ndarray, success: np.ndarray, done: np.ndarray) -> None:
        """After an env step: the stall rule sees its rewards; envs that start anew are forgotten."""
        if isinstance(self.rule, StallRule):
            self.rule.observe(np.asarray(rewards, dtype=np.float64), success)
        self.episodes_ended(done)

    def episodes_ended(self, done: np.ndarray | None = None) -> None:
        """Forget who was driving the envs that start anew (None: all of them)."""
        self.rule.reset(slice(None) if done is None else np.asarray(done, dtype=bool))


def build_operator(config: Any, env: BatchedEnv) -> SimOperator | None:
    cfg: OperatorConfig = config.operator
    if not cfg.policy:
        return None
    if config.algo.name not in OFF_POLICY_ALGOS:
        raise ConfigError(
            f"operator.policy needs an off-policy algorithm ({', '.join(OFF_POLICY_ALGOS)}): "
            f"algo '{config.algo.name}' would learn from actions its policy did not take"
        )
    if getattr(config.runtime, "pipeline", False):
        raise ConfigError("operator.policy does not work with runtime.pipeline=true")
    return SimOperator(cfg, env.num_envs, config.policy.chunk_size, env)
