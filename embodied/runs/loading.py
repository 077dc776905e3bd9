"""A run's policy, loaded again: the one way every verb does it. `embodied eval`, `embodied
serve`, a new run's `init=` (RL or SFT), the operator in training (`operator.policy`) and the
oracle teleop (`teleop.operator.policy`) all call `load_run_policy`. `eval` and `serve` also take
a published model as it is, without a run around it (`load_pretrained_policy`); both reach
either through `policy_source`."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from embodied.build import build_env, build_policy
from embodied.config import TrainConfig, checkpoint_config
from embodied.core.errors import ConfigError
from embodied.core.policy import Policy
from embodied.core.types import ChunkPrefix, EnvSpec, Observation
from embodied.runs.checkpoint import (
    load_checkpoint,
    load_checkpoint_state,
    load_policy_weights,
    resolve_checkpoint,
    run_dir_of,
)

logger = logging.getLogger(__name__)


@dataclass
class RunPolicy:
    policy: Policy
    spec: EnvSpec  # what the policy was built for
    config: Any  # the run's config (a training or an SFT run's)
    checkpoint: Path  # the checkpoint directory the weights came from
    state: dict[str, Any]  # the checkpoint's saved state (policy_version, env_steps, ...)

    @property
    def policy_version(self) -> int:
        return int(self.state.get("learner", {}).get("policy_version", 0))


def load_run_policy(
    source: str | Path,
    spec: EnvSpec | None = None,
    device: str | torch.device = "cpu",
    into: Policy | None = None,
    label: str = "",
) -> RunPolicy:
    """The policy of a run directory (its latest checkpoint) or a checkpoint directory.

    Built from the run's own policy config for `spec` (default: the spec the checkpoint
    recorded) on `device`, in eval mode. With `into` (a new run's policy, built from its own
    config: `init=`), the weights go into that policy instead, and a value function of another
    shape starts fresh, since SFT does not train it and RL may ask for another one. Weights
    that do not fit are a ConfigError naming `label` (what they were meant for)."""
    checkpoint = resolve_checkpoint(source)
    config = checkpoint_config(checkpoint)
    weights, state = load_checkpoint(checkpoint)
    if into is not None:
        _load_keeping_a_fresh_value_function(into, weights, state, f"init={source}", label or "this run's policy")
        return RunPolicy(into, into.spec, config, checkpoint, state)
    if spec is None:
        spec = _recorded_spec(state, config)
    policy = build_policy(config.policy, spec, torch.device(device))
    try:
        load_policy_weights(policy, weights, state)
    except RuntimeError as error:
        fits = label or f"its own policy config ({config.policy.name})"
        raise ConfigError(f"{checkpoint}: its policy does not fit {fits}: {error}") from None
    return RunPolicy(policy.eval(), spec, config, checkpoint, state)


def load_pretrained_policy(policy_cfg: Any, spec: EnvSpec, device: str | torch.device = "cpu") -> RunPolicy:
    """A published model (`policy.pretrained`) as it is, for `spec`, in eval mode: the
    statistics, inputs and weights are the checkpoint's own; its version is 0."""
    policy = build_policy(policy_cfg, spec, torch.device(device))
    return RunPolicy(policy.eval(), spec, TrainConfig(policy=policy_cfg), Path(_pretrained(policy_cfg)), {})


def _pretrained(policy_cfg: Any) -> str:
    pretrained = getattr(policy_cfg, "pretrained", "")
    if not pretrained:
        raise ConfigError(
            f"policy={policy_cfg.name} without policy.pretrained has random weights: give checkpoint=<run dir> "
            f"or policy.pretrained=<a published model's folder>"
        )
    return pretrained


@dataclass
class PolicySource:
    """Where `eval` and `serve` take their policy from: a run's checkpoint or a published model."""

    name: str  # the checkpoint or model folder, for reports
    default_output: Path  # where reports go unless `output=` says otherwise
    trained_env: Any  # the env config it was trained on, where a run recorded it
    state: dict[str, Any]  # the checkpoint's saved state ({} for a published model)
    load: Callable[[EnvSpec, str], RunPolicy]  # (the env's spec, a label for errors) -> the policy


