"""Recording episodes as LeRobotDatasets with the real library, from the robot client."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import psutil
import pytest

from embodied.core.types import EnvSpec
from embodied.robots.client import RobotClient, RobotClientConfig
from embodied.robots.policy_client import PolicyClient
from embodied.robots.recording import DatasetRecorder, RecordingConfig, RecordingError, writer_python
from embodied.robots.safety import SafetyConfig
from embodied.robots.sim_robot import SimRobot, SimRobotConfig
from embodied.robots.teleop import OracleTeleop
from tests.robots.test_deploy import start_server

CAMERA_SPEC = EnvSpec(
    state_dim=3,
    action_dim=2,
    action_low=(-1.0, -1.0),
    action_high=(1.0, 1.0),
    image_shapes={"front": (24, 32, 3)},
    control_hz=10.0,
)


# One reader per test module, under the writer's interpreter: the real library reads each
# dataset back (importing it costs about 10 s, so it is imported once, not per dataset).
READER = """
import json, sys, traceback
import numpy as np
from embodied.robots.dataset_writer import import_lerobot_dataset
LeRobotDataset = import_lerobot_dataset()
for line in sys.stdin:
    root, out = json.loads(line)
    try:
        dataset = LeRobotDataset("local/robot", root=root)
        frames = [dataset[i] for i in range(dataset.num_frames)]
        arrays = {"num_episodes": np.array(dataset.num_episodes), "num_frames": np.array(dataset.num_frames)}
        for key in (frames[0] if frames else {}):
            values = [f[key] for f in frames]
            arrays[key] = np.array(values) if key == "task" else np.stack([np.asarray(v) for v in values])
        np.savez(out, **arrays)
        print(json.dumps({"ok": True}), flush=True)
    except Exception:
        print(json.dumps({"error": traceback.format_exc()}), flush=True)
"""


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf")  # the library caches reads under HF_HOME
    process = subprocess.Popen(
        [writer_python(RecordingConfig(dataset=str(cache))), "-c", READER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HOME": str(cache), "HF_HUB_OFFLINE": "1"},
    )
    yield process
    process.stdin.close()  # the reader's loop ends
    try:
        process.wait(timeout=300)
    finally:
        process.kill()


@pytest.fixture(autouse=True)
def dataset_cache(tmp_path, monkeypatch, reader):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # what the writers cache stays in the test's folder
    monkeypatch.setattr(Reloaded, "reader", reader)


class Reloaded:
    """A dataset as the real library reads it back, under the writer's interpreter."""

    reader: subprocess.Popen | None = None  # the module's reader (the fixture sets it)

    def __init__(self, root):
        with tempfile.TemporaryDirectory() as folder:  # the frames are read into memory, then removed
            out = Path(folder) / "frames.npz"
            self.reader.stdin.write(json.dumps([str(root), str(out)]) + "\n")
            self.reader.stdin.flush()
            reply = self.reader.stdout.readline()
            assert reply, f"the dataset reader exited with {self.reader.wait(timeout=60)}"
            assert "error" not in json.loads(reply), json.loads(reply)["error"]
            with np.load(out) as frames:
                self.arrays = dict(frames)
        self.num_episodes = int(self.arrays["num_episodes"])
        self.num_frames = int(self.arrays["num_frames"])

    def __getitem__(self, index):
        return {key: value[index] for key, value in self.arrays.items() if value.ndim and len(value) == self.num_frames}


def load(root):
    return Reloaded(root)


def column(dataset, key):
    """One feature over all frames, one row per frame (the library returns shape-(1,) features as scalars)."""
    values = dataset.arrays[key]
    return values.reshape(len(values), -1) if values.ndim < 2 else values


