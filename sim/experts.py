"""Scripted experts for ManiSkill tabletop tasks: waypoint followers that read privileged
state (object and goal poses) and act through end-effector delta control
(`control_mode=pd_ee_delta_pos`, action = [dx, dy, dz, gripper] in [-1, 1]).

They make demonstrations for SFT and offline RL (`tools/demos.py`) without a trained policy
or a motion planner (ManiSkill's planner needs another numpy than the rest of the stack).
Each expert walks through phases; a phase ends when the tool centre point (TCP) is within
`tolerance` of its target, or after a fixed number of steps for gripper moves.

    PickCube-v1   above the cube -> down -> close -> to the goal
    PushCube-v1   above a point behind the cube -> down -> push through the goal region
    StackCube-v1  pick cube A -> above cube B -> down onto it -> open"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from embodied.core.errors import ConfigError

CONTROL_MODE = "pd_ee_delta_pos"
STEP_M = 0.1  # an action of 1 moves the end-effector target this far (the controller's bound)
GAIN = 3.0  # proportional gain on the position error, in actions per STEP_M
OPEN, CLOSED = 1.0, -1.0
GRIP_STEPS = 3  # steps the gripper is given to close or open
CARRIED_M = 0.03  # a grasped cube's centre is this close to the TCP (its half size is 0.02)


@dataclass
class Waypoint:
    target: np.ndarray  # world position of the TCP
    gripper: float
    tolerance: float = 0.01  # m: the phase ends this close to its target
    steps: int = 0  # a gripper phase: hold the target this many steps
    speed: float = 1.0  # the largest action per axis (pushing slowly keeps contact)


def _position(actor: Any) -> np.ndarray:
    return actor.pose.p[0].detach().cpu().numpy().astype(np.float64)


class ScriptedExpert:
    """One env's expert. `waypoints(scene)` names the phases from the current scene."""

    task = ""

    def __init__(self, action_noise: float = 0.0, seed: int = 0):
        self.action_noise = action_noise
        self.rng = np.random.default_rng(seed)
        self.phase = 0
        self.held = 0

    def reset(self) -> None:
        self.phase, self.held = 0, 0

    def waypoints(self, scene: Any) -> list[Waypoint]:
        raise NotImplementedError

    def lost(self, scene: Any, tcp: np.ndarray) -> bool:
        """Whether the phase reached no longer fits the scene (the object the plan carries is not
        at the gripper): the plan starts over. It happens where another hand drove in between,
        as when the expert is an operator that takes over from a policy."""
        return False

    def act(self, scene: Any) -> np.ndarray:
        """The action for the scene's current state (float32 (4,))."""
        tcp = _position(scene.agent.tcp)
        if self.phase and self.lost(scene, tcp):
            self.phase, self.held = 0, 0
        plan = self.waypoints(scene)
        point = plan[min(self.phase, len(plan) - 1)]
        if self.phase < len(plan) - 1:
            if point.steps:
                self.held += 1
                if self.held >= point.steps:
                    self.phase, self.held = self.phase + 1, 0
            elif np.linalg.norm(point.target - tcp) < point.tolerance:
                self.phase += 1
        move = np.clip(GAIN * (point.target - tcp) / STEP_M, -point.speed, point.speed)
        if self.action_noise > 0:
            move = np.clip(move + self.rng.normal(0.0, self.action_noise, 3), -1.0, 1.0)
        return np.append(move, point.gripper).astype(np.float32)


class PickCubeExpert(ScriptedExpert):
    task = "PickCube-v1"

    def waypoints(self, scene: Any) -> list[Waypoint]:
        cube, goal = _position(scene.cube), _position(scene.goal_site)
        return [
            Waypoint(cube + [0, 0, 0.05], OPEN),
            Waypoint(cube, OPEN, tolerance=0.005),
            Waypoint(cube, CLOSED, steps=GRIP_STEPS),
            Waypoint(goal, CLOSED),
        ]

    def lost(self, scene: Any, tcp: np.ndarray) -> bool:
        return self.phase >= 3 and np.linalg.norm(_position(scene.cube) - tcp) > CARRIED_M


class PushCubeExpert(ScriptedExpert):
    task = "PushCube-v1"
    behind = 0.05  # m behind the cube's centre (its half size is 0.02), on the far side from the goal
    push_speed = 0.3  # faster pushes kick the cube past the goal

    def waypoints(self, scene: Any) -> list[Waypoint]:
        cube, goal = _position(scene.obj), _position(scene.goal_region)
        start = cube - [self.behind, 0, 0]
        through = np.array([goal[0] - self.behind, cube[1], cube[2]])  # the cube's centre near the goal's
        return [
            Waypoint(start + [0, 0, 0.05], CLOSED),
            Waypoint(start, CLOSED, tolerance=0.005),
            Waypoint(through, CLOSED, speed=self.push_speed),
        ]

    def lost(self, scene: Any, tcp: np.ndarray) -> bool:  # pushing, but no longer behind the cube
        return self.phase >= 2 and np.linalg.norm(_position(scene.obj) - tcp) > 2 * self.behind


class StackCubeExpert(ScriptedExpert):
    task = "StackCube-v1"

    def waypoints(self, scene: Any) -> list[Waypoint]:
        cube_a, cube_b = _position(scene.cubeA), _position(scene.cubeB)
        size = 2 * float(np.asarray(scene.cube_half_size).reshape(-1)[0])
        on_b = cube_b + [0, 0, size]
        # After the grasp, cube A's position moves with the TCP: the plan after it is on B's.
        return [
            Waypoint(cube_a + [0, 0, 0.05], OPEN),
            Waypoint(cube_a, OPEN, tolerance=0.005),
            Waypoint(cube_a, CLOSED, steps=GRIP_STEPS),
            Waypoint(on_b + [0, 0, 0.05], CLOSED),
            Waypoint(on_b + [0, 0, 0.003], CLOSED, tolerance=0.005),
            Waypoint(on_b, OPEN, steps=GRIP_STEPS),
            Waypoint(on_b + [0, 0, 0.05], OPEN),
        ]

    def lost(self, scene: Any, tcp: np.ndarray) -> bool:  # carrying cube A, or about to let go of it
        return 3 <= self.phase <= 5 and np.linalg.norm(_position(scene.cubeA) - tcp) > CARRIED_M


EXPERTS = {cls.task: cls for cls in (PickCubeExpert, PushCubeExpert, StackCubeExpert)}


def make_expert(task: str, control_mode: str, action_noise: float = 0.0, seed: int = 0) -> ScriptedExpert:
    if task not in EXPERTS:
        raise ConfigError(f"no scripted expert for '{task}'; there are: {', '.join(sorted(EXPERTS))}")
    if control_mode != CONTROL_MODE:
        raise ConfigError(f"the scripted experts act through env.control_mode={CONTROL_MODE}, not '{control_mode}'")
    if action_noise < 0:
        raise ConfigError(f"action_noise must be >= 0, got {action_noise}")
    return EXPERTS[task](action_noise, seed)
