"""Teleoperation: the oracle and keyboard devices, and interventions in the robot client."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from embodied.core.errors import ConfigError
from embodied.robots.client import RobotClient, RobotClientConfig
from embodied.robots.policy_client import PolicyClient
from embodied.robots.safety import SafetyConfig
from embodied.robots.sim_robot import SimRobot, SimRobotConfig
from embodied.robots.teleop import KeyboardTeleop, OracleTeleop
from tests.robots.test_deploy import start_server

ROOT = Path(__file__).resolve().parents[2]


def test_the_oracle_takes_over_after_patience_and_hands_back_after_agreement():
    oracle = OracleTeleop(lambda robot: np.array([1.0]), threshold=0.5, patience=2, release=3)
    far, near = np.array([-1.0]), np.array([0.9])
    assert not oracle.poll(None, far).intervening  # one tick of drift is within patience
    command = oracle.poll(None, far)
    assert command.intervening and command.action.tolist() == [1.0]
    assert [oracle.poll(None, near).intervening for _ in range(3)] == [True, True, False]
    assert not oracle.poll(None, None).intervening  # no policy action: one tick of patience


def test_keyboard_keys_toggle_intervention_move_and_label():
    keyboard = KeyboardTeleop(action_dim=4, step=0.5)
    keyboard.keys["w"]()
    assert keyboard.poll(None, None).action is None  # not intervening yet
    for key in "iwwdcy":
        keyboard.keys[key]()
    command = keyboard.poll(None, None)
    assert command.intervening and command.events == ["success"]
    np.testing.assert_allclose(command.action, [1.0, -0.5, 0.0, -1.0])  # two w, one d, gripper flipped
    np.testing.assert_allclose(keyboard.poll(None, None).action, [0.0, 0.0, 0.0, -1.0])  # presses are used once


def test_interventions_replace_the_policy_action_and_are_logged_with_both_actions(tmp_path):
    robot = SimRobot(SimRobotConfig(env={"name": "gymnasium", "task": "Pendulum-v1"}))

    def zeros(observation):
        return np.zeros((observation.batch_size, 1, 1), np.float32)

    server, shutdown = start_server(robot.spec, 1, zeros, "zeros")
    oracle = OracleTeleop(lambda robot: np.array([1.5]), threshold=0.5, patience=3, release=5)
    config = RobotClientConfig(
        server=server.endpoint,
        episodes=1,
        max_episode_steps=40,
        control_hz=100.0,
        output=str(tmp_path),
        safety=SafetyConfig(safe_action="zero"),
    )
    try:
        summary = RobotClient(robot, PolicyClient(server.endpoint, robot.spec), config, tmp_path, teleop=oracle).run()
    finally:
        shutdown()
    lines = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    # A stall skips ticks rather than catching up, so a loaded machine logs fewer than 40.
    assert len(lines) == 40 - summary["overrun_ticks"] > 3
    operated = lines[2:]  # the oracle drove from its third look on (patience 3) to the end
    assert summary["teleop_ticks"] == len(operated)
    assert all(
        line["source"] == "teleop" and line["intervened"] and line["executed_action"] == [1.5] for line in operated
    )
    # The policy's action is logged beside the operator's on ticks where the policy had one
    # (a reply that misses its tick leaves none, so a loaded machine may skip a few).
    with_policy = [line["policy_action"] for line in operated if "policy_action" in line]
    assert with_policy and all(action == [0.0] for action in with_policy)
    # Before the operator took over, the robot acted on the policy's action, or held its last
    # command on a tick whose reply came late (source "none"); nothing was an intervention.
    assert all(line["source"] in ("policy", "none") and not line["intervened"] for line in lines[:2])


class StandInGamepad:
    """Hardware stand-in with pygame's joystick API."""

    def __init__(self):
        self.axes = [0.0] * 6
        self.buttons = [0] * 8

    def get_axis(self, axis):
        return self.axes[axis]

    def get_button(self, button):
        return self.buttons[button]


def test_gamepad_hold_intervenes_only_while_held_and_maps_the_sticks():
    from embodied.robots.teleop import GamepadTeleop

    pad = StandInGamepad()
    gamepad = GamepadTeleop(pad, action_dim=4, intervention="hold", scale=0.5)
    pad.axes[0], pad.axes[1], pad.axes[4] = 1.0, -1.0, 0.05  # right, up, inside the dead zone
    assert gamepad.poll(None, None).action is None
    pad.buttons[GamepadTeleop.INTERVENE] = 1
    command = gamepad.poll(None, None)
    assert command.intervening
    np.testing.assert_allclose(command.action, [0.5, 0.5, 0.0, 1.0])
    pad.buttons[GamepadTeleop.INTERVENE] = 0
    assert not gamepad.poll(None, None).intervening


