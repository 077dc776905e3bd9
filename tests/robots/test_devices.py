"""Cameras through real OpenCV (a video file stands in for the USB device), the lerobot
adapter over a stand-in device with lerobot's robot API, and the e-stop keys."""

import os
import threading
import time

import cv2
import numpy as np
import pytest

from embodied.core.errors import ConfigError
from embodied.robot_cli import KeyboardMonitor
from embodied.robots.base import RobotError
from embodied.robots.cameras import CameraConfig, CameraError, OpenCVCamera, fit_image
from embodied.robots.lerobot_robot import LeRobotConfig, LeRobotRobot
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = tmp_path_factory.mktemp("camera") / "feed.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30, (160, 120))
    for i in range(30):
        frame = np.zeros((120, 160, 3), dtype=np.uint8)
        frame[:, :, 2] = 200  # BGR red
        frame[:, 60:100, 1] = 8 * i
        writer.write(frame)
    writer.release()
    return path


def test_camera_keeps_the_latest_frame_in_rgb_at_the_policy_size(video):
    camera = OpenCVCamera(CameraConfig(source=str(video), size=[64, 64], fps=100, loop=True), "front")
    camera.connect()
    try:
        first, first_time = camera.read_latest()
        wait_until(lambda: camera.frames_captured > 2 and camera.read_latest()[1] > first_time, "newer frames")
        second, second_time = camera.read_latest()
        assert first.shape == (64, 64, 3) and first.dtype == np.uint8
        assert first[..., 0].mean() > 150 and first[..., 2].mean() < 50  # red arrives as RGB
        assert second_time > first_time and camera.frames_captured > 2
    finally:
        camera.disconnect()


def test_a_stalled_camera_is_an_error_not_a_stale_frame(video):
    camera = OpenCVCamera(CameraConfig(source=str(video), fps=1000, loop=False), "front")
    camera.connect()
    try:
        wait_until(lambda: camera.frames_captured >= 30, "the 30 frames of the file")  # then none come
        newest = lambda: camera.read_latest(max_age_s=float("inf"))[1]  # noqa: E731
        wait_until(lambda: time.monotonic() - newest() > 0.1, "the newest frame to be 0.1 s old")
        with pytest.raises(CameraError, match="old"):
            camera.read_latest(max_age_s=0.1)
    finally:
        camera.disconnect()
    with pytest.raises(CameraError, match="cannot open"):
        OpenCVCamera(CameraConfig(source=str(video) + ".missing")).connect()


def test_fit_image_center_crops_to_the_target_aspect():
    frame = np.zeros((100, 200, 3), dtype=np.uint8)
    frame[:, 50:150] = 255  # the centre square
    fitted = fit_image(frame, (50, 50))
    assert fitted.shape == (50, 50, 3) and fitted.min() == 255


class StandInArm:
    """Hardware stand-in with lerobot's robot API: flat feature dicts, dict actions."""

    name = "so101_follower"

    def __init__(self):
        self.joints = {"shoulder.pos": 10.0, "elbow.pos": -5.0, "gripper.pos": 30.0}
        self.is_connected = False
        self.sent = []

    @property
    def observation_features(self):
        return {**{key: float for key in self.joints}, "front": (48, 64, 3)}

    @property
    def action_features(self):
        return {key: float for key in self.joints}

    def connect(self):
        self.is_connected = True

    def disconnect(self):
        self.is_connected = False

    def get_observation(self):
        return {**self.joints, "front": np.full((48, 64, 3), 7, dtype=np.uint8)}

    def send_action(self, action):
        self.sent.append(action)
        return {key: min(value, 90.0) for key, value in action.items()}  # the arm's own clipping


def lerobot_config(**overrides):
    return LeRobotConfig(
        **{
            "action_low": [-100, -100, 0],
            "action_high": [100, 100, 100],
            "control_hz": 30.0,
            "image_size": [32, 32],
            **overrides,
        }
    )


def test_lerobot_robot_maps_features_to_state_images_and_actions():
    arm = StandInArm()
    robot = LeRobotRobot(arm, lerobot_config())
    assert robot.spec.state_dim == 3 and robot.spec.action_dim == 3
    assert robot.spec.image_shapes == {"front": (32, 32, 3)}  # known before connect
    with pytest.raises(RobotError, match="not connected"):
        robot.get_observation()
    with robot:
        observation = robot.get_observation()
        np.testing.assert_allclose(observation.state, [10.0, -5.0, 30.0])
        assert observation.images["front"].shape == (32, 32, 3)
        sent = robot.send_action(np.array([95.0, -150.0, 50.0]))
        assert arm.sent[-1] == {"shoulder.pos": 95.0, "elbow.pos": -100.0, "gripper.pos": 50.0}
        np.testing.assert_allclose(sent, [90.0, -100.0, 50.0])  # what the arm reports it did
        arm.joints["elbow.pos"] = 12.0  # the arm moved since the last observation
        np.testing.assert_allclose(robot.hold_action(), [10.0, 12.0, 30.0])  # hold where it is now
    assert not arm.is_connected


def test_lerobot_robot_needs_one_bound_per_action_feature():
    with pytest.raises(ConfigError, match="shoulder.pos, elbow.pos, gripper.pos"):
        LeRobotRobot(StandInArm(), lerobot_config(action_low=[-1]))


def test_keys_latch_and_reset_the_estop_and_quit():
    read_fd, write_fd = os.pipe()
    events = []
    quit_requested = threading.Event()
    actions = {"e": lambda: events.append("estop"), "r": lambda: events.append("reset"), "q": quit_requested.set}
    with KeyboardMonitor(actions, fd=read_fd, force=True):
        os.write(write_fd, b"exrq")
        assert quit_requested.wait(2.0)
    assert events == ["estop", "reset"]
    os.close(read_fd)
    os.close(write_fd)


class StandInLeRobotCamera:
    """Hardware stand-in with lerobot's camera API."""

    def __init__(self, frames):
        self.frames = frames
        self.is_connected = False

    def connect(self):
        self.is_connected = True

    def async_read(self, timeout_ms):
        if not self.frames:
            raise TimeoutError(f"no frame within {timeout_ms} ms")
        return self.frames.pop(0)

    def disconnect(self):
        self.is_connected = False


def test_a_lerobot_camera_reads_through_our_camera_interface():
    from embodied.robots.lerobot_robot import LeRobotCamera

    camera = LeRobotCamera(StandInLeRobotCamera([np.full((60, 80, 3), 9, np.uint8)]), "wrist", size=(30, 30))
    camera.connect()
    frame, timestamp = camera.read_latest()
    assert frame.shape == (30, 30, 3) and frame.max() == 9 and timestamp > 0
    with pytest.raises(CameraError, match="'wrist': no frame"):
        camera.read_latest()
    camera.disconnect()
    assert not camera.camera.is_connected
