"""`embodied robot robot=<name> server=<endpoint> [key=value ...]`: run a robot client.

Keys (when stdin is a terminal): `e` or space latches the e-stop, `r` resets it, `q` quits;
with `teleop=keyboard` also the operator's keys (`robots/teleop.py`).
Signals: SIGUSR1 latches the e-stop (e.g. `kill -USR1 <pid>` from a hardware button
script); Ctrl-C or SIGTERM (a service stop) ends the run cleanly: the safe action is sent and
the summary written. A second Ctrl-C stops at once."""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import embodied.robots.components  # noqa: F401  (fills the robot registry)
from embodied.core.compose import compose, validate
from embodied.core.errors import ConfigError
from embodied.core.operator import SCRIPTED
from embodied.core.registry import ROBOTS, TELEOPS
from embodied.robots.base import Robot
from embodied.robots.client import RobotClient, RobotClientConfig
from embodied.robots.policy_client import NoPolicy, PolicyClient
from embodied.robots.teleop import KeyboardTeleop, OracleTeleop, Teleop, TeleopConfig


def load_client_config(overrides: list[str]) -> RobotClientConfig:
    cfg = compose("robot", overrides)
    robot_section = cfg.get("robot")
    if robot_section is None or robot_section.get("name") is None:
        raise ConfigError("no robot selected; pass robot=<name> (configs/robot/)")
    top = {key: value for key, value in cfg.items() if key != "robot"}
    config = validate(RobotClientConfig, top, "")
    config.robot = validate(ROBOTS.get(robot_section.name).schema, robot_section, "robot.")
    if config.episodes < 1:
        raise ConfigError(f"'episodes' must be >= 1, got {config.episodes}")
    return config


class KeyboardMonitor:
    """Single key presses from a terminal, read in a thread; nothing when `fd` is no terminal
    (a service, CI) unless `force` (tests feed a pipe)."""

    def __init__(self, actions: dict[str, Callable[[], None]], fd: int | None = None, force: bool = False):
        self.actions = actions
        self.fd = sys.stdin.fileno() if fd is None else fd
        self.active = force or os.isatty(self.fd)
        self._saved: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "KeyboardMonitor":
        if self.active:
            if os.isatty(self.fd):
                import termios
                import tty

                self._saved = termios.tcgetattr(self.fd)
                tty.setcbreak(self.fd)
            self._thread = threading.Thread(target=self._run, name="keys", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if not ready:
                continue
            data = os.read(self.fd, 1)
            if not data:
                return
            action = self.actions.get(data.decode(errors="ignore").lower())
            if action is not None:
                action()

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)


def checkpoint_operator(checkpoint: str) -> Callable[[Robot], np.ndarray]:
    """A trained policy as the oracle's operator, acting on the robot's observation: for
    simulation, where a state-based policy may coach an image-based one. Loads torch."""
    from embodied.core.types import Observation
    from embodied.runs.loading import load_run_policy, numpy_infer

    infer = numpy_infer(load_run_policy(checkpoint))

    def operate(robot: Robot) -> np.ndarray:
        seen = robot.get_observation()
        observation = Observation(
            state=seen.state[None], images={k: v[None] for k, v in seen.images.items()}, instruction=[robot.instruction]
        )
        return infer(observation)[0, 0]

    return operate


def oracle_teleop(config: TeleopConfig, action_dim: int, driving: bool, action_names: list[str] | None) -> Teleop:
    operator = config.operator
    if not operator.policy or operator.policy == SCRIPTED:
        raise ConfigError(
            "teleop=oracle needs teleop.operator.policy=<run or checkpoint directory> "
            "(a simulated robot has no scripted expert)"
        )
    if operator.trigger != "drift":
        raise ConfigError(
            f"teleop=oracle takes over when the policy's action drifts from the operator's "
            f"(teleop.operator.trigger=drift); trigger={operator.trigger} needs the env's reward, which only "
            "training in simulation has"
        )
    rule = (operator.threshold, operator.patience, operator.release, operator.max_takeover)
    return OracleTeleop(checkpoint_operator(operator.policy), *rule)


TELEOPS.add("oracle", TeleopConfig, oracle_teleop)


def build_teleop(
    config: TeleopConfig, action_dim: int, driving: bool = False, action_names: list[str] | None = None
) -> Teleop:
    """`driving`: no policy runs, the operator is in charge from the start. `action_names`:
    the robot's names for its action dimensions, where it has them (a leader arm matches
    its joints to them)."""
    return TELEOPS.get(config.name).factory(config, action_dim, driving, action_names)


MODES = ("robot", "teleop", "collect")  # a policy drives | an operator drives | ... and every episode is recorded


def run(overrides: list[str], mode: str = "robot") -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_client_config(overrides)
    operated = mode in ("teleop", "collect")
    if operated and config.teleop is None:
        raise ConfigError(
            f"embodied {mode} needs an operator: teleop=keyboard | gamepad | spacemouse | leader | oracle"
        )
    if mode == "collect" and not config.record.dataset:
        raise ConfigError("embodied collect needs record.dataset=<dataset folder>")
    output = Path(config.output) if config.output else Path("runs") / f"{mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    robot = ROBOTS.get(config.robot.name).factory(config.robot)
    policy = (
        NoPolicy()
        if operated
        else PolicyClient(config.server, robot.spec, config.client_name, config.keys_dir, config.request_timeout_s)
    )
    teleop = (
        build_teleop(
            config.teleop, robot.spec.action_dim, driving=operated, action_names=getattr(robot, "action_keys", None)
        )
        if config.teleop is not None
        else None
    )
    client = RobotClient(robot, policy, config, output, teleop)
    quit_requested = threading.Event()
    client.should_quit = quit_requested.is_set
    keys = {
        **(teleop.keys if teleop is not None else {}),
        "e": lambda: client.safety.estop("key"),
        " ": lambda: client.safety.estop("key"),
        "r": client.safety.reset_estop,
        "q": quit_requested.set,
    }

    def interrupt(*_: Any) -> None:  # the first Ctrl-C ends the run cleanly, a second one at once
        quit_requested.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = {
        signal.SIGUSR1: signal.signal(signal.SIGUSR1, lambda *_: client.safety.estop("SIGUSR1")),
        signal.SIGINT: signal.signal(signal.SIGINT, interrupt),
        signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: quit_requested.set()),
    }
    try:
        with KeyboardMonitor(keys) as monitor:
            if monitor.active:
                print(
                    "keys: e/space e-stop, r reset e-stop, q quit"
                    + (
                        "; i intervene, w/s a/d z/x move, c gripper, y success, n failure, b re-record"
                        if isinstance(teleop, KeyboardTeleop)
                        else ""
                    ),
                    flush=True,
                )
            summary = client.run()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if teleop is not None:
            teleop.close()
    jitter, trip = summary["jitter_ms"], summary["round_trip_ms"]
    print(
        f"\n{len(summary['episodes'])} episodes, success {summary['success_rate']:.0%}; "
        f"round trip p50 {trip.get('p50', float('nan')):.2f} ms p99 {trip.get('p99', float('nan')):.2f} ms; "
        f"jitter p99 {jitter.get('p99', float('nan')):.2f} ms"
    )
    print(f"action sources: {summary['action_sources']}; safety: {summary['safety_interventions']}")
    print(f"log: {output / 'steps.jsonl'}\nsummary: {output / 'summary.json'}")
    return 0
