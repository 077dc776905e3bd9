"""`runtime=robots`: robot clients are the env side of online learning.

    embodied train runtime=robots env=<the robots' env> policy=squashed_gaussian algo=sac_rlpd
    embodied robot robot=... server=tcp://<this machine>:5555     # on each robot, any number

This process is a policy server (`embodied.runtime.policy_server.PolicyServer`) whose welcome says it learns.
Robots act through it as they would through `embodied serve`, with sampled actions (the
policy explores). Each finished episode comes back as an `episode` message (the executed
actions, the operator's corrections flagged) and goes into a queue; a learner thread takes
episodes one at a time and runs the algorithm's update on each, so the robots never wait for
learning. After every update the learner leaves its weights in a latest-only slot (a newer
one replaces one not yet used), and the server takes them up per `apply_weights`:

    episode     when an episode arrives (with one robot: between its episodes, so an episode
                is acted by one policy; with several, at the end of any robot's episode)
    immediate   before the next inference

Only off-policy learners fit: a robot's executed actions (corrected by an operator, clipped
by its safety layer) are not samples of the policy, which PPO's and GRPO's ratios assume.
`env` gives the spec the robots must match (they are refused otherwise) and, with
`eval_every`, a simulator for periodic evaluation. Checkpoints hold the learner and its
replay buffers; `resume=<run dir>` continues, and robots simply reconnect.

A policy that reads cameras (`policy=squashed_gaussian` with an rgb `env`) learns from
pixels: the welcome names its cameras (`policy_cameras`) and each episode carries their
frames like its states, one per acted tick and the one after the last action.

The reward is the one the robots report, or with `reward.classifier` a success classifier's
verdict (`embodied reward`): the welcome names the cameras it reads that the policy does not
(`outcome_cameras`), each episode carries what every acted tick led to on them, and the
learner thread rewards a tick 1 where the classifier's probability exceeds
`reward.threshold`, else 0, as `ClassifiedReward` does in simulation. Those cameras must be
in `env` (env.obs_mode=rgb)."""

from __future__ import annotations

import copy
import logging
import queue
import threading
from typing import Any, Optional

import numpy as np
import torch

from embodied.algos.buffers import Trajectory
from embodied.build import build_algo, build_env, build_policy, in_this_process, resolve_device
from embodied.config import RewardConfig, TrainConfig
from embodied.core.episodes import Episode, EpisodeNotTaken, episode_bytes, parse_episode
from embodied.core.errors import ConfigError
from embodied.core.policy import Policy
from embodied.core.types import EnvSpec, EpisodeStats, Observation
from embodied.eval.periodic import PeriodicEvaluation
from embodied.runtime.classified_reward import load_reward_classifier
from embodied.runtime.configs import RobotsRuntimeConfig
from embodied.runtime.learner import Learner
from embodied.runtime.policy_server import ClientState, PolicyServer, ServeConfig
from embodied.runtime.process import start_process
from embodied.runtime.session import TrainSession
from embodied.runtime.wire import load_published_weights, published_weights

logger = logging.getLogger(__name__)

APPLY_WEIGHTS = ("episode", "immediate")
OFF_POLICY_ALGOS = ("sac_rlpd",)


def check_config(cfg: RobotsRuntimeConfig, config: TrainConfig) -> None:
    if cfg.apply_weights not in APPLY_WEIGHTS:
        raise ConfigError(f"runtime.apply_weights must be one of {APPLY_WEIGHTS}, got '{cfg.apply_weights}'")
    if config.algo.name not in OFF_POLICY_ALGOS:
        raise ConfigError(
            f"runtime=robots learns off-policy from what the robots executed (operator corrections and "
            f"safety clipping included), which algo '{config.algo.name}' cannot: its ratios need the "
            f"policy's own samples. Use algo={' or algo='.join(OFF_POLICY_ALGOS)}"
        )
    for key in ("max_queued_episodes", "max_episode_ticks", "max_clients"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"runtime.{key} must be >= 1, got {getattr(cfg, key)}")