def test_gamepad_toggle_flips_on_each_press_and_events_fire_once_per_press():
    from embodied.robots.teleop import GamepadTeleop

    pad = StandInGamepad()
    gamepad = GamepadTeleop(pad, action_dim=2, intervention="toggle")
    pad.buttons[GamepadTeleop.INTERVENE] = 1
    pad.buttons[GamepadTeleop.SUCCESS] = 1
    first, held = gamepad.poll(None, None), gamepad.poll(None, None)
    assert first.intervening and held.intervening
    assert first.events == ["success"] and held.events == []
    pad.buttons[GamepadTeleop.INTERVENE] = 0
    assert gamepad.poll(None, None).intervening  # released: still on
    pad.buttons[GamepadTeleop.INTERVENE] = 1
    assert not gamepad.poll(None, None).intervening  # pressed again: off


def test_an_oracle_with_a_takeover_limit_corrects_and_lets_go_per_env():
    from embodied.robots.teleop import OracleRule

    rule = OracleRule(threshold=0.5, patience=2, release=100, envs=2, max_takeover=3)
    policy, expert = np.array([[1.0], [0.0]]), np.zeros((2, 1))  # env 0 always drifts, env 1 agrees
    driven = [rule.step(policy, expert).tolist() for _ in range(9)]
    assert [d[0] for d in driven] == [False, True, True, True, False, False, True, True, True]  # patience again
    assert not any(d[1] for d in driven)
    rule.reset(np.array([True, False]))
    assert not rule.step(policy, expert)[0]  # a new episode starts with the policy in charge


class StandInSpaceMouse:
    """Hardware stand-in with pyspacemouse's device API: read() -> state."""

    def __init__(self):
        self.state = SimpleNamespace(x=0.0, y=0.0, z=0.0, roll=0.0, pitch=0.0, yaw=0.0, buttons=[0, 0])

    def read(self):
        return SimpleNamespace(**vars(self.state))


def test_spacemouse_intervenes_while_moved_and_lingers_then_hands_back():
    from embodied.robots.teleop import SpaceMouseTeleop

    mouse = StandInSpaceMouse()
    teleop = SpaceMouseTeleop(mouse, action_dim=7, intervention="motion", scale=0.5, linger=2)
    assert not teleop.poll(None, None).intervening
    mouse.state.x, mouse.state.yaw, mouse.state.z = 1.0, -0.4, 0.01  # z inside the dead zone
    command = teleop.poll(None, None)
    assert command.intervening
    np.testing.assert_allclose(command.action, [0.5, 0.0, 0.0, 0.0, 0.0, -0.2, 1.0])
    mouse.state.x = mouse.state.yaw = 0.0
    mouse.state.buttons = [1, 0]  # left: gripper closes
    lingering = [teleop.poll(None, None) for _ in range(3)]
    assert [c.intervening for c in lingering] == [True, True, False]
    assert lingering[0].action.tolist() == [0.0] * 6 + [-1.0]
    teleop.keys["y"]()
    assert teleop.poll(None, None).events == ["success"]


def test_spacemouse_with_a_button_toggles_and_a_4d_action_moves_only_position():
    from embodied.robots.teleop import SpaceMouseTeleop

    mouse = StandInSpaceMouse()
    teleop = SpaceMouseTeleop(mouse, action_dim=4, intervention="toggle")
    mouse.state.roll, mouse.state.y = 1.0, 0.5
    assert not teleop.poll(None, None).intervening  # moving alone does not intervene in this mode
    mouse.state.buttons = [0, 1]
    command = teleop.poll(None, None)
    assert command.intervening and command.action.tolist() == [0.0, 0.5, 0.0, 1.0]
    mouse.state.buttons = [0, 0]
    assert teleop.poll(None, None).intervening  # released: still on
    with pytest.raises(ConfigError, match="motion, hold or toggle"):
        SpaceMouseTeleop(mouse, action_dim=4, intervention="sometimes")


def test_a_spacemouse_that_cannot_be_opened_is_a_clear_error():
    from embodied.robot_cli import build_teleop
    from embodied.robots.teleop import TeleopConfig

    with pytest.raises(ConfigError, match="(?i)spacemouse"):
        build_teleop(TeleopConfig(name="spacemouse", intervention="motion"), action_dim=7)


