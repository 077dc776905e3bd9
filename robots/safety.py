"""The safety layer between the policy and the robot: on by default, numpy only.

Every action the client sends passes through `SafetyLayer.filter`, in this order:
  1. action bounds (the spec's, or tighter ones from config);
  2. a maximum change per control step, per action dimension;
  3. an end-effector workspace box, where the robot reports its position:
     `ee_delta` clips translation deltas so the next position stays inside the box;
     `stop` commands the safe action while the end effector is outside it.
A policy action with NaN or infinity is replaced by the safe action. The watchdog commands
the safe action when no valid policy action was available within its period,
and an e-stop (a key or a signal) latches the safe action until `reset_estop()`.
Each intervention increments a counter and is logged (the first, then every 100th)."""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec

logger = logging.getLogger(__name__)

SAFE_ACTIONS = ("hold", "zero")
WORKSPACE_MODES = ("ee_delta", "stop")
INTERVENTIONS = ("bounds", "max_delta", "workspace", "non_finite", "watchdog", "estop")


@dataclass
class WorkspaceConfig:
    low: list[float] = field(default_factory=list)  # (3,) metres, in the robot's base frame
    high: list[float] = field(default_factory=list)
    mode: str = "ee_delta"  # ee_delta | stop
    position_dims: list[int] = field(default_factory=lambda: [0, 1, 2])  # ee_delta: action dims moving x, y, z
    action_scale: float = 0.1  # ee_delta: metres per action unit


@dataclass
class SafetyConfig:
    enabled: bool = True
    action_low: Optional[list[float]] = None  # default: the robot's action bounds
    action_high: Optional[list[float]] = None
    max_delta: Optional[list[float]] = None  # per dimension and control step; one value for all; null: off
    workspace: Optional[WorkspaceConfig] = None  # null: no box
    watchdog_s: float = 0.5  # no valid action for this long -> the safe action
    # hold: the robot's hold_action (its current position, or zero for delta control);
    # zero: all zeros, only where that means "stay" (velocity or delta control)
    safe_action: str = "hold"


def _vector(values: list[float] | None, size: int, key: str) -> np.ndarray | None:
    if values is None:
        return None
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size == 1:
        array = np.full(size, array[0])
    if array.size != size:
        raise ConfigError(f"safety.{key} has {array.size} values; the robot's actions have {size} dimensions")
    return array


