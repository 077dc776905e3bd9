"""`runtime=procs`: one process per role on one machine, over ZeroMQ, from the same Hydra
config as `runtime=local`.

    learner (this process) --weights PUB-->  rollout process(es)  <--ROUTER/DEALER-->  env workers
                           <--trajectories--

The learner starts the rollout processes (`runtime.num_rollouts`, each with its share of the
envs and env workers, see `rollout.env_share`) and supervises them: a rollout that dies or
goes silent is restarted. Every update learns from one trajectory of each rollout, joined
along the env axis: the batch one rollout with all the envs would collect. A learner killed
and resumed with `resume=<run dir>` finds the rollouts still running, binds the same
endpoints and takes up the link where its checkpoint left off (see `learner_link` for the
delivery marks)."""

from __future__ import annotations

import collections
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from embodied.algos.buffers import concat_envs
from embodied.build import build_algo, build_policy, resolve_device
from embodied.config import TrainConfig
from embodied.core.errors import ConfigError
from embodied.core.policy import Policy
from embodied.core.protocol import PROTOCOL_VERSION
from embodied.core.types import EnvSpec, EpisodeStats
from embodied.eval.periodic import PeriodicEvaluation
from embodied.runtime.configs import ProcsRuntimeConfig
from embodied.runtime.learner import Learner
from embodied.runtime.learner_link import Delivery, LearnerLink, LinkError
from embodied.runtime.learner_ranks import LearnerRanks, RankProcesses, check_learner_ranks
from embodied.runtime.process import start_process
from embodied.runtime.rollout import check_pipeline_stages, env_share
from embodied.runtime.rollout_process import STACK_DUMP_SIGNAL, rollout_name
from embodied.runtime.session import TrainSession
from embodied.runtime.wire import tensors_to_wire, trajectory_from_wire

logger = logging.getLogger(__name__)

PLACEMENTS = ("disaggregated", "collocated")


def check_config(cfg: ProcsRuntimeConfig) -> None:
    if cfg.pipeline:
        check_pipeline_stages(cfg.pipeline_stages)
    if cfg.learner_ranks < 1:
        raise ConfigError(f"runtime.learner_ranks must be >= 1, got {cfg.learner_ranks}")
    if cfg.num_rollouts < 1:
        raise ConfigError(f"runtime.num_rollouts must be >= 1, got {cfg.num_rollouts}")
    if cfg.placement not in PLACEMENTS:
        raise ConfigError(f"runtime.placement must be one of {PLACEMENTS}, got '{cfg.placement}'")
    if cfg.placement == "collocated" and cfg.max_policy_lag:
        raise ConfigError(
            "runtime.placement=collocated takes turns on one device: the rollout waits for each "
            "update, so set runtime.max_policy_lag=0"
        )
    if cfg.placement == "collocated" and cfg.learner_sharding == "fsdp":
        raise ConfigError(
            "runtime.placement=collocated offloads a whole policy; with runtime.learner_sharding=fsdp "
            "use runtime.placement=disaggregated"
        )
    if cfg.max_policy_lag < 0:
        raise ConfigError(f"runtime.max_policy_lag must be >= 0, got {cfg.max_policy_lag}")
    for key in ("heartbeat_s", "peer_timeout_s", "reconnect_timeout_s", "startup_timeout_s"):
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"runtime.{key} must be > 0, got {getattr(cfg, key)}")
    if cfg.peer_timeout_s <= 2 * cfg.heartbeat_s:
        raise ConfigError(
            f"runtime.peer_timeout_s ({cfg.peer_timeout_s}) must exceed two heartbeats "
            f"(runtime.heartbeat_s={cfg.heartbeat_s})"
        )


