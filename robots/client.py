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

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from embodied.errors import ConfigError
from robots.base import Robot
from robots.broker import ChunkBroker
from robots.policy_client import ActionReply, PolicyClient
from robots.safety import SafetyConfig, SafetyLayer

logger = logging.getLogger(__name__)


@dataclass
class BrokerConfig:
    mode: str = "chunk"  # chunk | ensemble (temporal ensembling)
    execute_steps: Optional[int] = None  # ask for the next chunk after this many; default: half a chunk
    ensemble_decay: float = 0.01


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
    request_timeout_s: float = 2.0  # no answer this long: the server is taken for gone
    connect_timeout_s: float = 30.0
    output: Optional[str] = None  # steps.jsonl and summary.json; default runs/robot-<time>
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    array = np.asarray(values)
    return {"p50": float(np.percentile(array, 50)), "p99": float(np.percentile(array, 99)),
            "max": float(array.max()), "n": int(array.size)}


class RobotClient:
    def __init__(self, robot: Robot, policy: PolicyClient, config: RobotClientConfig, output: Path):
        self.robot = robot
        self.policy = policy
        self.config = config
        self.output = output
        self.spec = robot.spec
        self.control_hz = config.control_hz or self.spec.control_hz
        if not self.control_hz or self.control_hz <= 0:
            raise ConfigError("the robot reports no control rate; set control_hz")
        self.period = 1.0 / self.control_hz
        self.max_steps = config.max_episode_steps or self.spec.max_episode_steps
        if not self.max_steps:
            raise ConfigError("the robot has no episode limit; set max_episode_steps")
        self.safety = SafetyLayer(config.safety, self.spec)
        self.instruction = config.instruction if config.instruction is not None else robot.instruction
        self.broker: ChunkBroker | None = None
        self.server_metadata: dict[str, Any] = {}
        self.should_quit: Callable[[], bool] = lambda: False
        self.episodes: list[dict[str, Any]] = []
        self.jitter_ms: list[float] = []  # tick start after its scheduled time
        self.act_ms: list[float] = []  # command sent after the tick's scheduled time
        self.round_trip_ms: list[float] = []
        self.server_ms: list[float] = []
        self.sources: dict[str, int] = {"policy": 0, "watchdog": 0, "estop": 0, "workspace": 0, "none": 0}

    def _hold(self) -> np.ndarray | None:
        return self.robot.hold_action() if self.config.safety.safe_action == "hold" else None

    def run(self) -> dict[str, Any]:
        """Connect, run the configured episodes (or until `should_quit`), and write the summary."""
        self.output.mkdir(parents=True, exist_ok=True)
        with self.robot:
            self._hold()  # a robot that cannot hold fails here, not when the watchdog first fires
            metadata = self.server_metadata = self.policy.connect(self.config.connect_timeout_s)
            chunk_size = int(metadata["chunk_size"])
            steps = self.config.broker.execute_steps or max(1, (chunk_size + 1) // 2)
            self.broker = ChunkBroker(chunk_size, steps, self.config.broker.mode, self.config.broker.ensemble_decay)
            logger.info("server ping %.2f ms; policy '%s' version %s, chunk %d, executing %d per query",
                        self.policy.ping(), metadata.get("policy"), metadata.get("policy_version"), chunk_size, steps)
            try:
                with open(self.output / "steps.jsonl", "a") as log:
                    for index in range(self.config.episodes):
                        if self.should_quit():
                            break
                        self.episodes.append(self._episode(index, log))
                        log.flush()
            finally:
                self._send_safe_once()
                self.policy.close()
        return self._write_summary()

    def _send_safe_once(self) -> None:
        """On the way out (quit, Ctrl-C, error): leave the robot holding still."""
        if self.robot.is_connected:
            try:
                self.robot.send_action(self.safety.safe_action(self._hold(), None))
            except Exception as error:  # the robot itself may be what failed
                logger.error("could not send the safe action on exit: %s", error)

    def _episode(self, index: int, log: Any) -> dict[str, Any]:
        assert self.broker is not None
        self.robot.reset_episode(self.config.seed + index)
        self.broker.clear()
        previous: np.ndarray | None = None
        episode_return, success, steps, tick = 0.0, False, 0, 0
        start = time.monotonic()
        self.safety.action_arrived(start)  # the watchdog's period starts with the episode
        while tick < self.max_steps and not self.should_quit():
            target = start + tick * self.period
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            entry: dict[str, Any] = {"episode": index, "tick": tick, "jitter_ms": (time.monotonic() - target) * 1000}
            self.jitter_ms.append(entry["jitter_ms"])
            reply = self._exchange(tick, target, entry)
            if reply is not None:
                self._take(reply, tick, entry)
            position = self.robot.end_effector_position()
            if position is not None:
                entry["ee_position"] = np.round(position, 4).tolist()
            now = time.monotonic()
            command, source = self._decide(tick, now, previous, position)
            entry["act_ms"] = (now - target) * 1000  # when this tick's command went out
            self.act_ms.append(entry["act_ms"])
            self.sources[source] += 1
            entry["source"] = source
            if command is not None:
                previous = self.robot.send_action(command)
                outcome = self.robot.outcome()
                episode_return += outcome.reward
                success |= outcome.success
                steps += 1
            log.write(json.dumps(entry) + "\n")
            tick += 1
            if command is not None and (outcome.terminated or outcome.truncated):
                break
        return {"episode": index, "return": episode_return, "success": success, "steps": steps, "ticks": tick}

    def _exchange(self, tick: int, target: float, entry: dict[str, Any]) -> ActionReply | None:
        """Talk to the server for this tick; returns the answer that arrived, if any."""
        assert self.broker is not None
        self.policy.maintain()
        reply = self.policy.poll(0.0)
        if reply is not None:
            self._take(reply, tick, entry)
            reply = None
        if self.broker.wants_query(tick) and self.policy.in_flight is None and not self.safety.estopped:
            entry["queried"] = self.policy.request(self.robot.get_observation(), tick, self.instruction)
        if self.broker.action(tick) is None and self.policy.in_flight is not None:
            reply = self.policy.poll(max(target + self.config.latency_budget * self.period - time.monotonic(), 0.0))
        return reply

    def _take(self, reply: ActionReply, tick: int, entry: dict[str, Any]) -> None:
        assert self.broker is not None
        self.broker.add(reply.actions, reply.tick, tick)
        self.safety.action_arrived(time.monotonic())
        self.round_trip_ms.append(reply.round_trip_ms)
        if "server_ms" in reply.timing:
            self.server_ms.append(reply.timing["server_ms"])
        entry.update(round_trip_ms=reply.round_trip_ms, policy_version=reply.policy_version, **reply.timing)

    def _decide(self, tick: int, now: float, previous: np.ndarray | None,
                position: np.ndarray | None) -> tuple[np.ndarray | None, str]:
        assert self.broker is not None
        if self.safety.estopped:
            return self.safety.safe_action(self._hold(), "estop"), "estop"
        action = self.broker.action(tick)
        if action is not None:
            command, stop = self.safety.filter(action, previous, position)
            if stop:
                return self.safety.safe_action(self._hold(), "workspace"), "workspace"
            return command, "policy"
        if self.safety.watchdog_expired(now):
            return self.safety.safe_action(self._hold(), "watchdog"), "watchdog"
        return None, "none"  # late, but within the watchdog's period: the robot keeps its last command

    def _write_summary(self) -> dict[str, Any]:
        successes = sum(e["success"] for e in self.episodes)
        summary = {
            "robot": self.robot.name,
            "server": self.policy.endpoint,
            **{key: self.server_metadata.get(key) for key in ("policy", "policy_version", "normalization_id")},
            "control_hz": self.control_hz,
            "episodes": self.episodes,
            "success_rate": successes / len(self.episodes) if self.episodes else 0.0,
            "action_sources": self.sources,
            "jitter_ms": percentiles(self.jitter_ms),
            "act_ms": percentiles(self.act_ms),
            "round_trip_ms": percentiles(self.round_trip_ms),
            "server_ms": percentiles(self.server_ms),
            "skipped_actions": self.broker.skipped if self.broker else 0,
            "safety_interventions": dict(self.safety.counts),
            "connection": dict(self.policy.counts),
            "broker": asdict(self.config.broker),
        }
        temporary = self.output / ".summary.json.tmp"
        temporary.write_text(json.dumps(summary, indent=2))
        os.replace(temporary, self.output / "summary.json")
        return summary


def build_robot(robot_cfg: Any) -> Robot:
    from embodied.registry import ROBOTS

    import robots.components  # noqa: F401  (fills the registry)

    return ROBOTS.get(robot_cfg.name).factory(robot_cfg)