@pytest.mark.slow
def test_interventions_are_recorded_with_both_actions_and_the_flag(tmp_path):
    """The oracle operator takes over a simulated robot; the dataset holds exactly what the
    robot executed, what the policy wanted and which ticks were the operator's."""
    robot = SimRobot(SimRobotConfig(env={"name": "gymnasium", "task": "Pendulum-v1"}))

    def zeros(observation):
        return np.zeros((observation.batch_size, 1, 1), np.float32)

    server, shutdown = start_server(robot.spec, 1, zeros, "zeros")
    oracle = OracleTeleop(lambda robot: np.array([1.5]), threshold=0.5, patience=3, release=5)
    root = tmp_path / "dataset"
    # 20 Hz: a 50 ms tick leaves a busy machine time to answer every tick (at 100 Hz one answer came late)
    config = RobotClientConfig(
        server=server.endpoint,
        episodes=2,
        max_episode_steps=12,
        control_hz=20.0,
        instruction="swing up",
        safety=SafetyConfig(safe_action="zero"),
        record=RecordingConfig(dataset=str(root)),
    )
    try:
        summary = RobotClient(
            robot, PolicyClient(server.endpoint, robot.spec), config, tmp_path / "run", teleop=oracle
        ).run()
    finally:
        shutdown()
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    executed = [s for s in steps if "executed_action" in s]
    dataset = load(root)
    assert summary["dataset"]["episodes_saved"] == [0, 1] and dataset.num_episodes == 2
    # a tick whose answer came late executes nothing (source "none": the robot keeps its last
    # command), so it is no frame; on a busy machine the first tick of an episode can be one
    lengths = [episode["steps"] for episode in summary["episodes"]]
    assert dataset.num_frames == len(executed) == sum(lengths) and min(lengths) >= 10, lengths
    assert summary["action_sources"]["none"] == config.episodes * config.max_episode_steps - len(executed)
    np.testing.assert_allclose(column(dataset, "action"), [s["executed_action"] for s in executed], atol=1e-5)
    flags = column(dataset, "intervention").reshape(-1)
    assert flags.tolist() == [s["source"] == "teleop" for s in executed] and 0 < flags.sum() < len(executed)
    # the policy's zeros are kept under the operator's actions; a tick its answer missed holds NaN, as logged
    policy = column(dataset, "policy_action").reshape(-1)
    logged = [s["policy_action"][0] if "policy_action" in s else np.nan for s in executed]
    np.testing.assert_array_equal(policy, np.array(logged, np.float32))
    assert np.count_nonzero(policy == 0.0) >= len(executed) - 4
    done = column(dataset, "next.done").reshape(-1)
    assert np.flatnonzero(done).tolist() == [lengths[0] - 1, sum(lengths) - 1]
    assert not column(dataset, "safety_override").any()  # policy and operator actions only
    assert dataset[0]["task"] == "swing up"
    rewards = column(dataset, "next.reward").reshape(-1)
    assert (rewards <= 0).all() and (rewards < 0).any()  # Pendulum's cost, as the robot reported it


@pytest.mark.slow
def test_images_are_kept_exactly_a_rerecorded_episode_is_dropped_and_a_dataset_grows(tmp_path):
    root = tmp_path / "dataset"
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(7, 24, 32, 3), dtype=np.uint8)

    def record(episodes):
        recorder = DatasetRecorder(RecordingConfig(dataset=str(root)), CAMERA_SPEC, 10.0, "stack")
        already = recorder.open()
        try:
            for frames, keep, success in episodes:
                for t in frames:
                    recorder.add(
                        np.full(3, t, np.float32),
                        {"front": images[t]},
                        np.array([t / 10, -t / 10]),
                        None if t % 2 else np.zeros(2),
                        intervention=t % 2 == 1,
                        reward=float(t),
                    )
                recorder.end_episode(success, keep=keep, terminated=success)
        finally:
            recorder.close()
        return already

    assert record([(range(0, 3), True, True), (range(3, 5), False, False)]) == 0  # the second is re-recorded
    assert record([(range(5, 7), True, False)]) == 1  # appended to the same dataset
    dataset = load(root)
    assert dataset.num_episodes == 2 and dataset.num_frames == 5
    kept = [0, 1, 2, 5, 6]
    got = column(dataset, "observation.images.front")  # channels first, scaled to [0, 1]
    np.testing.assert_array_equal(np.round(got.transpose(0, 2, 3, 1) * 255).astype(np.uint8), images[kept])
    np.testing.assert_array_equal(column(dataset, "observation.state")[:, 0], kept)
    assert column(dataset, "intervention").reshape(-1).tolist() == [t % 2 == 1 for t in kept]
    policy = column(dataset, "policy_action")
    assert np.isnan(policy[1]).all() and (policy[0] == 0).all()  # NaN: no policy action that tick
    assert column(dataset, "next.success").reshape(-1).tolist() == [False, False, True, False, False]
    assert column(dataset, "next.terminated").reshape(-1).tolist() == [False, False, True, False, False]


