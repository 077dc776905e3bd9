"""The README walkthrough through the `embodied` command: train in simulation, serve the
checkpoint, drive the simulated robot with a client whose process cannot import torch."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

from tests.embodied.test_cli import embodied
from tests.robots.test_deploy import client_config, free_endpoint, pendulum_robot, start_server
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

# Run first in a robot-side process: any import of torch fails, as on a robot PC without it.
NO_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not installed on this robot PC")
sys.meta_path.insert(0, NoTorch())
"""
ROBOT_MAIN = (
    NO_TORCH
    + """
from embodied.cli import main
code = main(sys.argv[1:])
assert "torch" not in sys.modules
sys.exit(code)
"""
)


def robot_command(*args):
    return [sys.executable, "-c", ROBOT_MAIN, "robot", *args]


def test_the_robot_side_imports_without_torch():
    modules = [
        "embodied.robots.client",
        "embodied.robot_cli",
        "embodied.robots.policy_client",
        "embodied.robots.safety",
        "embodied.robots.broker",
        "embodied.robots.cameras",
        "embodied.robots.sim_robot",
        "embodied.robots.lerobot_robot",
        "embodied.robots.components",
        "embodied.robots.recording",
        "embodied.robots.teleop",
        "embodied.sim.worker",
        "embodied.sim.gymnasium_env",
        "embodied.cli",
        "embodied.core.security",
    ]
    script = (
        NO_TORCH
        + f"""
import importlib
for name in {modules!r}:
    importlib.import_module(name)
from embodied.cli import main
assert main(["--help"]) == 0
assert "torch" not in sys.modules
print("imported without torch")
"""
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "imported without torch" in result.stdout


def test_the_core_install_pulls_no_torch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    assert "torch" not in core and "safetensors" not in core
    assert any(d.startswith("torch") for d in project["optional-dependencies"]["train"])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "pendulum"
    embodied(
        "train",
        "experiment=mujoco_invertedpendulum",
        "total_env_steps=64",
        "algo.rollout_steps=64",
        "algo.num_minibatches=2",
        "algo.update_epochs=1",
        "eval_episodes=0",
        "logger.progress_bar=false",
        f"run_dir={run_dir}",
    )
    return run_dir


OPENPI = {}  # the served checkpoint's openpi endpoint: its port


@pytest.fixture(scope="module")
def server(trained):
    endpoint = free_endpoint()
    OPENPI["port"] = int(free_endpoint().rsplit(":", 1)[1])
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "embodied.cli",
            "serve",
            f"checkpoint={trained}",
            f"endpoint={endpoint}",
            "stats_every_s=0",
            f"openpi.port={OPENPI['port']}",
            "openpi.observation='observation/state=state'",  # the pendulum has no camera
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        # started as a background job of a script: SIGINT ignored, which the server undoes
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    seen = []  # log lines (stderr, merged in) may come before the server says it serves
    line = process.stdout.readline()
    while line and not line.startswith("serving"):
        seen.append(line)
        line = process.stdout.readline()
    assert line.startswith("serving mlp_gaussian"), "".join(seen[-30:]) + line
    yield endpoint
    process.send_signal(signal.SIGINT)
    assert process.wait(60) == 130  # Ctrl-C ends the server, in about a second


@pytest.mark.slow
def test_train_serve_and_drive_the_simulated_robot(trained, server, tmp_path):
    output = tmp_path / "robot"
    result = subprocess.run(
        robot_command(
            f"robot.env_from={trained}",
            f"server={server}",
            "episodes=3",
            "max_episode_steps=40",
            "control_hz=100",
            f"output={output}",
        ),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((output / "summary.json").read_text())
    assert summary["policy"] == "mlp_gaussian"
    assert [e["episode"] for e in summary["episodes"]] == [0, 1, 2]
    assert summary["action_sources"]["policy"] == sum(e["steps"] for e in summary["episodes"]) > 0
    # chunk 1: every answer was executed, or arrived after its tick had passed and was skipped
    assert summary["round_trip_ms"]["n"] == summary["action_sources"]["policy"] + summary["skipped_actions"]
    assert "3 episodes" in result.stdout


def test_an_openpi_client_is_answered_as_our_own_client_is(server):
    """openpi-client's WebsocketClientPolicy against `embodied serve ... openpi.port=`: the
    same chunk, through the same server, as our PolicyClient gets for the same state."""
    import numpy as np
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from embodied.core.types import EnvSpec
    from embodied.robots.policy_client import PolicyClient

    openpi = WebsocketClientPolicy(host="127.0.0.1", port=OPENPI["port"])
    metadata = openpi.get_server_metadata()
    assert metadata["policy"] == "mlp_gaussian" and metadata["deterministic"] is True
    spec = EnvSpec.from_dict(metadata["spec"])
    ours = PolicyClient(server, spec, name="ours")
    try:
        for state in ([0.0, 0.0, 0.0, 0.0], [0.1, -0.2, 0.3, 0.0]):
            answer = openpi.infer({"observation/state": np.array(state)})["actions"]
            assert answer.shape == (metadata["chunk_size"], 1) and np.abs(answer).max() <= 3.0
            np.testing.assert_array_equal(answer, ours.infer({"state": np.array(state, np.float32)}))
    finally:
        ours.close()


def test_a_served_checkpoint_sends_the_actions_its_training_env_executed(trained, tmp_path):
    """Training clipped each action to the env's bounds before executing it; so does the
    server. A policy whose mean lies far past the bounds trips the robot's bounds check on
    no tick, and the robot is sent exactly the bound."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from embodied.core.types import Observation
    from embodied.robots.client import RobotClient
    from embodied.robots.policy_client import PolicyClient
    from embodied.runs.checkpoint import resolve_checkpoint
    from embodied.runtime.configs import DeviceConfig
    from embodied.serve import ServeConfig, load_checkpoint_policy

    run = tmp_path / "pushing"
    shutil.copytree(trained, run)
    weights_file = resolve_checkpoint(run) / "weights.safetensors"
    weights = load_file(str(weights_file))
    last_bias = max(
        (k for k in weights if k.startswith("actor.") and k.endswith(".bias")), key=lambda k: int(k.split(".")[1])
    )
    weights[last_bias] = weights[last_bias] + 10.0  # InvertedPendulum's bounds are [-3, 3]
    save_file(weights, str(weights_file))

    infer, spec, metadata = load_checkpoint_policy(ServeConfig(checkpoint=str(run), runtime=DeviceConfig(device="cpu")))
    assert spec.action_high == (3.0,)
    actions = infer(Observation(state=np.zeros((2, spec.state_dim), np.float32)))
    np.testing.assert_array_equal(actions, np.full((2, metadata["chunk_size"], 1), 3.0, np.float32))

    server, shutdown = start_server(spec=spec, chunk_size=metadata["chunk_size"], infer=infer)
    robot = pendulum_robot()
    try:
        config = client_config(server.endpoint, tmp_path / "robot", episodes=1, max_episode_steps=20)
        summary = RobotClient(robot, PolicyClient(server.endpoint, robot.spec), config, tmp_path / "robot").run()
    finally:
        shutdown()
    assert summary["action_sources"]["policy"] > 0
    assert summary["safety_interventions"]["bounds"] == 0


def logged_sources(output: Path) -> list[str]:
    """Where each control tick's action came from, as far as the robot's log has it now."""
    sources = []
    for line in (output / "steps.jsonl").read_text().splitlines():
        try:
            sources.append(json.loads(line)["source"])
        except json.JSONDecodeError:  # the line being written
            break
    return sources


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_sigusr1_latches_the_estop_and_sigterm_or_ctrl_c_ends_the_run_cleanly(trained, server, tmp_path, stop):
    """Also where the robot was started with SIGINT ignored (a background job of a script):
    Ctrl-C still ends it."""
    output = tmp_path / "robot"
    process = subprocess.Popen(
        robot_command(
            f"robot.env_from={trained}",
            f"server={server}",
            "episodes=100000",
            "max_episode_steps=40",
            "control_hz=100",
            f"output={output}",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 120
        while not (output / "steps.jsonl").is_file() or not (output / "steps.jsonl").stat().st_size:
            assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
            time.sleep(0.1)
        wait_until(lambda: "policy" in logged_sources(output), "the policy to drive the robot")
        process.send_signal(signal.SIGUSR1)
        wait_until(lambda: logged_sources(output).count("estop") > 10, "the e-stop to hold for 10 ticks")
        process.send_signal(stop)
        out, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, out
    summary = json.loads((output / "summary.json").read_text())
    sources = [json.loads(line)["source"] for line in (output / "steps.jsonl").read_text().splitlines()]
    first_stop = sources.index("estop")
    assert "policy" in sources[:first_stop] and "policy" not in sources[first_stop:]  # latched across episodes
    assert summary["safety_interventions"]["estop"] == sources.count("estop") > 10
    assert "E-STOP (SIGUSR1)" in out


def test_a_trained_run_plays_the_oracles_operator(trained):
    import numpy as np

    from embodied.core.operator import OperatorConfig
    from embodied.robot_cli import build_teleop
    from embodied.robots.sim_robot import SimRobot, SimRobotConfig
    from embodied.robots.teleop import OracleTeleop, TeleopConfig

    operator = OperatorConfig(policy=str(trained), threshold=0.05, patience=1)
    oracle = build_teleop(TeleopConfig(name="oracle", operator=operator), 1)
    assert isinstance(oracle, OracleTeleop)
    with SimRobot(SimRobotConfig(env_from=str(trained))) as robot:
        operated = oracle.operate(robot)
        assert operated.shape == (1,) and np.isfinite(operated).all()
        assert not oracle.poll(robot, operated).intervening  # the operator agrees with itself
        assert oracle.poll(robot, operated + 1.0).intervening


def test_operator_and_recording_are_chosen_from_the_command_line():
    from embodied.robot_cli import load_client_config

    config = load_client_config(["teleop=gamepad", "teleop.intervention=toggle", "record.dataset=/data/pick"])
    assert (config.teleop.name, config.teleop.intervention) == ("gamepad", "toggle")
    assert config.record.dataset == "/data/pick" and config.record.partial == "discard"
    plain = load_client_config([])
    assert plain.teleop is None and plain.record.dataset is None
