"""The robot client: the env side of a real (or simulated) robot talking to a policy server.

Each control tick, at the configured rate:
  1. take in the server's answer, if one came (the chunk goes to the broker);
  2. send a new observation when the broker wants one and none is on its way;
  3. take the broker's action for this tick, waiting at most `latency_budget` of a tick for
     an answer that is on its way;
  4. pass it through the safety layer and send it; without one, the watchdog sends the safe
     action once `safety.watchdog_s` has passed without a valid action.
Each tick is logged to `steps.jsonl` (action source, jitter, round trip and server timing);
`summary.json` holds the run's statistics. Numpy and pyzmq only: no torch."""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from embodied.core.episodes import Episode
from embodied.core.errors import ConfigError
from embodied.robots.base import Robot, RobotObservation
from embodied.robots.broker import ChunkBroker, check_mode
from embodied.robots.policy_client import ActionReply, PolicyClient, ServerError
from embodied.robots.recording import DatasetRecorder, RecordingConfig, RecordingError
from embodied.robots.safety import SafetyConfig, SafetyLayer
from embodied.robots.teleop import Teleop, TeleopConfig

logger = logging.getLogger(__name__)

SAFETY_SOURCES = ("watchdog", "estop", "workspace", "non_finite")  # the safety layer's own actions


@dataclass
class BrokerConfig:
    mode: str = "chunk"  # chunk | ensemble (temporal ensembling)
    execute_steps: Optional[int] = None  # ask for the next chunk after this many; default: half a chunk (ensemble: 1)
    ensemble_decay: float = 0.01
    # real-time chunking (chunk mode, a server whose policy has it): each query carries the
    # current chunk's remaining actions and the expected delay in ticks (from recent round
    # trips), and the server samples the next chunk to agree with them
    realtime: bool = False


@dataclass
class RobotClientConfig:
    robot: Any = None  # the robot's config, chosen by its `name` (configs/robot/)
    server: str = "tcp://127.0.0.1:5555"
    keys_dir: Optional[str] = None  # CURVE keys (`embodied keys <dir>`); required off loopback
    client_name: str = "robot"
    episodes: int = 1
    max_episode_steps: Optional[int] = None  # default: the robot's own limit
    control_hz: Optional[float] = None  # default: the robot's control rate
    seed: int = 0  # episode k resets the scene with seed + k, where the robot can
    instruction: Optional[str] = None  # default: the robot's task instruction
    latency_budget: float = 0.5  # of a tick, to wait for an answer on its way before acting
    # a simulated inference delay (latency studies with robot=sim): each answer is taken no
    # earlier than this many ticks after its query's tick, however fast it came
    inject_delay_ticks: int = 0
    request_timeout_s: float = 2.0  # no answer this long: the server is taken for gone
    episode_timeout_s: float = 30.0  # a learning server's ack of a finished episode
    connect_timeout_s: float = 30.0
    output: Optional[str] = None  # steps.jsonl and summary.json; default runs/robot-<time>
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    teleop: Optional[TeleopConfig] = None  # null: no operator
    record: RecordingConfig = field(default_factory=RecordingConfig)  # dataset null: no recording


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    array = np.asarray(values)
    return {
        "p50": float(np.percentile(array, 50)),
        "p99": float(np.percentile(array, 99)),
        "max": float(array.max()),
        "n": int(array.size),
    }


@dataclass
class EpisodeProgress:
    """An episode so far: its totals, the operator's label, and (when learning) each acted
    tick's observation, action, reward and whether the operator drove it."""

    episode_return: float = 0.0
    success: bool = False
    terminated: bool = False
    steps: int = 0
    label: Optional[str] = None  # the operator's success / failure / rerecord
    states: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    rewards: list = field(default_factory=list)
    intervened: list = field(default_factory=list)
    images: list = field(default_factory=list)


