"""An operator for training in simulation (`operator.*`): a trained policy, or the env's
scripted expert, that takes over an env when the learning policy drifts from it (the robot
client's oracle rule, batched), so interventions reach the learner as they would from a person
at a real robot.

The executed action is the operator's where it intervenes and the flag travels with the
transition; off-policy learners use both (RLPD treats intervened steps as demonstrations).
On-policy ratios are meaningless for actions the policy did not take, so PPO and GRPO refuse
an operator."""

from __future__ import annotations

from typing import Any

import numpy as np

from embodied.core.env import BatchedEnv
from embodied.core.errors import ConfigError
from embodied.core.operator import SCRIPTED, OperatorConfig
from embodied.core.types import Observation
from embodied.robots.teleop import OracleRule
from embodied.runs.loading import load_run_policy, numpy_infer

OFF_POLICY_ALGOS = ("sac_rlpd", "dsrl")


class SimOperator:
    """`cfg.policy` a trained run (its policy reads what the learning policy reads), or
    SCRIPTED: the env's scripted expert, which reads the simulator's privileged state, as a
    person reads the scene; the operator for a policy that learns from pixels."""

    def __init__(self, cfg: OperatorConfig, num_envs: int, chunk_size: int, env: BatchedEnv | None = None):
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
        self.rule = OracleRule(cfg.threshold, cfg.patience, cfg.release, envs=num_envs, max_takeover=cfg.max_takeover)
        self.chunk_size = chunk_size

    def apply(self, observation: Observation, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The actions to execute (B, C, A) and which envs the operator drove (B,)."""
        operated = np.asarray(self.infer(observation), dtype=np.float32)
        if operated.shape[1] < self.chunk_size or operated.shape[2] != actions.shape[2]:
            raise ConfigError(f"the operator acts in chunks of {operated.shape[1:]}, the policy in {actions.shape[1:]}")
        operated = operated[:, : self.chunk_size]
        intervened = self.rule.step(actions[:, 0], operated[:, 0])
        return np.where(intervened[:, None, None], operated, actions), intervened

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