def episode_trajectory(episode: Episode, policy_version: int) -> Trajectory:
    """One env (B = 1), one executed action per step (C = 1)."""
    ticks = episode.length
    column = lambda array: torch.as_tensor(np.asarray(array))[:, None]  # noqa: E731  (T,) -> (T, 1)
    last = torch.zeros(ticks, dtype=torch.bool)
    terminated, truncated = last.clone(), last.clone()
    (terminated if episode.terminated else truncated)[-1] = True
    actions = torch.as_tensor(episode.actions)[:, None, None]  # (T, 1, 1, A)
    success = last.clone()
    success[-1] = episode.success
    zeros = torch.zeros(ticks, 1)
    frames = {camera: torch.as_tensor(images)[:, None] for camera, images in episode.images.items()}  # (T + 1, 1, ...)
    return Trajectory(
        observation=Observation(
            state=torch.as_tensor(episode.states[:-1])[:, None],
            images={camera: images[:-1] for camera, images in frames.items()},
            instruction=[episode.instruction],
        ),
        actions=actions,
        log_prob=zeros,
        value=zeros,
        reward=column(episode.rewards),
        terminated=terminated[:, None],
        truncated=truncated[:, None],
        bootstrap_value=zeros,
        success=success[:, None],
        executed_action=actions,
        executed_steps=torch.ones(ticks, 1, dtype=torch.int64),
        intervened=column(episode.intervened),
        policy_version=torch.full((ticks, 1), policy_version, dtype=torch.int64),
        last_value=torch.zeros(1),
        next_state=torch.as_tensor(episode.states[1:])[:, None],
        next_images={camera: images[1:] for camera, images in frames.items()},
    )


