"""`runtime=ray`: the roles of `runtime=procs`, placed by Ray on one machine or a cluster.

    learner (the driver) --weights-->  rollout actor(s)  <--ZeroMQ-->  env worker actors
                         <--trajectories--

Ray only places and supervises: each role runs the same code as under `runtime=procs` and
the roles talk over the same ZeroMQ links, whose tcp endpoints reach the actors as arguments.
Actors ask for the CPUs, GPUs and custom resources in `runtime.rollout` (each of the
`runtime.num_rollouts`) and `runtime.env_worker` (a custom resource such as `{sim_node: 1}`
pins a role to the nodes that offer it). An env worker actor that dies is replaced by the
rollout like a dead env worker process; a rollout actor that dies or goes silent is restarted
by the learner; the learner (the driver) stops with its checkpoints in place, and
`resume=<run dir>` continues the run on new actors."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from embodied.config import TrainConfig
from embodied.core.errors import ConfigError
from embodied.runtime.configs import RayRuntimeConfig
from embodied.runtime.procs import ProcsRuntime, RolloutSupervisor, check_config
from embodied.runtime.ray_actors import LOOPBACK_HOSTS, EnvWorkerRole, Role, RoleResources, start_actor
from embodied.runtime.session import TrainSession

logger = logging.getLogger(__name__)


def log_to(log_path: str) -> None:
    """An actor's log in the run directory, where this node has it (the same machine, or a
    shared run directory)."""
    if Path(log_path).parent.is_dir():
        logging.basicConfig(
            filename=log_path,
            level=logging.INFO,
            force=True,
            format="%(asctime)s %(name)s %(levelname)s: %(message)s",
        )


class RolloutRole(Role):
    """Ray actor body: the rollout role, whose env workers become actors too."""

    def serve(
        self,
        config_path: str,
        endpoints: dict[str, str],
        index: int,
        env_worker: dict[str, Any],
        host: str,
        keys_dir: Optional[str],
        log_path: str,
        startup_timeout_s: float,
    ) -> int:
        import ray

        import embodied.sim.remote
        from embodied.runtime.rollout_process import serve_rollout

        log_to(log_path)
        # The env hub lives here: on a cluster it binds on this actor's node, wherever Ray put it.
        hub_host = host if host in LOOPBACK_HOSTS else ray.util.get_node_ip_address()
        embodied.sim.remote.PLACEMENT = embodied.sim.remote.WorkerPlacement(
            launch=lambda worker_id, arguments: start_actor(
                EnvWorkerRole, RoleResources(**env_worker), startup_timeout_s, arguments
            ),
            host=hub_host,
            keys_dir=keys_dir,
        )
        return serve_rollout(Path(config_path), endpoints["trajectory"], endpoints["weights"], index)


class LearnerRankRole(Role):
    """Ray actor body: learner rank r (`learner_ranks.follow`), on whichever node Ray placed
    it and on the GPU Ray gave it (its first visible one)."""

    def serve(self, config_yaml: str, rank: int, world: int, address: str, spec: dict[str, Any], log_path: str) -> int:
        from omegaconf import OmegaConf

        from embodied.build import resolve_device
        from embodied.config import TrainConfig, to_schema
        from embodied.runtime.learner_ranks import follow, rank_device

        log_to(log_path)
        config = to_schema(TrainConfig, OmegaConf.create(config_yaml))  # the run's file may not be on this node
        follow(config, rank, world, address, spec, rank_device(resolve_device(config.runtime.device), 0, 1))
        return 0


class RankActors:
    """Starts learner ranks 1..N-1 as Ray actors asking for `runtime.learner_rank`: on other
    nodes too, so the process group is served on `runtime.host`."""

    devices_here = False  # each actor has its own GPU, wherever it runs

    def __init__(self, cfg: "RayRuntimeConfig", run_dir: Path):
        self.cfg = cfg
        self.host = cfg.host
        self.config_yaml = (run_dir / "config.yaml").read_text()
        self.log_dir = run_dir.resolve() / "logs"

    def start(self, rank: int, world: int, address: str, spec: dict[str, Any]) -> Any:
        return start_actor(
            LearnerRankRole,
            self.cfg.learner_rank,
            self.cfg.startup_timeout_s,
            self.config_yaml,
            rank,
            world,
            address,
            spec,
            str(self.log_dir / f"learner-rank-{rank}.log"),
        )


class RaySupervisor(RolloutSupervisor):
    """A rollout as a Ray actor, supervised like a rollout process of `runtime=procs`."""

    def previous(self) -> dict[str, Any] | None:
        return None  # actors end with their driver: a resumed run starts a new rollout

    def start(self, endpoints: dict[str, str]) -> None:
        cfg = self.cfg
        assert isinstance(cfg, RayRuntimeConfig)
        self.endpoints = endpoints
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Actors run elsewhere (another directory, another node): every path goes absolute.
        keys_dir = str(Path(cfg.keys_dir).expanduser().resolve()) if cfg.keys_dir else None
        self.process = start_actor(
            RolloutRole,
            cfg.rollout,
            cfg.startup_timeout_s,
            str(self.config_path.resolve()),
            endpoints,
            self.index,
            dataclasses.asdict(cfg.env_worker),
            cfg.host,
            keys_dir,
            str(self.log_path.resolve()),
            cfg.startup_timeout_s,
        )
        self.pid = self.process.pid
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def dump_stacks(self) -> bool:
        # Only where the pid is this machine's: on another node it names another process.
        return self.process is not None and self.process.on_this_node() and super().dump_stacks()

    def log_tail(self, lines: int = 20) -> str:
        ended = getattr(self.process, "error", "")
        return super().log_tail(lines) + (f"\nthe rollout actor ended with {ended}" if ended else "")

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.report_stuck(timeout_s)
            self.process.kill()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                logger.warning("the rollout actor did not stop within 10 s of being killed")


class RayRuntime(ProcsRuntime):
    supervisor_class = RaySupervisor

    def __init__(self, cfg: RayRuntimeConfig):
        check_config(cfg)
        self.cfg = cfg

    def _rank_starter(self, run_dir: Path) -> RankActors:
        assert isinstance(self.cfg, RayRuntimeConfig)
        return RankActors(self.cfg, run_dir)

    def train(self, config: TrainConfig) -> TrainSession:
        try:
            import ray
        except ImportError:
            raise ConfigError("runtime=ray needs Ray: pip install 'embodied-rl[ray]'") from None
        cfg = self.cfg
        assert isinstance(cfg, RayRuntimeConfig)
        if getattr(config.env, "num_workers", 0) and getattr(config.env, "transport", "zmq") != "zmq":
            # Ray places env workers as actors that reach the rollout over ZeroMQ.
            config.env = dataclasses.replace(config.env, transport="zmq")
        started_here = not ray.is_initialized()
        if started_here:
            if cfg.address is None:  # "local": never join a cluster that happens to run here
                wanted = (
                    cfg.rollout.num_cpus * cfg.num_rollouts
                    + cfg.env_worker.num_cpus * max(getattr(config.env, "num_workers", 0), 1)
                    + cfg.learner_rank.num_cpus * (cfg.learner_ranks - 1)
                )
                num_cpus = cfg.num_cpus or max(math.ceil(wanted), os.cpu_count() or 1)
                # Ray starts its workers at nice 15 by default: on a busy machine the actors (the
                # rollout and env workers, the run's critical path) would then wait behind every
                # other process, the learner included (189 s against 11 s to import torch and
                # build an env on two busy cores). Actors run at the driver's priority instead.
                ray.init(
                    address="local",
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    log_to_driver=False,
                    _system_config={"worker_niceness": 0},
                )
            else:
                ray.init(address=cfg.address, log_to_driver=False)
                nodes = [node for node in ray.nodes() if node.get("Alive")]
                if cfg.host in LOOPBACK_HOSTS and len(nodes) > 1:
                    ray.shutdown()
                    raise ConfigError(
                        f"the Ray cluster has {len(nodes)} nodes, but runtime.host={cfg.host} is "
                        f"reachable only from this one: set runtime.host to this node's address "
                        f"(and runtime.keys_dir)"
                    )
        try:
            return super().train(config)
        finally:
            if started_here:
                ray.shutdown()