class RobotClient:
    def __init__(
        self, robot: Robot, policy: PolicyClient, config: RobotClientConfig, output: Path, teleop: Teleop | None = None
    ):
        self.robot = robot
        self.policy = policy
        self.teleop = teleop
        self.recorder: DatasetRecorder | None = None
        self.config = config
        self.output = output
        self.spec = robot.spec
        check_client_config(config)
        self.control_hz = config.control_hz if config.control_hz is not None else self.spec.control_hz
        if not self.control_hz:
            raise ConfigError("the robot reports no control rate; set control_hz")
        self.period = 1.0 / self.control_hz
        self.max_steps = (
            config.max_episode_steps if config.max_episode_steps is not None else self.spec.max_episode_steps
        )
        if not self.max_steps:
            raise ConfigError("the robot has no episode limit; set max_episode_steps")
        self.safety = SafetyLayer(config.safety, self.spec)
        self.instruction = config.instruction if config.instruction is not None else robot.instruction
        if config.record.dataset is not None:
            self.recorder = DatasetRecorder(config.record, self.spec, self.control_hz, self.instruction)
        self.broker: ChunkBroker | None = None
        self.server_metadata: dict[str, Any] = {}
        self.should_quit: Callable[[], bool] = lambda: False
        self.episodes: list[dict[str, Any]] = []
        self.jitter_ms: list[float] = []  # tick start after its scheduled time
        self.act_ms: list[float] = []  # command sent after the tick's scheduled time
        self.round_trip_ms: list[float] = []
        self.handoffs: list[int] = []  # per answer: ticks from its query to the first tick it acted
        self.held: collections.deque[ActionReply] = collections.deque()  # inject_delay_ticks's answers
        self.server_ms: list[float] = []
        self.overrun_ticks = 0  # ticks dropped because the loop fell more than a tick behind
        self.sources: dict[str, int] = {
            name: 0 for name in ("policy", "teleop", "watchdog", "estop", "workspace", "non_finite", "none")
        }
        self.feedback: dict[str, Any] = {}  # what the robot did since the last request, sent with the next
        self.learning = False  # the server learns from our episodes (its welcome says so)
        self.outcome_cameras: list[str] = []  # cameras whose outcome frames go with each episode (the welcome's)
        self.policy_cameras: list[str] = []  # cameras whose frames go with each episode, like its states
        self.episodes_learned = {"sent": 0, "transitions": 0, "not_taken": 0}
        self.learning_finished = False  # the learning server needs no more episodes

    def _hold(self) -> np.ndarray | None:
        return self.robot.hold_action() if self.config.safety.safe_action == "hold" else None

    def run(self) -> dict[str, Any]:
        """Connect, run the configured episodes (or until `should_quit`), and write the
        summary, also when the run ends with an error."""
        if (self.output / "steps.jsonl").exists():
            raise ConfigError(f"{self.output} already holds a robot run; choose another output")
        self.output.mkdir(parents=True, exist_ok=True)
        error: BaseException | None = None
        try:
            with self.robot:
                try:
                    if self.recorder is not None:
                        self.recorder.open()
                    self._start()
                    with open(self.output / "steps.jsonl", "w") as log:
                        index = 0
                        while index < self.config.episodes and not self.should_quit() and not self.learning_finished:
                            episode = self._episode(index, log)
                            self.episodes.append(episode)
                            log.flush()
                            index += 0 if episode.get("rerecorded") else 1  # the same episode again
                finally:
                    self._send_safe_once()
                    self.policy.close()
                    self._close_recorder(failing=sys.exc_info()[1] is not None)
        except BaseException as raised:
            error = raised
            raise
        finally:
            summary = self._write_summary(error)
        return summary

    def _close_recorder(self, failing: bool) -> None:
        """Finalize the dataset; when the run is failing already, its error is the one to see."""
        if self.recorder is None:
            return
        try:
            self.recorder.close()
        except RecordingError as error:
            if not failing:
                raise
            logger.error("the dataset could not be closed cleanly: %s", error)

    def _start(self) -> None:
        """Everything that can fail before the first action: hold, workspace, handshake."""
        self._hold()  # a robot that cannot hold fails here, not when the watchdog first fires
        if self.config.safety.workspace is not None and self.robot.end_effector_position() is None:
            raise ConfigError(f"safety.workspace is set but robot '{self.robot.name}' reports no end-effector position")
        metadata = self.server_metadata = self.policy.connect(self.config.connect_timeout_s)
        chunk_size = int(metadata["chunk_size"])
        ensemble = self.config.broker.mode == "ensemble"
        steps = self.config.broker.execute_steps or (1 if ensemble else max(1, (chunk_size + 1) // 2))
        self.broker = ChunkBroker(chunk_size, steps, self.config.broker.mode, self.config.broker.ensemble_decay)
        if self.config.broker.realtime and not metadata.get("realtime_chunking"):
            raise ConfigError(
                f"broker.realtime needs a server whose policy samples with real-time chunking; policy "
                f"'{metadata.get('policy')}' (deterministic={metadata.get('deterministic')}) does not"
            )
        self.learning = bool(metadata.get("learning"))
        self.outcome_cameras = list(metadata.get("outcome_cameras") or []) if self.learning else []
        self.policy_cameras = list(metadata.get("policy_cameras") or []) if self.learning else []
        for role, cameras in (("reward classifier", self.outcome_cameras), ("policy", self.policy_cameras)):
            missing = [camera for camera in cameras if camera not in self.spec.image_shapes]
            if missing:
                raise ConfigError(
                    f"the learning server's {role} reads cameras {missing}, which robot "
                    f"'{self.robot.name}' does not have (it has {sorted(self.spec.image_shapes) or 'none'})"
                )
        if self.learning:
            logger.info(
                "the server learns: each finished episode is sent to it%s%s",
                f", with the frames of {self.policy_cameras} (its policy reads them)" if self.policy_cameras else "",
                f", with what each tick led to on {self.outcome_cameras} (its reward classifier reads them)"
                if self.outcome_cameras
                else "",
            )
        logger.info(
            "server ping %.2f ms; policy '%s' version %s, chunk %d, executing %d per query",
            self.policy.ping(),
            metadata.get("policy"),
            metadata.get("policy_version"),
            chunk_size,
            steps,
        )

    def _send_safe_once(self) -> None:
        """On the way out (quit, Ctrl-C, error): leave the robot holding still."""
        if self.robot.is_connected:
            try:
                self.robot.send_action(self.safety.safe_action(self._hold(), None))
            except Exception as error:  # the robot itself may be what failed
                logger.error("could not send the safe action on exit: %s", error)

    def _episode(self, index: int, log: Any) -> dict[str, Any]:
        self._start_episode(index)
        progress = EpisodeProgress()
        # The first action's change is limited relative to the robot at rest, where it can tell.
        previous = self._hold() if self.config.safety.max_delta is not None else None
        tick, ended = 0, False
        start = time.monotonic()
        self.safety.action_arrived(start)  # the watchdog's period starts with the episode
        while tick < self.max_steps and not self.should_quit():
            target = start + tick * self.period
            entry: dict[str, Any] = {"episode": index, "tick": tick}
            self._wait_until(target, tick, entry)
            tick, target = self._skip_a_stall(tick, target, entry)
            if tick >= self.max_steps:
                break
            entry["jitter_ms"] = (time.monotonic() - target) * 1000
            self.jitter_ms.append(entry["jitter_ms"])
            # Recording and learning need this tick's observation; otherwise it is read only for a query.
            observation = self.robot.get_observation() if self.recorder is not None or self.learning else None
            self._exchange(tick, target, entry, observation)
            position = self.robot.end_effector_position()
            if position is not None:
                entry["ee_position"] = np.round(position, 4).tolist()
            command, source = self._decide(tick, time.monotonic(), previous, position)
            policy_action = command if source == "policy" else None
            if self.teleop is not None and source not in ("estop", "non_finite"):
                command, source, progress.label = self._teleoperate(
                    command, source, previous, position, entry, progress.label
                )
            self.sources[source] += 1
            entry["source"] = source
            ended = progress.label is not None
            if command is not None:
                previous = self.robot.send_action(command)
                ended = self._acted(previous, source, policy_action, observation, target, entry, progress) or ended
            log.write(json.dumps(entry) + "\n")
            tick += 1
            if ended:
                break
        return self._finish_episode(index, progress, tick, finished=ended or tick >= self.max_steps)

    def _start_episode(self, index: int) -> None:
        assert self.broker is not None
        self.robot.reset_episode(self.config.seed + index)
        self.broker.clear()
        self.held.clear()
        self.policy.cancel()  # an answer to the last episode's observation must not act in this one
        if self.teleop is not None:
            self.teleop.reset()

    def _skip_a_stall(self, tick: int, target: float, entry: dict[str, Any]) -> tuple[int, float]:
        """After a stall, the tick and its target time to go on from: the ticks that passed are
        skipped rather than caught up in a burst (at most to the episode's end)."""
        late = time.monotonic() - target
        if late <= self.period:
            return tick, target
        missed = min(int(late // self.period), self.max_steps - tick)
        self.overrun_ticks += missed
        assert self.broker is not None
        self.broker.stalled(tick, tick + missed)
        entry.update(tick=tick + missed, overrun_ticks=missed)
        return tick + missed, target + missed * self.period

    def _acted(
        self,
        executed: np.ndarray,
        source: str,
        policy_action: Optional[np.ndarray],
        observation: Optional[RobotObservation],
        target: float,
        entry: dict[str, Any],
        progress: EpisodeProgress,
    ) -> bool:
        """Account for the action the robot just executed: log, feedback, the recording and the
        learner's episode. Returns whether the robot says the episode is over."""
        entry["executed_action"] = np.round(executed, 5).tolist()
        self.feedback["executed_action"] = executed
        self.feedback["intervened_ticks"] = self.feedback.get("intervened_ticks", 0) + (source == "teleop")
        entry["act_ms"] = (time.monotonic() - target) * 1000  # when this tick's command went out
        self.act_ms.append(entry["act_ms"])
        outcome = self.robot.outcome()
        if self.recorder is not None and observation is not None:
            self.recorder.add(
                observation.state,
                observation.images,
                executed,
                policy_action,
                source == "teleop",
                outcome.reward,
                source in SAFETY_SOURCES,
            )
        if self.learning and observation is not None:
            cameras = [*self.outcome_cameras, *self.policy_cameras]
            progress.states.append(observation.state)
            progress.actions.append(executed)
            progress.rewards.append(outcome.reward)
            progress.intervened.append(source == "teleop")
            progress.images.append({c: observation.images[c] for c in cameras})
        progress.episode_return += outcome.reward
        progress.terminated = progress.terminated or outcome.terminated
        self.feedback["reward"] = self.feedback.get("reward", 0.0) + outcome.reward
        progress.success |= outcome.success
        progress.steps += 1
        return outcome.terminated or outcome.truncated

    def _finish_episode(self, index: int, progress: EpisodeProgress, ticks: int, finished: bool) -> dict[str, Any]:
        """Save the recording and hand the episode to the learner, where it `finished` (not a
        quit mid-episode); the operator's label decides success and whether it is kept."""
        label = progress.label
        if label in ("success", "failure"):
            progress.success = label == "success"  # the operator's word over the robot's own check
        terminated = progress.terminated or label in ("success", "failure")
        result = {
            "episode": index,
            "return": progress.episode_return,
            "success": progress.success,
            "steps": progress.steps,
            "ticks": ticks,
        }
        # The state the last action led to, read before anything else moves the robot (the hold while saving).
        final = self.robot.get_observation() if self.learning and progress.actions else None
        if self.recorder is not None and finished:  # a quit mid-episode: record.partial
            self.robot.send_action(self.safety.safe_action(self._hold(), None))  # held still while it saves
            saved = self.recorder.end_episode(progress.success, keep=label != "rerecord", terminated=terminated)
            if saved is not None:
                result["dataset_episode"] = saved
        if final is not None and finished and label != "rerecord":
            result["learner"] = self._send_episode(self._learned_episode(progress, final, terminated))
        return {**result, "rerecorded": True} if label == "rerecord" else result

    def _learned_episode(self, progress: EpisodeProgress, final: RobotObservation, terminated: bool) -> Episode:
        """The episode as the learner takes it: what each acted tick led to is the next acted
        tick's observation, then the final one."""
        frames = [*progress.images, {c: final.images[c] for c in [*self.outcome_cameras, *self.policy_cameras]}]
        outcomes = frames[1:]
        return Episode(
            states=np.asarray([*progress.states, final.state], np.float32),
            actions=np.asarray(progress.actions, np.float32),
            rewards=np.asarray(progress.rewards, np.float32),
            intervened=np.asarray(progress.intervened, bool),
            terminated=terminated,
            success=progress.success,
            instruction=self.instruction,
            policy_version=self.server_metadata.get("policy_version"),
            images={c: np.stack([frame[c] for frame in frames]) for c in self.policy_cameras},
            outcome_images={c: np.stack([frame[c] for frame in outcomes]) for c in self.outcome_cameras},
        )

    def _send_episode(self, episode: Episode) -> dict[str, Any]:
        """Hand the episode to the learning server, the robot held still meanwhile; one the
        server does not take is logged and counted, and the run goes on."""
        self.robot.send_action(self.safety.safe_action(self._hold(), None))
        try:
            ack = self.policy.send_episode(episode.to_message(), self.config.episode_timeout_s)
        except ServerError as error:
            logger.warning("the learner did not take the episode (%d transitions): %s", episode.length, error)
            self.episodes_learned["not_taken"] += 1
            return {"taken": False, "why": str(error)}
        self.episodes_learned["sent"] += 1
        self.episodes_learned["transitions"] += episode.length
        version = ack.get("policy_version")
        if isinstance(version, int):
            self.server_metadata["policy_version"] = version  # the weights the next episode acts with
        if ack.get("finished") is True:
            logger.info("the learning run has all its env steps: no more episodes")
            self.learning_finished = True
        return {"taken": True, "transitions": episode.length, "policy_version": version}

    def _teleoperate(
        self,
        command: np.ndarray | None,
        source: str,
        previous: np.ndarray | None,
        position: np.ndarray | None,
        entry: dict[str, Any],
        label: str | None,
    ) -> tuple[np.ndarray | None, str, str | None]:
        """The operator's action in place of the policy's while intervening, through the same
        safety layer; both are logged with the flag."""
        assert self.teleop is not None
        order = self.teleop.poll(self.robot, command if source == "policy" else None)
        for event in order.events:
            label = label or event
        entry["intervened"] = order.intervening
        if source == "policy":
            entry["policy_action"] = np.round(command, 5).tolist()
        if not order.intervening or order.action is None:
            return command, source, label
        operated, stop = self.safety.filter(order.action, previous, position)
        if stop is not None:
            return self.safety.safe_action(self._hold(), None), stop, label
        self.safety.action_arrived(time.monotonic())  # the operator's actions count as valid ones
        return operated, "teleop", label

    def _wait_until(self, target: float, tick: int, entry: dict[str, Any]) -> None:
        """Sleep until `target`, taking in an answer the moment it arrives (for honest round trips)."""
        while (remaining := target - time.monotonic()) > 0:
            reply = self.policy.poll(remaining)
            if reply is not None:
                self._take(reply, tick, entry)

    def _exchange(
        self, tick: int, target: float, entry: dict[str, Any], observation: RobotObservation | None = None
    ) -> None:
        """Talk to the server for this tick: ask when the broker wants a chunk (with
        `observation`, or a fresh one), and wait at most `latency_budget` of a tick for an
        answer this tick needs."""
        assert self.broker is not None
        self.policy.maintain()
        while self.held and tick >= self.held[0].tick + self.config.inject_delay_ticks:
            self._accept(self.held.popleft(), tick, entry)
        reply = self.policy.poll(0.0)
        if reply is not None:
            self._take(reply, tick, entry)
        asking = self.policy.in_flight is not None or self.held  # an answer on its way
        if self.broker.wants_query(tick) and not asking and not self.safety.estopped:
            observation = observation if observation is not None else self.robot.get_observation()
            pending = self._pending(tick)
            entry["queried"] = self.policy.request(observation, tick, self.instruction, self.feedback, pending)
            if entry["queried"] and pending is not None:
                entry["rtc_delay"] = pending[1]
            if entry["queried"]:
                self.feedback = {}
        if self.broker.action(tick) is None and self.policy.in_flight is not None:
            reply = self.policy.poll(max(target + self.config.latency_budget * self.period - time.monotonic(), 0.0))
            if reply is not None:
                self._take(reply, tick, entry)

    def _pending(self, tick: int) -> tuple[np.ndarray, int] | None:
        """Real-time chunking's (pending actions, delay) for a query at `tick`: the delay is the
        number of the answer's first actions the robot will not execute, as the slowest of the
        last 10 answers took over (at least 1: this tick's action comes from the current
        chunk), at most the pending actions."""
        assert self.broker is not None
        actions = self.broker.pending(tick) if self.config.broker.realtime else None
        if actions is None:
            return None
        return actions, min(max([1, *self.handoffs[-10:]]), len(actions))

    def _take(self, reply: ActionReply, tick: int, entry: dict[str, Any]) -> None:
        """An answer that arrived at `tick`: taken now, or held back by `inject_delay_ticks`."""
        if tick < reply.tick + self.config.inject_delay_ticks:
            self.held.append(reply)
        else:
            self._accept(reply, tick, entry)

    def _accept(self, reply: ActionReply, tick: int, entry: dict[str, Any]) -> None:
        assert self.broker is not None
        self.broker.add(reply.actions, reply.tick, tick)
        handoff = tick - reply.tick  # ticks since its observation (the broker skips those the robot moved on)
        entry["handoff_ticks"] = handoff
        self.handoffs.append(handoff)
        self.round_trip_ms.append(reply.round_trip_ms)
        if "server_ms" in reply.timing:
            self.server_ms.append(reply.timing["server_ms"])
        entry.update(round_trip_ms=reply.round_trip_ms, policy_version=reply.policy_version, **reply.timing)

    def _decide(
        self, tick: int, now: float, previous: np.ndarray | None, position: np.ndarray | None
    ) -> tuple[np.ndarray | None, str]:
        assert self.broker is not None
        if self.safety.estopped:
            # after the reset, act on a fresh observation, not a pre-stop plan: nothing held,
            # nothing on its way (a late answer would find the robot standing, and act in full)
            self.broker.clear()
            self.policy.cancel()
            self.held.clear()
            return self.safety.safe_action(self._hold(), "estop"), "estop"
        action = self.broker.action(tick)
        if action is not None:
            self.safety.action_arrived(now)  # the watchdog counts from the last action it could use
            command, stop = self.safety.filter(action, previous, position)
            if stop is not None:
                return self.safety.safe_action(self._hold(), None), stop
            return command, "policy"
        if self.safety.watchdog_expired(now):
            return self.safety.safe_action(self._hold(), "watchdog"), "watchdog"
        return None, "none"  # late, but within the watchdog's period: the robot keeps its last command

    def _write_summary(self, error: BaseException | None) -> dict[str, Any]:
        kept = [e for e in self.episodes if not e.get("rerecorded")]
        successes = sum(e["success"] for e in kept)
        summary = {
            "robot": self.robot.name,
            "server": self.policy.endpoint,
            **{key: self.server_metadata.get(key) for key in ("policy", "policy_version", "normalization_id")},
            "control_hz": self.control_hz,
            "episodes": self.episodes,
            "success_rate": successes / len(kept) if kept else 0.0,
            "action_sources": self.sources,
            "jitter_ms": percentiles(self.jitter_ms),
            "act_ms": percentiles(self.act_ms),
            "round_trip_ms": percentiles(self.round_trip_ms),
            "server_ms": percentiles(self.server_ms),
            "skipped_actions": self.broker.skipped if self.broker else 0,
            "overrun_ticks": self.overrun_ticks,
            "safety_interventions": dict(self.safety.counts),
            "teleop_ticks": self.sources["teleop"],
            "rerecorded_episodes": sum(bool(e.get("rerecorded")) for e in self.episodes),
            "connection": dict(self.policy.counts),
            "learner": self.episodes_learned if self.learning else None,
            "dataset": None
            if self.recorder is None
            else {
                "root": str(self.recorder.root),
                "episodes_saved": self.recorder.saved,
                "frames_that_waited": self.recorder.waits,
            },
            "broker": asdict(self.config.broker),
            "error": None if error is None else f"{type(error).__name__}: {error}",
        }
        self.output.mkdir(parents=True, exist_ok=True)
        temporary = self.output / ".summary.json.tmp"
        temporary.write_text(json.dumps(summary, indent=2))
        os.replace(temporary, self.output / "summary.json")
        return summary


def check_client_config(config: RobotClientConfig) -> None:
    """Values the types alone do not catch; checked before anything connects."""
    check_mode(config.broker.mode)
    if config.broker.realtime and config.broker.mode != "chunk":
        raise ConfigError("broker.realtime (real-time chunking) works in broker.mode=chunk, not ensemble")
    if config.broker.execute_steps is not None and config.broker.execute_steps < 1:
        raise ConfigError(f"broker.execute_steps must be >= 1, got {config.broker.execute_steps}")
    if config.inject_delay_ticks < 0:
        raise ConfigError(f"inject_delay_ticks must be >= 0, got {config.inject_delay_ticks}")
    if not 0 <= config.latency_budget <= 1:
        raise ConfigError(f"latency_budget is a fraction of a tick in [0, 1], got {config.latency_budget}")
    for key in ("control_hz", "max_episode_steps"):
        value = getattr(config, key)
        if value is not None and value <= 0:
            raise ConfigError(f"'{key}' must be > 0 (or null for the robot's own), got {value}")
    for key in ("request_timeout_s", "connect_timeout_s", "episode_timeout_s"):
        if getattr(config, key) <= 0:
            raise ConfigError(f"'{key}' must be > 0, got {getattr(config, key)}")
