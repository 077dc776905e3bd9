"""The runtimes' config schemas and registry entries. A runtime is the application itself
(it runs training), so its entry names its class by import path: validating a config loads
the schemas here, not the runtimes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from embodied.core.registry import RUNTIMES
from embodied.runtime.ray_actors import RoleResources


@dataclass
class DeviceConfig:
    """Where `embodied serve` and `embodied sft` run their model, under `runtime.` as training's
    runtimes have it: `runtime.device=cuda` means the same to every verb."""

    device: str = "auto"  # auto | cpu | cuda | cuda:N
    torch_threads: Optional[int] = None  # None: torch's default


@dataclass
class LocalRuntimeConfig:
    name: str = "local"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    torch_threads: Optional[int] = None  # None: torch's default
    # Overlap policy inference for one stage of env workers with simulation in the others
    # (needs env.num_workers >= 2).
    pipeline: bool = False
    pipeline_stages: Union[int, str] = 2  # groups of env workers, each one inference per step; auto: the fastest, timed


@dataclass
class ProcsRuntimeConfig:
    name: str = "procs"
    device: str = "auto"  # the learner's: auto | cpu | cuda | cuda:N
    rollout_device: str = "auto"  # the rollout's policy inference
    torch_threads: Optional[int] = None  # per process; None: torch's default
    pipeline: bool = False  # overlap inference for one stage of env workers with simulation in others
    pipeline_stages: Union[int, str] = 2  # groups of env workers, each one inference per step; auto: the fastest, timed
    # 0: synchronous, every sample from the current policy. k > 0: the rollout keeps acting
    # with weights up to k updates old; older samples are dropped and counted, the rest are
    # corrected with their behaviour log-prob (decoupled PPO).
    max_policy_lag: int = 0
    trajectory_endpoint: str = "tcp://127.0.0.1:*"  # '*': a free port, recorded in the run dir
    weights_endpoint: str = "tcp://127.0.0.1:*"
    keys_dir: Optional[str] = None  # CURVE keys (`embodied keys <dir>`); needed off loopback
    heartbeat_s: float = 1.0
    peer_timeout_s: float = 30.0  # a peer silent this long is taken for dead
    reconnect_timeout_s: float = 120.0  # a rollout without a learner this long exits
    startup_timeout_s: float = 600.0  # for the rollout to build its envs and connect
    max_rollout_restarts: int = 3  # in a row without a batch in between
    # Rollout processes, each with a contiguous share of env.num_envs and env.num_workers (its
    # own policy copy, on runtime.rollout_device); every update learns from all of them.
    num_rollouts: int = 1
    # disaggregated: the roles keep their devices | collocated: the rollout and the learner
    # take turns on one device, the idle one's policy (and optimizer state) in CPU memory.
    placement: str = "disaggregated"
    # Data-parallel learner processes on this machine (gloo on CPU, nccl on GPUs), each
    # training on its shard of every minibatch; 1: the learner alone.
    learner_ranks: int = 1
    # How the ranks hold the policy: replicate (each all of it) | fsdp (each 1/N of the
    # parameters, gradients and optimizer state; FSDP2), for VLAs too large to replicate.
    learner_sharding: str = "replicate"


@dataclass
class RayRuntimeConfig(ProcsRuntimeConfig):
    name: str = "ray"
    address: Optional[str] = None  # null: start a Ray instance on this machine; "auto" or "<head>:6379": join
    num_cpus: Optional[int] = None  # a local instance's CPUs; default: what the roles ask for, at least the cores
    host: str = "127.0.0.1"  # where the learner and env hubs bind; on a cluster this node's address (+ keys_dir)
    rollout: RoleResources = field(default_factory=RoleResources)
    env_worker: RoleResources = field(default_factory=RoleResources)  # one actor per env worker (env.num_workers)
    learner_rank: RoleResources = field(default_factory=RoleResources)  # ranks 1..N-1 (runtime.learner_ranks)


@dataclass
class RobotsRuntimeConfig:
    name: str = "robots"
    device: str = "auto"  # the learner's (inference runs beside it)
    torch_threads: Optional[int] = None
    endpoint: str = "tcp://127.0.0.1:5555"  # where robots connect (off this machine: a public address + keys_dir)
    keys_dir: Optional[str] = None  # CURVE keys (`embodied keys <dir>`); required off loopback
    max_clients: int = 8
    batch_window_ms: float = 2.0
    client_timeout_s: float = 30.0
    apply_weights: str = "episode"  # episode | immediate
    deterministic: bool = False  # robots act on the policy's samples (exploration) or its mode
    max_queued_episodes: int = 64  # episodes waiting for the learner; beyond, robots are told to wait
    max_episode_ticks: int = 10_000  # the longest episode taken


RUNTIMES.add("local", LocalRuntimeConfig, "embodied.runtime.local:LocalRuntime")
RUNTIMES.add("procs", ProcsRuntimeConfig, "embodied.runtime.procs:ProcsRuntime")
RUNTIMES.add("ray", RayRuntimeConfig, "embodied.runtime.ray_runtime:RayRuntime")
RUNTIMES.add("robots", RobotsRuntimeConfig, "embodied.runtime.robot_learner:RobotsRuntime")