def policy_source(checkpoint: str | None, policy_cfg: Any, device: str | torch.device = "cpu") -> PolicySource:
    """`checkpoint=<run>` or `policy=<name> policy.pretrained=<folder>`: exactly one."""
    if checkpoint and policy_cfg is not None:
        raise ConfigError("give checkpoint=<run dir> or policy=<name> policy.pretrained=<folder>, not both")
    if policy_cfg is not None:
        name = _pretrained(policy_cfg)
        return PolicySource(
            name=name,
            default_output=Path("runs") / f"eval-{policy_cfg.name}-{Path(name).name}",
            trained_env=None,
            state={},
            load=lambda spec, label: load_pretrained_policy(policy_cfg, spec, device),
        )
    if not checkpoint:
        raise ConfigError("needs checkpoint=<run dir or checkpoint dir> or policy=<name> policy.pretrained=<folder>")
    resolved = resolve_checkpoint(checkpoint)
    return PolicySource(
        name=str(resolved),
        default_output=run_dir_of(resolved) / "eval",
        trained_env=checkpoint_config(resolved).env,
        state=load_checkpoint_state(resolved),
        load=lambda spec, label: load_run_policy(resolved, spec=spec, device=device, label=label),
    )


def _recorded_spec(state: dict[str, Any], config: Any) -> EnvSpec:
    if "spec" in state:
        return EnvSpec.from_dict(state["spec"])
    logger.info("the checkpoint does not record its env spec; reading it from env '%s'", config.env.name)
    return env_spec(config.env)  # checkpoints written before the spec was stored


def env_spec(env_cfg: Any) -> EnvSpec:
    """The spec of `env_cfg`'s env, read from one built briefly (with one env where the
    config says how many: the spec does not depend on it)."""
    if hasattr(env_cfg, "num_envs"):
        env_cfg = dataclasses.replace(env_cfg, num_envs=1)
    env = build_env(env_cfg, seed=0, stream=1)
    try:
        return env.spec
    finally:
        env.close()


def _load_keeping_a_fresh_value_function(
    policy: Policy, weights: dict[str, torch.Tensor], state: dict[str, Any], origin: str, label: str
) -> None:
    try:
        try:
            load_policy_weights(policy, weights, state)
        except RuntimeError:
            value_ids = {id(p) for p in policy.value_parameters()}
            value_modules = {name.split(".")[0] for name, p in policy.named_parameters() if id(p) in value_ids}
            fresh = value_modules | policy.new_modules()
            in_fresh = lambda key: key.split(".")[0] in fresh  # noqa: E731
            load_policy_weights(policy, {k: v for k, v in weights.items() if not in_fresh(k)}, state, may_miss=in_fresh)
            logger.info(
                "%s: %s start fresh: this policy has them, of another shape or not at all",
                origin,
                ", ".join(sorted(fresh)),
            )
    except RuntimeError as error:
        raise ConfigError(f"{origin}: its weights do not fit {label}: {error}") from None


def numpy_infer(run: RunPolicy, deterministic: bool = True, seed: int = 0) -> Callable[..., np.ndarray]:
    """`run`'s policy as `infer(observation, prefix=None) -> actions (B, C, A)` on numpy
    observations (`prefix`: real-time chunking's pending actions, for a policy that
    `accepts_prefix`), drawing from a generator of its own (`seed`) where it samples. Each action is clipped to
    the env's bounds, as the env clipped it before executing it in training: what a robot or
    an env is sent is what the policy was trained to do, and a robot's safety layer counts
    only real anomalies."""
    policy = run.policy
    low = np.asarray(run.spec.action_low, dtype=np.float32)
    high = np.asarray(run.spec.action_high, dtype=np.float32)
    generator = torch.Generator(device=policy.device)
    generator.manual_seed(seed)

    @torch.no_grad()
    def infer(observation: Observation, prefix: ChunkPrefix | None = None) -> np.ndarray:
        # only a policy that accepts_prefix takes the keyword
        guided = {} if prefix is None else {"prefix": prefix}
        chunk = policy.act(
            observation.to_torch(policy.device), deterministic=deterministic, generator=generator, **guided
        )
        return np.clip(chunk.actions.float().cpu().numpy(), low, high)

    return infer
