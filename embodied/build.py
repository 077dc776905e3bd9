"""Builds components from validated configs through the registries."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Sequence

import torch

from embodied.core.env import BatchedEnv
from embodied.core.errors import ConfigError
from embodied.core.policy import Policy
from embodied.core.registry import ALGOS, ENVS, POLICIES
from embodied.core.types import EnvSpec

log = logging.getLogger(__name__)


def build_env(env_cfg: Any, seed: int, stream: int = 0, env_ids: Sequence[int] | None = None) -> BatchedEnv:
    """The config's envs, or only `env_ids` of them (a rollout's share when several run)."""
    started = time.perf_counter()
    env = ENVS.get(env_cfg.name).factory(env_cfg, seed, stream, env_ids)
    log.info("env %s: %d envs built in %.1f s", env_cfg.name, env.num_envs, time.perf_counter() - started)
    return env


def in_this_process(env_cfg: Any, **changes: Any) -> Any:
    """The env config with its envs in this process where they can live (an env that needs
    another interpreter keeps its `MIN_WORKERS`), plus `changes` to keys the config has."""
    names = {f.name for f in dataclasses.fields(env_cfg)}
    wanted = {"num_workers": getattr(env_cfg, "MIN_WORKERS", 0), **changes}
    return dataclasses.replace(env_cfg, **{k: v for k, v in wanted.items() if k in names})


def build_policy(policy_cfg: Any, spec: EnvSpec, device: torch.device) -> Policy:
    # timed: building a VLA at its published size is where a slow start usually goes
    started = time.perf_counter()
    policy = POLICIES.get(policy_cfg.name).factory(policy_cfg, spec)
    built = time.perf_counter()
    policy = policy.to(device)
    log.info(
        "policy %s: %.3gM parameters built in %.1f s, moved to %s in %.1f s",
        policy_cfg.name,
        sum(p.numel() for p in policy.parameters()) / 1e6,
        built - started,
        device,
        time.perf_counter() - built,
    )
    return policy


def build_algo(algo_cfg: Any, policy: Policy) -> Any:
    if getattr(policy, "discrete_gripper", False) and algo_cfg.name != "sac_rlpd":
        raise ConfigError(
            f"algo '{algo_cfg.name}' cannot train policy.gripper_commands: the gripper acts by Q-values that only "
            "algo=sac_rlpd learns"
        )
    return ALGOS.get(algo_cfg.name).factory(algo_cfg, policy)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