class SafetyLayer:
    def __init__(self, config: SafetyConfig, spec: EnvSpec):
        if config.safe_action not in SAFE_ACTIONS:
            raise ConfigError(f"safety.safe_action must be one of {SAFE_ACTIONS}, got '{config.safe_action}'")
        if config.watchdog_s <= 0:
            raise ConfigError(f"safety.watchdog_s must be > 0, got {config.watchdog_s}")
        size = spec.action_dim
        self.config = config
        self.low = _vector(config.action_low, size, "action_low")
        self.high = _vector(config.action_high, size, "action_high")
        self.low = np.asarray(spec.action_low, dtype=np.float64) if self.low is None else self.low
        self.high = np.asarray(spec.action_high, dtype=np.float64) if self.high is None else self.high
        if np.any(self.low > self.high):
            raise ConfigError("safety.action_low must not exceed safety.action_high in any dimension")
        if config.safe_action == "zero" and (np.any(self.low > 0) or np.any(self.high < 0)):
            raise ConfigError(
                "safety.safe_action=zero, but zero is outside the action bounds: it cannot be a "
                "stay-put command for this robot; use safe_action=hold"
            )
        self.max_delta = _vector(config.max_delta, size, "max_delta")
        if self.max_delta is not None and np.any(self.max_delta <= 0):
            raise ConfigError("safety.max_delta must be > 0 in every dimension")
        self.workspace = config.workspace
        if self.workspace is not None:
            self._check_workspace(self.workspace, size)
        if not config.enabled:
            logger.warning("safety layer disabled: no bounds, delta limit or workspace box (NaN is still refused)")
        self.counts: collections.Counter[str] = collections.Counter({name: 0 for name in INTERVENTIONS})
        self.estopped = False
        self.estop_reason = ""
        self.last_valid_time = time.monotonic()

    @staticmethod
    def _check_workspace(workspace: WorkspaceConfig, size: int) -> None:
        if len(workspace.low) != 3 or len(workspace.high) != 3:
            raise ConfigError("safety.workspace.low and .high need 3 values each (x, y, z in metres)")
        if any(lo >= hi for lo, hi in zip(workspace.low, workspace.high)):
            raise ConfigError("safety.workspace.low must be below safety.workspace.high on every axis")
        if workspace.mode not in WORKSPACE_MODES:
            raise ConfigError(f"safety.workspace.mode must be one of {WORKSPACE_MODES}, got '{workspace.mode}'")
        if workspace.mode == "ee_delta" and (
            len(workspace.position_dims) != 3 or not all(0 <= d < size for d in workspace.position_dims)
        ):
            raise ConfigError(f"safety.workspace.position_dims must name 3 action dimensions below {size}")

    def _count(self, name: str, detail: str) -> None:
        self.counts[name] += 1
        if self.counts[name] % 100 == 1:
            logger.warning("safety: %s (%d so far): %s", name, self.counts[name], detail)

    # ---- policy actions --------------------------------------------------------------
    def filter(
        self, action: np.ndarray, previous: np.ndarray | None, position: np.ndarray | None = None
    ) -> tuple[np.ndarray | None, str | None]:
        """(the action to send instead of `action`, None) or (None, reason) when the safe
        action must be sent instead: `non_finite` (NaN or infinity from the policy) or
        `workspace` (the `stop` mode, outside the box). `previous` is the last action sent;
        `position` the end effector's. The box is applied last: it wins over `max_delta`."""
        action = np.asarray(action, dtype=np.float64)
        if not np.all(np.isfinite(action)):
            self._count("non_finite", f"action {action.tolist()}")
            return None, "non_finite"
        if not self.config.enabled:
            return action.astype(np.float32), None
        clipped = np.clip(action, self.low, self.high)
        if not np.array_equal(clipped, action):
            self._count("bounds", f"action {np.round(action, 3).tolist()} outside the bounds")
        if self.max_delta is not None and previous is not None:
            limited = np.clip(clipped, previous - self.max_delta, previous + self.max_delta)
            if not np.array_equal(limited, clipped):
                self._count("max_delta", f"a change of {np.round(clipped - previous, 3).tolist()} in one step")
            clipped = limited
        if self.workspace is not None:
            if position is None:
                raise ConfigError("safety.workspace is set but the robot reports no end-effector position")
            if self.workspace.mode == "stop" and not self._inside(position):
                self._count("workspace", f"end effector at {np.round(position, 3).tolist()} is outside the box")
                return None, "workspace"
            if self.workspace.mode == "ee_delta":
                clipped = np.clip(
                    self._clip_to_box(clipped, np.asarray(position, dtype=np.float64)), self.low, self.high
                )
        return clipped.astype(np.float32), None

    def _inside(self, position: np.ndarray) -> bool:
        assert self.workspace is not None
        return bool(np.all(position >= self.workspace.low) and np.all(position <= self.workspace.high))

    def _clip_to_box(self, action: np.ndarray, position: np.ndarray) -> np.ndarray:
        assert self.workspace is not None
        dims, scale = list(self.workspace.position_dims), self.workspace.action_scale
        target = position + action[dims] * scale
        low, high = np.asarray(self.workspace.low), np.asarray(self.workspace.high)
        # Outside the box already: allow only motion back toward it.
        allowed = np.clip(target, np.minimum(low, position), np.maximum(high, position))
        if np.allclose(allowed, target):
            return action
        self._count("workspace", f"a step to {np.round(target, 3).tolist()} would leave the box")
        clipped = action.copy()
        clipped[dims] = (allowed - position) / scale
        return clipped

    # ---- watchdog and e-stop ---------------------------------------------------------
    def action_arrived(self, now: float) -> None:
        self.last_valid_time = now

    def watchdog_expired(self, now: float) -> bool:
        return now - self.last_valid_time > self.config.watchdog_s

    def safe_action(self, hold: np.ndarray | None, reason: str | None) -> np.ndarray:
        """The safe action, counted under `reason` (watchdog or estop; `filter` counts its own
        stops; None: the client leaving, not an intervention)."""
        if reason in ("watchdog", "estop"):
            self._count(reason, "commanding the safe action")
        if self.config.safe_action == "zero":
            return np.zeros_like(self.low, dtype=np.float32)
        if hold is None:
            raise RuntimeError("safety.safe_action=hold needs the robot's hold action")
        return np.asarray(hold, dtype=np.float32)

    def estop(self, reason: str) -> None:
        if not self.estopped:
            logger.error("safety: E-STOP (%s); the safe action is held until the e-stop is reset", reason)
        self.estopped = True
        self.estop_reason = reason

    def reset_estop(self) -> None:
        if self.estopped:
            logger.warning("safety: e-stop reset")
        self.estopped = False
        self.estop_reason = ""
        self.last_valid_time = time.monotonic()