def test_every_operator_device_is_registered_and_a_misspelled_one_names_the_closest():
    from embodied.core.registry import TELEOPS
    from embodied.robot_cli import build_teleop
    from embodied.robots.teleop import TeleopConfig

    assert TELEOPS.names() == ["gamepad", "keyboard", "leader", "oracle", "spacemouse"]
    assert sorted(p.stem for p in (ROOT / "configs" / "teleop").glob("*.yaml")) == TELEOPS.names()
    assert isinstance(build_teleop(TeleopConfig(name="keyboard"), action_dim=4), KeyboardTeleop)
    with pytest.raises(ConfigError, match=r"unknown teleop 'keybaord'.*Did you mean 'keyboard'"):
        build_teleop(TeleopConfig(name="keybaord"), action_dim=4)


class StandInLeader:
    """lerobot's Teleoperator API (a leader arm is hardware this machine does not have)."""

    def __init__(self, pose):
        self.action_features = {"shoulder.pos": float, "elbow.pos": float, "gripper.pos": float}
        self.pose = dict(pose)
        self.is_connected = True

    def get_action(self):
        return dict(self.pose)

    def disconnect(self):
        self.is_connected = False


class FollowerAt:
    def __init__(self, pose):
        self.pose = np.asarray(pose, np.float32)

    def hold_action(self):
        return self.pose


def test_a_leader_arm_takes_over_only_once_it_matches_the_follower_and_drives_by_joint_name():
    from embodied.robots.leader_arm import LeaderArmTeleop

    leader = StandInLeader({"shoulder.pos": 40.0, "elbow.pos": 0.0, "gripper.pos": 10.0})
    names = ["elbow.pos", "shoulder.pos", "gripper.pos"]  # the follower's order, not the leader's
    teleop = LeaderArmTeleop(leader, action_dim=3, action_names=names, engage_tolerance=5.0)
    follower = FollowerAt([0.0, 0.0, 10.0])  # elbow, shoulder, gripper
    assert not teleop.poll(follower, None).intervening
    teleop.keys["i"]()  # asked to take over, but the shoulder is 40 off: no jump
    assert not teleop.poll(follower, None).intervening
    leader.pose["shoulder.pos"] = 3.0
    command = teleop.poll(follower, None)
    assert command.intervening and command.action.tolist() == [0.0, 3.0, 10.0]
    leader.pose["shoulder.pos"] = 30.0  # once engaged, it drives wherever the operator moves it
    assert teleop.poll(follower, None).action.tolist() == [0.0, 30.0, 10.0]
    teleop.keys["i"]()
    assert not teleop.poll(follower, None).intervening
    teleop.keys["y"]()
    assert teleop.poll(follower, None).events == ["success"]
    teleop.close()
    assert not leader.is_connected

    with pytest.raises(ConfigError, match="no reading for the robot's actions wrist.pos"):
        LeaderArmTeleop(leader, action_dim=3, action_names=["wrist.pos", "elbow.pos", "gripper.pos"])
    with pytest.raises(ConfigError, match="match one to one"):
        LeaderArmTeleop(leader, action_dim=2)  # a robot without names: the leader's order, same size


def test_a_leader_arm_drives_a_simulated_robot_in_collect_mode(tmp_path):
    from embodied.robots.leader_arm import LeaderArmTeleop
    from embodied.robots.policy_client import NoPolicy

    robot = SimRobot(SimRobotConfig(env={"name": "gymnasium", "task": "Pendulum-v1"}))
    leader = StandInLeader({"shoulder.pos": 1.25, "elbow.pos": 0.0, "gripper.pos": 0.0})
    leader.action_features = {"shoulder.pos": float}
    teleop = LeaderArmTeleop(leader, action_dim=1, engage_tolerance=None, driving=True)
    config = RobotClientConfig(
        episodes=1,
        max_episode_steps=10,
        control_hz=100.0,
        output=str(tmp_path),
        safety=SafetyConfig(safe_action="zero"),
    )
    summary = RobotClient(robot, NoPolicy(), config, tmp_path, teleop=teleop).run()
    lines = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert summary["teleop_ticks"] == len(lines) == 10 - summary["overrun_ticks"] > 0  # a stall skips ticks
    assert all(line["source"] == "teleop" and line["executed_action"] == [1.25] for line in lines)


def test_a_leader_arm_without_lerobot_is_a_clear_error():
    from embodied.robot_cli import build_teleop
    from embodied.robots.teleop import TeleopConfig

    with pytest.raises(ConfigError, match="teleop=leader needs lerobot"):
        build_teleop(TeleopConfig(name="leader", leader={"type": "so101_leader", "port": "/dev/null"}), action_dim=6)
    with pytest.raises(ConfigError, match="'type'"):
        build_teleop(TeleopConfig(name="leader"), action_dim=6)