def check_rollouts(config: TrainConfig, num_rollouts: int) -> None:
    """Every rollout needs envs (whole groups, for GRPO) and, where envs run in workers, a worker."""
    group_size = getattr(config.algo, "group_size", 0)
    unit = max(group_size, 1)
    if config.env.num_envs // unit < num_rollouts:
        whole = f" (in whole groups of algo.group_size={group_size})" if group_size else ""
        raise ConfigError(
            f"env.num_envs={config.env.num_envs} cannot give each of runtime.num_rollouts="
            f"{num_rollouts} rollouts an env{whole}"
        )
    workers = getattr(config.env, "num_workers", 0)
    if 0 < workers < num_rollouts:
        raise ConfigError(
            f"env.num_workers={workers} cannot give each of runtime.num_rollouts={num_rollouts} "
            f"rollouts an env worker: set env.num_workers to 0 or at least {num_rollouts}"
        )
    if num_rollouts > 1:
        for index in range(num_rollouts):
            env_ids, _ = env_share(config.env.num_envs, workers, num_rollouts, index, group_size)
            logger.info("%s: envs %d-%d", rollout_name(index), env_ids[0], env_ids[-1])


class ProcsState:
    """`<run dir>/procs.json`: the endpoints the learner bound and each rollout's pid, so a
    learner resumed after a crash finds the rollouts still running."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> dict[str, Any]:
        if not self.path.is_file():
            return {}
        state = json.loads(self.path.read_text())
        if "rollout_pid" in state:  # written before several rollouts: one, rollout-0
            state["rollouts"] = {rollout_name(0): state.pop("rollout_pid")}
        return state

    def record(self, name: str, pid: int, endpoints: dict[str, str]) -> None:
        state = self.read()
        state.update(endpoints)
        state["rollouts"] = {**state.get("rollouts", {}), name: pid}
        partial = self.path.with_suffix(".json.partial")
        partial.write_text(json.dumps(state))
        partial.replace(self.path)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z")


class RolloutSupervisor:
    """Starts rollout process `index`, adopts the one a crashed learner of the same run left
    running, and restarts it when it dies or stops answering."""

    def __init__(self, run_dir: Path, cfg: ProcsRuntimeConfig, index: int = 0):
        self.cfg = cfg
        self.index = index
        self.name = rollout_name(index)
        self.config_path = run_dir / "config.yaml"
        self.state = ProcsState(run_dir / "procs.json")
        self.log_path = run_dir / "logs" / f"{self.name}.log"
        self.process: subprocess.Popen | None = None
        self.pid: int | None = None
        self.started_at = time.monotonic()
        self.restarts = 0
        self.failures_in_a_row = 0
        self.endpoints: dict[str, str] | None = None

    def previous(self) -> dict[str, Any] | None:
        """The endpoints and pid of this rollout as a previous learner of this run started
        it, if it still runs."""
        state = self.state.read()
        pid = state.get("rollouts", {}).get(self.name)
        if pid is None:
            return None
        cmdline = Path(f"/proc/{pid}/cmdline")
        ours = not cmdline.is_file() or str(self.config_path).encode() in cmdline.read_bytes()
        return {**state, "pid": int(pid)} if _process_alive(int(pid)) and ours else None

    def adopt(self, state: dict[str, Any], endpoints: dict[str, str]) -> None:
        self.pid = int(state["pid"])
        self.endpoints = endpoints
        self.started_at = time.monotonic()
        logger.info("%s (pid %d) from before is still running; waiting for it to reconnect", self.name, self.pid)

    def start(self, endpoints: dict[str, str]) -> None:
        self.endpoints = endpoints
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "embodied.runtime.rollout_process",
            "--config",
            str(self.config_path),
            "--trajectory-endpoint",
            endpoints["trajectory"],
            "--weights-endpoint",
            endpoints["weights"],
            "--index",
            str(self.index),
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Ctrl-C stops the learner, which then tells the
                # rollout to finish, rather than killing it mid-batch.
                start_new_session=True,
            )
        self.pid = self.process.pid
        self.started_at = time.monotonic()
        self.state.record(self.name, self.pid, endpoints)

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self.pid is not None and _process_alive(self.pid)

    def dump_stacks(self) -> bool:
        """Ask the rollout to write its threads' stacks to its log (it registers SIGUSR2)."""
        try:
            os.kill(self.pid, STACK_DUMP_SIGNAL)
        except (ProcessLookupError, PermissionError, TypeError):  # gone, or the pid now someone else's
            return False
        time.sleep(1.0)  # faulthandler writes from a signal handler; give it a moment
        return True

    def report_stuck(self, timeout_s: float) -> None:
        """Before a rollout that will not exit is killed: say so, with where it is stuck."""
        dumped = self.dump_stacks()
        logger.warning(
            "%s (pid %s) did not exit within %.0f s; killing it. %sIts log (%s) ends:\n%s",
            self.name,
            self.pid,
            timeout_s,
            "Its stacks are in its log. " if dumped else "",
            self.log_path,
            self.log_tail(60 if dumped else 20),
        )

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path.is_file():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def check(self, last_heard: float | None) -> None:
        """Restart a rollout that died or went silent: silent for `peer_timeout_s` once it has
        spoken, for `startup_timeout_s` while it builds its envs."""
        if last_heard is not None and last_heard > self.started_at:
            silent = time.monotonic() - last_heard > self.cfg.peer_timeout_s
        else:
            silent = time.monotonic() - self.started_at > self.cfg.startup_timeout_s
        if self.alive() and not silent:
            return
        reason = "stopped answering" if self.alive() else "exited"
        self.failures_in_a_row += 1
        if self.failures_in_a_row > self.cfg.max_rollout_restarts:
            raise LinkError(
                f"the rollout process {self.name} {reason} {self.failures_in_a_row} times in a row; "
                f"its log ({self.log_path}) ends:\n{self.log_tail()}"
            )
        logger.warning("%s (pid %s) %s; restarting it. Log tail:\n%s", self.name, self.pid, reason, self.log_tail(5))
        self.stop(timeout_s=5.0)
        self.restarts += 1
        assert self.endpoints is not None
        self.start(self.endpoints)

    def progressed(self) -> None:
        self.failures_in_a_row = 0

    def stop(self, timeout_s: float = 30.0) -> None:
        """Wait for the rollout to exit (the learner has told it to), else kill it."""
        if self.pid is None:
            return
        deadline = time.monotonic() + timeout_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():
            self.report_stuck(timeout_s)
            try:  # the rollout leads its own process group, its env workers included
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process is not None:
            self.process.wait()