KILLED_CLIENT = """
import os, signal, sys
import numpy as np
from tests.robots.test_recording import CAMERA_SPEC
from embodied.robots.recording import DatasetRecorder, RecordingConfig
recorder = DatasetRecorder(RecordingConfig(dataset=sys.argv[1], partial=sys.argv[2], finalize_every=int(sys.argv[3])),
                           CAMERA_SPEC, 10.0, "stack")
recorder.open()
frame = lambda t: (np.zeros(3), {"front": np.full((24, 32, 3), t, np.uint8)}, np.zeros(2), None, False, 0.0)
for t in range(4):
    recorder.add(*frame(t))
recorder.end_episode(True)
for t in range(3):
    recorder.add(*frame(t))
recorder._flush(done=False, success=False, terminated=False)
recorder._queue.join()  # the writer has the partial episode's frames (a crash loses what is still queued)
print(recorder.process.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # a crash: nothing of ours runs after this
"""


@pytest.mark.parametrize("partial, frames, finalize_every", [("keep", 7, 1), ("discard", 4, 1), ("discard", 4, 3)])
@pytest.mark.slow
def test_a_killed_client_leaves_a_dataset_that_loads(tmp_path, partial, frames, finalize_every):
    """With finalize_every=3 the saved episode was not finalized yet: the writer does it."""
    root = tmp_path / "dataset"
    client = subprocess.run(
        [sys.executable, "-c", KILLED_CLIENT, str(root), partial, str(finalize_every)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert client.returncode == -9, client.stderr
    writer = psutil.Process(int(client.stdout.split()[-1]))
    writer.wait(timeout=120)  # the writer finishes the dataset on its own once the pipe closes
    dataset = load(root)
    assert dataset.num_frames == frames
    assert dataset.num_episodes == (2 if partial == "keep" else 1)


@pytest.mark.slow
def test_finalizing_every_few_episodes_writes_the_same_dataset(tmp_path):
    root = tmp_path / "dataset"
    lengths = [3, 1, 4, 2, 5, 2]  # six episodes: five in a first session, finalized every 2, then one more

    def record(episodes, first):
        recorder = DatasetRecorder(RecordingConfig(dataset=str(root), finalize_every=2), CAMERA_SPEC, 10.0, "stack")
        assert recorder.open() == first
        try:
            for index in episodes:
                for t in range(lengths[index]):
                    recorder.add(
                        np.array([index, t, 0], np.float32),
                        {"front": np.full((24, 32, 3), index, np.uint8)},
                        np.zeros(2),
                        None,
                        intervention=True,
                        reward=0.0,
                    )
                assert recorder.end_episode(True) == index
        finally:
            recorder.close()

    record(range(5), first=0)
    record([5], first=5)
    dataset = load(root)
    assert dataset.num_episodes == 6 and dataset.num_frames == sum(lengths)
    state = column(dataset, "observation.state")
    expected = [(index, t) for index, length in enumerate(lengths) for t in range(length)]
    assert [tuple(row) for row in state[:, :2].astype(int).tolist()] == expected
    assert column(dataset, "episode_index").reshape(-1).tolist() == [index for index, _ in expected]
    with pytest.raises(RecordingError, match="finalize_every"):
        DatasetRecorder(RecordingConfig(dataset=str(root), finalize_every=0), CAMERA_SPEC, 10.0, "stack")


@pytest.mark.slow
def test_a_dataset_of_another_shape_is_refused_with_the_reason(tmp_path):
    root = tmp_path / "dataset"
    recorder = DatasetRecorder(RecordingConfig(dataset=str(root)), CAMERA_SPEC, 10.0, "stack")
    recorder.open()
    recorder.add(np.zeros(3), {"front": np.zeros((24, 32, 3), np.uint8)}, np.zeros(2), None, False, 0.0)
    recorder.end_episode(True)
    recorder.close()
    other = EnvSpec(
        state_dim=5,
        action_dim=2,
        action_low=(-1.0, -1.0),
        action_high=(1.0, 1.0),
        image_shapes={"front": (24, 32, 3)},
        control_hz=10.0,
    )
    with pytest.raises(RecordingError, match="observation.state"):
        DatasetRecorder(RecordingConfig(dataset=str(root)), other, 10.0, "stack").open()
    with pytest.raises(RecordingError, match="state \\(4,\\)"):
        DatasetRecorder(RecordingConfig(dataset=str(root)), CAMERA_SPEC, 10.0, "").add(
            np.zeros(4), {"front": np.zeros((24, 32, 3), np.uint8)}, np.zeros(2), None, False, 0.0
        )
    with pytest.raises(RecordingError, match="whole number of frames per second"):
        DatasetRecorder(RecordingConfig(dataset=str(root)), CAMERA_SPEC, 7.5, "")
    assert load(root).num_episodes == 1  # the refusals left the dataset as it was


def frame(t=0):
    return np.zeros(3), {"front": np.full((24, 32, 3), t, np.uint8)}, np.zeros(2), None, False, 0.0


@pytest.mark.slow
def test_a_dataset_left_without_episodes_can_be_recorded_into_again_and_other_folders_are_refused(tmp_path):
    root = tmp_path / "dataset"
    empty = DatasetRecorder(RecordingConfig(dataset=str(root)), CAMERA_SPEC, 10.0, "stack")
    empty.open()
    empty.add(*frame())
    empty.close()  # Ctrl-C in the first episode: discarded, the dataset holds no episode yet
    recorder = DatasetRecorder(RecordingConfig(dataset=str(root)), CAMERA_SPEC, 10.0, "stack")
    assert recorder.open() == 0
    recorder.add(*frame())
    recorder.end_episode(True)
    recorder.close()
    assert load(root).num_episodes == 1
    with pytest.raises(RecordingError, match="10 fps, this robot at 20"):
        DatasetRecorder(RecordingConfig(dataset=str(root)), CAMERA_SPEC, 20.0, "stack").open()
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.png").write_bytes(b"not a dataset")
    with pytest.raises(RecordingError, match="holds files but no LeRobotDataset"):
        DatasetRecorder(RecordingConfig(dataset=str(other)), CAMERA_SPEC, 10.0, "stack").open()
    assert (other / "cat.png").read_bytes() == b"not a dataset"


@pytest.mark.slow
def test_an_interrupted_save_leaves_a_dataset_that_loads_and_close_does_not_hang(tmp_path):
    root = tmp_path / "dataset"
    recorder = DatasetRecorder(RecordingConfig(dataset=str(root), partial="keep"), CAMERA_SPEC, 10.0, "stack")
    recorder.open()
    for t in range(3):
        recorder.add(*frame(t))
    answer = recorder._read_reply

    def interrupted(kind):
        raise KeyboardInterrupt  # Ctrl-C while the writer saves

    recorder._read_reply = interrupted
    with pytest.raises(KeyboardInterrupt):
        recorder.end_episode(True)
    recorder._read_reply = answer
    assert recorder.broken
    recorder.add(*frame(3))  # a frame of the next episode, unfinished when the run stops
    recorder.close()  # no more requests: the writer finishes on its own when the pipe closes
    dataset = load(root)
    assert dataset.num_episodes == 2 and dataset.num_frames == 4  # the saved one, and the partial one kept


@pytest.mark.slow
def test_embodied_collect_records_what_an_operator_drives_without_a_policy(tmp_path):
    """`embodied collect`: no policy server; the operator (here the oracle, playing a trained
    run) drives the simulated robot from the first tick and every episode is recorded."""
    from tests.embodied.test_sac_rlpd import train_run

    train_run(tmp_path / "expert", "total_env_steps=2")
    root = tmp_path / "demos"
    command = [
        sys.executable,
        "-m",
        "embodied.cli",
        "collect",
        "robot=sim",
        f"robot.env_from={tmp_path / 'expert'}",
        "teleop=oracle",
        f"teleop.operator.policy={tmp_path / 'expert'}",
        "teleop.operator.patience=1",
        f"record.dataset={root}",
        "episodes=2",
        "max_episode_steps=8",
        "control_hz=100",
        f"output={tmp_path / 'run'}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    driven = 16 - summary["overrun_ticks"]  # a stall skips ticks rather than catching up
    assert summary["server"] == "none" and summary["action_sources"]["teleop"] == driven > 0
    dataset = load(root)
    assert dataset.num_episodes == 2 and dataset.num_frames == driven
    assert column(dataset, "intervention").all() and np.isnan(column(dataset, "policy_action")).all()
    missing = subprocess.run(
        command[:4] + ["teleop=keyboard"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert missing.returncode == 2 and "needs record.dataset" in missing.stderr