class LatestWeights:
    """A one-slot mailbox: the newest weights replace ones nobody took yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._weights: tuple[int, dict[str, torch.Tensor]] | None = None

    def put(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        with self._lock:
            self._weights = (version, weights)

    def take(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        with self._lock:
            weights, self._weights = self._weights, None
        return weights


class LearnerThread(threading.Thread):
    """Runs the algorithm's update on each queued episode, records, evaluates and checkpoints;
    every call into the session happens here, so nothing else touches it while it runs."""

    def __init__(
        self,
        session: TrainSession,
        learner: Learner,
        spec: EnvSpec,
        inbox: "queue.Queue[Episode]",
        latest: LatestWeights,
        reward: Optional[OutcomeReward] = None,
    ):
        super().__init__(name="learner", daemon=True)
        self.session, self.learner, self.spec, self.reward = session, learner, spec, reward
        self.inbox, self.latest = inbox, latest
        self.evaluation = PeriodicEvaluation(session.config)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.busy = False
        self.saved_iteration = session.iteration

    def run(self) -> None:
        """Until told to stop: once the run has its env steps, the serving thread waits for the
        episodes already taken to be learned from, then stops this."""
        try:
            while not self.stop.is_set():
                try:
                    episode = self.inbox.get(timeout=0.1)
                except queue.Empty:
                    continue
                self.busy = True
                self._learn(episode)
                self.busy = False
            if self.session.iteration != self.saved_iteration:
                self._save()  # the final state, or where an interrupted run resumes
        except BaseException as error:  # noqa: BLE001  (handed to the serving thread, which raises it)
            self.error = error
        finally:
            self.busy = False
            self.evaluation.close()

    def _learn(self, episode: Episode) -> None:
        session, learner = self.session, self.learner
        progress = session.env_steps / session.config.total_env_steps
        reported = float(episode.rewards.sum())
        if self.reward is not None:
            episode.rewards, episode.outcome_images = self.reward(episode), {}
        metrics = learner.update(episode_trajectory(episode, learner.policy_version), progress, off_policy=True)
        self.latest.put(learner.policy_version, published_weights(learner.policy))
        metrics["train/policy_version"] = learner.policy_version
        metrics["robots/queued_episodes"] = self.inbox.qsize()
        metrics["robots/episode_intervened"] = float(np.mean(episode.intervened))
        if self.reward is not None:
            metrics["robots/reported_return"] = reported  # the robot's own, beside the classifier's return
        stats = EpisodeStats(
            env_id=0,
            task=episode.instruction,
            episode_return=float(episode.rewards.sum()),
            length=episode.length,
            success=episode.success,
        )
        session.record(episode.length, [stats], metrics)
        if self.evaluation.due(session.iteration):
            session.record_eval(self.evaluation.run(learner.policy))
        if session.should_checkpoint(session.finished):
            self._save()

    def _save(self) -> None:
        self.session.save(self.learner, None, {"spec": self.spec.to_dict()})
        self.saved_iteration = self.session.iteration


class OutcomeReward:
    """The reward classifier's verdict on each acted tick's outcome images."""

    def __init__(self, cfg: RewardConfig, spec: EnvSpec):
        if not 0.0 <= cfg.threshold <= 1.0:
            raise ConfigError(f"reward.threshold must be in [0, 1], got {cfg.threshold}")
        self.model, self.threshold = load_reward_classifier(cfg.classifier), cfg.threshold
        missing = [camera for camera in self.model.cameras if camera not in spec.image_shapes]
        if missing:
            raise ConfigError(
                f"reward.classifier reads cameras {self.model.cameras}; env has "
                f"{sorted(spec.image_shapes) or 'none'} (the robots' cameras: use env.obs_mode=rgb)"
            )
        self.cameras = list(self.model.cameras)

    def __call__(self, episode: Episode, frames_per_pass: int = 256) -> np.ndarray:
        # what each tick led to: sent as outcome frames, or the policy's frames after the first
        outcomes = {
            c: episode.outcome_images[c] if c in episode.outcome_images else episode.images[c][1:] for c in self.cameras
        }
        probability = np.concatenate(
            [
                self.model.probability(
                    {
                        camera: torch.from_numpy(frames[start : start + frames_per_pass])
                        for camera, frames in outcomes.items()
                    }
                ).numpy()
                for start in range(0, episode.length, frames_per_pass)
            ]
        )
        return (probability > self.threshold).astype(np.float32)


class RobotGateway:
    """The server side the robots talk to: the acting copy of the policy (with the newest
    published weights, per `apply_weights`), and the intake that queues their episodes for the
    learner thread until the run has all its env steps."""

    def __init__(
        self,
        cfg: RobotsRuntimeConfig,
        config: TrainConfig,
        spec: EnvSpec,
        policy: Policy,
        env_steps: int,
        cameras: tuple[list[str], list[str]],
    ):
        self.cfg, self.spec, self.total_env_steps = cfg, spec, config.total_env_steps
        self.device = policy.device
        self.acting = copy.deepcopy(policy).eval()  # the robots' copy; the learner's moves under it
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.inbox: queue.Queue[Episode] = queue.Queue()
        self.latest = LatestWeights()
        self.received = env_steps  # transitions taken, learned from or queued
        self.outcome_cameras, self.policy_cameras = cameras
        self.server: Optional[PolicyServer] = None

    def serve(self, metadata: dict[str, Any]) -> PolicyServer:
        cfg = self.cfg
        serve_config = ServeConfig(
            endpoint=cfg.endpoint,
            keys_dir=cfg.keys_dir,
            max_clients=cfg.max_clients,
            batch_window_ms=cfg.batch_window_ms,
            client_timeout_s=cfg.client_timeout_s,
            deterministic=cfg.deterministic,
            stats_every_s=0,
        )
        size = episode_bytes(self.spec, cfg.max_episode_ticks, self.outcome_cameras, self.policy_cameras)
        self.server = PolicyServer(
            self.infer, self.spec, metadata, serve_config, on_episode=self.on_episode, max_message_bytes=size
        )
        return self.server

    @torch.no_grad()
    def infer(self, observation: Observation) -> np.ndarray:
        observation = observation.to_torch(self.device)
        chunk = self.acting.act(observation, deterministic=self.cfg.deterministic, generator=self.generator)
        return chunk.actions.float().cpu().numpy()

    def apply_latest(self) -> None:
        taken = self.latest.take()
        if taken is not None:
            version, weights = taken
            load_published_weights(self.acting, weights)
            self.server.metadata["policy_version"] = version

    def on_episode(self, client: ClientState, body: Any) -> dict[str, Any]:
        if self.received >= self.total_env_steps:
            raise EpisodeNotTaken(f"the run has all its {self.total_env_steps} env steps")
        if self.inbox.qsize() >= self.cfg.max_queued_episodes:
            raise EpisodeNotTaken(f"the learner is {self.inbox.qsize()} episodes behind")
        episode = parse_episode(body, self.spec, self.cfg.max_episode_ticks, self.outcome_cameras, self.policy_cameras)
        self.inbox.put(episode)
        self.received += episode.length
        if self.cfg.apply_weights == "episode":
            self.apply_latest()
        # `finished` tells the robot that the run needs no more episodes.
        return {
            "transitions": episode.length,
            "policy_version": self.server.metadata["policy_version"],
            "queued": self.inbox.qsize(),
            "finished": self.received >= self.total_env_steps,
        }


class RobotsRuntime:
    def __init__(self, cfg: RobotsRuntimeConfig):
        self.cfg = cfg

    def train(self, config: TrainConfig) -> TrainSession:
        cfg = self.cfg
        check_config(cfg, config)
        start_process(config.seed, cfg.torch_threads)
        device = resolve_device(cfg.device)
        # The env only gives the spec robots must match: one env in this process is enough.
        env = build_env(in_this_process(config.env, num_envs=1), seed=config.seed, stream=1)
        spec = env.spec
        env.close()
        reward = OutcomeReward(config.reward, spec) if config.reward.classifier else None
        session = TrainSession(config)
        policy = build_policy(config.policy, spec, device)
        # Episodes carry the frames the policy reads like its states, and the outcome frames of
        # the classifier's other cameras.
        policy_cameras = list(getattr(policy, "cameras", []))
        outcome_cameras = [c for c in reward.cameras if c not in policy_cameras] if reward is not None else []
        learner = Learner(policy, build_algo(config.algo, policy), device)
        if policy.chunk_size != 1:
            raise ConfigError("runtime=robots stores one executed action per tick: policy.chunk_size must be 1")
        session.restore(learner)
        learner.before_training()

        gateway = RobotGateway(cfg, config, spec, policy, session.env_steps, (outcome_cameras, policy_cameras))
        server = gateway.serve(
            {
                "policy": config.policy.name,
                "policy_version": learner.policy_version,
                "chunk_size": 1,
                "normalization_id": None,
                "deterministic": cfg.deterministic,
                "learning": True,
                "run": str(session.run_dir),
                "outcome_cameras": outcome_cameras,
                "policy_cameras": policy_cameras,
            }
        )
        print(
            f"learning from robots on {server.endpoint} (run {session.run_dir}); connect with "
            f"`embodied robot server={server.endpoint}`",
            flush=True,
        )
        session.start_logging()
        thread = LearnerThread(session, learner, spec, gateway.inbox, gateway.latest, reward)
        thread.start()
        try:
            while thread.is_alive():
                server.run_once(timeout_s=0.05)
                if cfg.apply_weights == "immediate":
                    gateway.apply_latest()
                if session.finished and gateway.inbox.empty() and not thread.busy:
                    thread.stop.set()
        finally:
            thread.stop.set()
            thread.join()
            server.close()
            session.close()
        if thread.error is not None:
            raise thread.error
        return session