class ProcsRuntime:
    supervisor_class = RolloutSupervisor  # what starts and restarts a rollout

    def __init__(self, cfg: ProcsRuntimeConfig):
        check_config(cfg)
        self.cfg = cfg

    def train(self, config: TrainConfig) -> TrainSession:
        cfg = self.cfg
        check_learner_ranks(config, cfg.learner_ranks, cfg.learner_sharding)
        check_rollouts(config, cfg.num_rollouts)
        start_process(config.seed, cfg.torch_threads)
        device = resolve_device(cfg.device)

        session = TrainSession(config)
        saved_state = session.saved_state()
        saved = saved_state[1] if saved_state else {}
        procs_state = saved.get("procs") or {}
        expected = {
            "protocol": PROTOCOL_VERSION,
            "run": str(session.run_dir.resolve()),
            "policy": config.policy.name,
            "chunk_size": config.policy.chunk_size,
        }
        spec = saved.get("spec", procs_state.get("spec"))  # older checkpoints kept it under "procs"
        if spec is not None:
            expected["spec"] = spec
        supervisors = [self.supervisor_class(session.run_dir, cfg, index) for index in range(cfg.num_rollouts)]
        previous = [supervisor.previous() if saved_state else None for supervisor in supervisors]
        found = next((state for state in previous if state), None)
        endpoints = (
            {"trajectory": found["trajectory"], "weights": found["weights"]}
            if found
            else {"trajectory": cfg.trajectory_endpoint, "weights": cfg.weights_endpoint}
        )
        try:
            link = LearnerLink(
                endpoints["trajectory"],
                endpoints["weights"],
                expected,
                delivered=procs_state.get("delivery"),
                policy_version=int(saved["learner"]["policy_version"]) if saved else 0,
                keys_dir=cfg.keys_dir,
                heartbeat_s=cfg.heartbeat_s,
            )
        except BaseException:
            session.close()
            raise
        endpoints = {"trajectory": link.trajectory_endpoint, "weights": link.weights_endpoint}
        finished = False
        try:
            for supervisor, state in zip(supervisors, previous):
                if state:
                    supervisor.adopt(state, endpoints)
                else:
                    supervisor.start(endpoints)
            hello = self._wait_hello(link, supervisors)
            self._loop(config, session, link, supervisors, hello, procs_state, device)
            finished = True
        finally:
            try:
                session.close()
            finally:
                link.close(tell_rollouts=True)
                for supervisor in supervisors:
                    supervisor.stop(timeout_s=30.0 if finished else 10.0)
        return session

    def _loop(
        self,
        config: TrainConfig,
        session: TrainSession,
        link: LearnerLink,
        supervisors: list[RolloutSupervisor],
        hello: dict[str, Any],
        procs_state: dict[str, Any],
        device: torch.device,
    ) -> None:
        """Learn from trajectories as they arrive until the run has its env steps."""
        cfg = self.cfg
        spec = EnvSpec.from_dict(hello["spec"])
        learner = self._learner(config, spec, session, device)
        dropped = int(procs_state.get("stale_batches_dropped", 0))
        rounds = RolloutRounds(link, supervisors, cfg.heartbeat_s)
        collocated = cfg.placement == "collocated"
        durable = config.checkpoint_every == 0  # no checkpoint will hold what is consumed
        ranks: LearnerRanks | None = None
        evaluation = PeriodicEvaluation(config)
        finished = False
        try:
            ranks = self._start_ranks(session, hello, learner, device)
            if collocated:
                learner.collocate()
            self._publish_first(learner, link)
            session.start_logging()
            while not session.finished:
                deliveries = rounds.next()
                if deliveries is None:
                    continue
                batch = rounds.join(deliveries)
                bodies = [delivery.body for delivery in deliveries]
                lag = learner.policy_version - int(batch.policy_version.min())
                if lag > cfg.max_policy_lag:
                    dropped += 1
                    rounds.consumed(deliveries, learner.policy_version, durable=durable)
                    continue
                progress = session.env_steps / config.total_env_steps
                if ranks is not None:
                    ranks.before_update(batch, progress, off_policy=lag > 0)
                learner.offloader.reload()
                metrics = learner.update(batch, progress, off_policy=lag > 0)
                rounds.consumed(deliveries, learner.policy_version, durable=durable)
                weights = tensors_to_wire(learner.published())
                if not collocated:  # the rollout collects while this learner evaluates and saves
                    link.publish(learner.policy_version, weights)
                metrics.update(self._delivery_metrics(learner, bodies, supervisors, lag, dropped, device))
                self._record(session, bodies, metrics)
                if evaluation.due(session.iteration):
                    session.record_eval(evaluation.run(self._evaluation_policy(config, spec, learner, device)))
                if session.should_checkpoint(session.finished):
                    self._checkpoint(session, learner, ranks, link, hello, dropped)
                if collocated:  # the rollout gets the device, and then the weights, once this learner has left it
                    learner.offloader.offload()
                    link.publish(learner.policy_version, weights)
            finished = True
        finally:
            evaluation.close()
            if ranks is not None:
                ranks.stop(clean=finished)

    @staticmethod
    def _learner(config: TrainConfig, spec: EnvSpec, session: TrainSession, device: torch.device) -> Learner:
        """The learner, restored from the run's checkpoint where it resumes."""
        policy = build_policy(config.policy, spec, device)
        learner = Learner(policy, build_algo(config.algo, policy), device)
        session.restore(learner)
        learner.before_training()
        return learner

    @staticmethod
    def _publish_first(learner: Learner, link: LearnerLink) -> None:
        """The starting weights to the rollouts (collocated: the device is the rollout's until
        a batch arrives); a VLA at its published size moves gigabytes per update, so the first
        says how long that takes."""
        started = time.perf_counter()
        weights = tensors_to_wire(learner.published())
        learner.offloader.offload()
        link.publish(learner.policy_version, weights)
        logger.info(
            "weights: %.3g GB published in %.1f s",
            sum(a.nbytes for a in weights["arrays"].values()) / 1e9,
            time.perf_counter() - started,
        )

    @staticmethod
    def _record(session: TrainSession, bodies: list[dict[str, Any]], metrics: dict[str, float]) -> None:
        """The deliveries' env steps and episodes, and the update's metrics, in the run's log."""
        episodes = [EpisodeStats(**e) for body in bodies for e in body["episodes"]]
        session.record(sum(int(body["env_steps"]) for body in bodies), episodes, metrics)

    def _start_ranks(
        self, session: TrainSession, hello: dict[str, Any], learner: Learner, device: torch.device
    ) -> LearnerRanks | None:
        """The learner's other ranks, attached to it, where there are any."""
        if self.cfg.learner_ranks <= 1:
            return None
        ranks = LearnerRanks(
            self._rank_starter(session.run_dir),
            self.cfg.learner_ranks,
            hello["spec"],
            session.run_dir / "logs",
            device,
            self.cfg.learner_sharding,
        )
        ranks.attach(learner)
        return ranks

    @staticmethod
    def _checkpoint(
        session: TrainSession,
        learner: Learner,
        ranks: LearnerRanks | None,
        link: LearnerLink,
        hello: dict[str, Any],
        dropped: int,
    ) -> None:
        """A checkpoint with the link's delivery state, which the link then forgets up to."""
        if ranks is not None:
            ranks.before_checkpoint()
        state = link.delivery_state()
        procs = {"delivery": state, "stale_batches_dropped": dropped}
        session.save(learner, None, {"spec": hello["spec"], "procs": procs})
        link.checkpointed(state)

    def _delivery_metrics(
        self,
        learner: Learner,
        bodies: list[dict[str, Any]],
        supervisors: list[RolloutSupervisor],
        lag: int,
        dropped: int,
        device: torch.device,
    ) -> dict[str, float]:
        """What an update logs beside the algorithm's: policy lag, drops, restarts and resends,
        and where the device is shared, the time and bytes of offloading."""
        metrics = {
            "train/policy_version": learner.policy_version,
            "train/policy_lag": lag,
            "train/stale_batches_dropped": dropped,
            "train/env_worker_restarts": sum(int(body["env_restarts"]) for body in bodies),
            "train/rollout_restarts": sum(supervisor.restarts for supervisor in supervisors),
            "train/trajectories_resent": sum(int(body["resent"]) for body in bodies),
        }
        if self.cfg.placement == "collocated":
            metrics["train/offload_s"] = learner.offloader.seconds
            metrics["train/offload_gb"] = learner.offloader.bytes_moved / 1e9
            metrics["train/rollout_offload_s"] = sum(float(body.get("offload_s", 0.0)) for body in bodies)
        if device.type == "cuda":
            metrics["train/learner_peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        return metrics

    @staticmethod
    def _rank_starter(run_dir: Path) -> Any:
        """What starts learner ranks 1..N-1: processes on this machine."""
        return RankProcesses(run_dir / "config.yaml", run_dir / "logs")

    @staticmethod
    def _evaluation_policy(config: TrainConfig, spec: EnvSpec, learner: Learner, device: torch.device) -> Policy:
        """The policy periodic evaluation runs: the learner's own, or, where it is sharded (its
        forward passes are collectives the other ranks are not in), a whole copy with the
        weights rank 0 gathered last (held only while it evaluates)."""
        if learner.sharded_names is None:
            return learner.policy
        with torch.random.fork_rng(devices=[]):  # its random init leaves the run's random stream as it was
            copy = build_policy(config.policy, spec, device)
        copy.load_state_dict(learner.gathered_weights)
        return copy

    def _wait_hello(self, link: LearnerLink, supervisors: list[RolloutSupervisor]) -> dict[str, Any]:
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        while True:
            hello = link.wait_hello(timeout_s=1.0)
            if hello is not None:
                return hello
            for supervisor in supervisors:
                if not supervisor.alive() and supervisor.process is None:
                    # The rollout a crashed learner left behind gave up waiting just now: start anew.
                    logger.warning("%s from before has exited; starting a new one", supervisor.name)
                    supervisor.start(supervisor.endpoints)
                elif not supervisor.alive():
                    raise LinkError(
                        f"the rollout process {supervisor.name} exited before connecting; its log "
                        f"({supervisor.log_path}) ends:\n{supervisor.log_tail()}"
                    )
            if time.monotonic() > deadline:
                raise LinkError(
                    f"no rollout connected within runtime.startup_timeout_s="
                    f"{self.cfg.startup_timeout_s:.0f} s; the log of {supervisors[0].name} "
                    f"({supervisors[0].log_path}) ends:\n{supervisors[0].log_tail()}"
                )


class RolloutRounds:
    """The learner's intake from several rollouts: one trajectory of each per round, in
    rollout order, so every update sees every share of the envs once."""

    def __init__(self, link: LearnerLink, supervisors: list[RolloutSupervisor], heartbeat_s: float):
        self.link = link
        self.supervisors = {supervisor.name: supervisor for supervisor in supervisors}
        self.heartbeat_s = heartbeat_s
        self.waiting: dict[str, collections.deque[Delivery]] = {name: collections.deque() for name in self.supervisors}
        self.last_check = time.monotonic()

    def next(self) -> list[Delivery] | None:
        """The next round, or None after a heartbeat's wait without one."""
        delivery = self.link.next_trajectory(timeout_s=self.heartbeat_s)
        if delivery is not None:
            if delivery.sender not in self.waiting:
                raise LinkError(
                    f"a trajectory came from {delivery.sender}, which this run does not have "
                    f"(runtime.num_rollouts={len(self.supervisors)})"
                )
            self.waiting[delivery.sender].append(delivery)
            self.supervisors[delivery.sender].progressed()
        if delivery is None or time.monotonic() - self.last_check > self.heartbeat_s:
            # Only rollouts the round waits for: one that has sent may wait for weights, silently.
            self.last_check = time.monotonic()
            for name, queued in self.waiting.items():
                if not queued:
                    self.supervisors[name].check(self.link.last_heard(name))
        if all(self.waiting.values()):
            return [queued.popleft() for queued in self.waiting.values()]
        return None

    @staticmethod
    def join(deliveries: list[Delivery]) -> Any:
        """The round's trajectories as one batch, env rows in rollout order."""
        parts = []
        for delivery in deliveries:
            try:
                parts.append(trajectory_from_wire(delivery.body["trajectory"]))
            except (KeyError, TypeError, ValueError) as error:
                raise LinkError(f"malformed trajectory {delivery.seq} from {delivery.sender}: {error}") from None
        if len({part.reward.shape[0] for part in parts}) > 1:
            raise LinkError(
                "the rollouts sent trajectories of different lengths: "
                + ", ".join(f"{d.sender}: {p.reward.shape[0]} steps" for d, p in zip(deliveries, parts))
            )
        return parts[0] if len(parts) == 1 else concat_envs(parts)

    def consumed(self, deliveries: list[Delivery], policy_version: int, durable: bool) -> None:
        for delivery in deliveries:
            self.link.consumed(delivery, policy_version, durable=durable)
