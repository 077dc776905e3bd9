"""The protocol's message bodies, defined once in `embodied.core.messages`, held to what the
real senders build: every message of a procs training run (env and learner channels) and
of a robot feeding a learning server (policy channel), recorded in every process they
start, fits its definition."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from embodied.core.messages import BODIES, CHANNELS, check_body, definitions, protocol_page
from embodied.core.types import EnvSpec
from tests.cli import embodied

ROOT = Path(__file__).resolve().parents[2]

# Loaded at start-up by every Python process the tests start (PYTHONPATH): records the kind
# and field types of each message the process encodes, one JSON line per message.
RECORDER = textwrap.dedent("""
    import json, os
    import embodied.core.protocol as protocol

    def _type(value):
        import numpy
        if isinstance(value, numpy.ndarray):
            return "array"
        return {bool: "bool", int: "int", float: "float", str: "str", dict: "map", list: "list",
                type(None): "null"}.get(type(value), type(value).__name__)

    _log = open(os.path.join(os.environ["EMBODIED_MESSAGE_LOG"], f"{os.getpid()}.jsonl"), "a", buffering=1)
    _envelope = protocol._envelope

    def _recording(message):
        body = message.body
        fields = {key: _type(value) for key, value in body.items()} if isinstance(body, dict) else _type(body)
        _log.write(json.dumps({"kind": message.kind, "fields": fields}) + "\\n")
        return _envelope(message)

    protocol._envelope = _recording
""")

SAMPLES = {
    "bool": True,
    "int": 0,
    "float": 0.5,
    "str": "",
    "map": {},
    "list": [],
    "null": None,
    "array": np.zeros(1, np.float32),
}


def recorded(log_dir: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(log_dir.glob("*.jsonl")) for line in path.read_text().splitlines()]


def fits_some_channel(message: dict) -> list[str]:
    """What is wrong with a recorded message ([] if it fits a definition on some channel)."""
    fields = message["fields"]
    body = {key: SAMPLES.get(kind, object()) for key, kind in fields.items()} if isinstance(fields, dict) else fields
    problems = {
        channel: check_body(channel, message["kind"], body)
        for channel in CHANNELS
        if definitions(channel, message["kind"])
    }
    return [] if not problems or any(not found for found in problems.values()) else sum(problems.values(), [])


@pytest.fixture
def recording(tmp_path):
    """An environment for subprocesses whose messages are recorded under tmp_path/messages."""
    site, log_dir = tmp_path / "site", tmp_path / "messages"
    site.mkdir()
    log_dir.mkdir()
    (site / "sitecustomize.py").write_text(RECORDER)
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "EMBODIED_MESSAGE_LOG": str(log_dir),
    }
    return environment, log_dir


def test_the_protocol_page_is_generated_from_the_definitions():
    page = (ROOT / "docs" / "protocol.md").read_text()
    assert page == protocol_page(), "regenerate it: python -m embodied.core.messages > docs/protocol.md"
    for body in BODIES:
        assert f"### `{body.kind}` from the {body.sender}" in page


def test_every_definition_names_a_handler_that_exists_and_a_known_channel():
    for body in BODIES:
        assert body.channel in CHANNELS
        module, _, qualified = body.handler.partition(":")
        target = importlib.import_module(module)
        for part in qualified.split("."):
            target = getattr(target, part)
        assert callable(target), body.handler


def test_a_body_that_breaks_its_definition_is_told_apart():
    hello = {"protocol": 1, "role": "robot", "name": "arm", "session": "s", "spec": {}}
    assert check_body("policy", "hello", hello) == []
    assert check_body("policy", "hello", {**hello, "extra": 1}) == [
        "robot client's hello: 'extra' is not a field of it"
    ]
    assert check_body("policy", "hello", {k: v for k, v in hello.items() if k != "spec"}) == [
        "robot client's hello: 'spec' is missing"
    ]
    assert check_body("policy", "hello", {**hello, "protocol": "1"}) == [
        "robot client's hello: 'protocol' should be int, got str"
    ]
    assert check_body("policy", "hello", [1]) == ["robot client's hello: the body is a list, not a map"]
    assert check_body("env", "infer", {}) == ["no 'infer' message is defined on the env channel"]
    # Two senders of one kind: a body fits if it fits either.
    assert check_body("policy", "heartbeat", {"time": 1.0}) == []
    assert check_body("policy", "heartbeat", {"time": 1.0, "clients": 1}) == [
        "robot client's heartbeat: 'clients' is not a field of it",
        "policy server's heartbeat: 'requests' is missing",
        "policy server's heartbeat: 'policy_version' is missing",
    ]


def test_the_recorder_sees_what_a_policy_server_and_its_client_send(recording):
    """In one process, to show the recorder works before trusting what it did not see."""
    environment, log_dir = recording
    script = textwrap.dedent("""
        import threading
        import numpy as np
        from embodied.core.types import EnvSpec
        from embodied.robots.policy_client import PolicyClient
        from embodied.runtime.policy_server import PolicyServer, ServeConfig

        spec = EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0), control_hz=20.0)
        infer = lambda observation, prefix=None: np.zeros((observation.batch_size, 4, 2), np.float32)
        server = PolicyServer(infer, spec, {"policy": "zeros", "policy_version": 0, "chunk_size": 4,
                                            "normalization_id": None, "deterministic": True, "checkpoint": "x",
                                            "realtime_chunking": True},
                              ServeConfig(endpoint="tcp://127.0.0.1:*", stats_every_s=0))
        stop = threading.Event()
        thread = threading.Thread(target=server.serve_forever, args=(stop.is_set,), daemon=True)
        thread.start()
        client = PolicyClient(server.endpoint, spec)
        actions = client.infer({"state": np.zeros(3, np.float32)}, "hold", timeout_s=10)
        assert actions.shape == (4, 2)
        from embodied.robots.base import RobotObservation
        pending = (np.zeros((2, 2), np.float32), 1)  # real-time chunking's pending actions and delay
        assert client.request(RobotObservation(state=np.zeros(3, np.float32)), 5, "hold", pending=pending)
        reply = None
        while reply is None:
            reply = client.poll(5.0)
        client.ping()
        client.close()
        stop.set()
        thread.join(5)
        server.close()
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    messages = recorded(log_dir)
    kinds = [m["kind"] for m in messages if m["kind"] != "heartbeat"]
    assert kinds == ["hello", "welcome", "infer", "action", "infer", "action", "close"]
    assert [{"pending", "delay"} <= set(m["fields"]) for m in messages if m["kind"] == "infer"] == [False, True]
    assert {m["kind"] for m in messages} == {"hello", "welcome", "infer", "action", "heartbeat", "close"}
    assert all(not fits_some_channel(m) for m in messages), [fits_some_channel(m) for m in messages]


TINY = [
    "runtime.heartbeat_s=0.2",
    "runtime.peer_timeout_s=5",
    "policy.actor_hidden=[16]",
    "policy.critic_hidden=[16]",
    "algo.rollout_steps=4",
    "algo.update_epochs=1",
    "algo.num_minibatches=2",
    "logger.progress_bar=false",
    "logger.tensorboard=false",
    "eval_episodes=0",
]


@pytest.mark.slow
def test_a_procs_run_sends_only_defined_bodies_on_the_env_and_learner_channels(recording, tmp_path):
    environment, log_dir = recording
    result = embodied(
        "train",
        "runtime=procs",
        "env.num_envs=2",
        "env.num_workers=1",
        "env.transport=zmq",
        "total_env_steps=16",
        *TINY,
        f"run_dir={tmp_path / 'run'}",
        check=False,
        env=environment,
        inherit_env=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    messages = recorded(log_dir)
    wrong = [(m, fits_some_channel(m)) for m in messages if fits_some_channel(m)]
    assert not wrong, wrong[:5]
    kinds = {m["kind"] for m in messages}
    assert {"hello", "welcome", "command", "result", "trajectory", "ack", "weights", "close"} <= kinds


@pytest.mark.slow
def test_a_robot_and_a_learning_server_send_only_defined_bodies_on_the_policy_channel(recording, tmp_path):
    from tests.embodied.test_robots_runtime import LEARNER, learn_from_a_robot

    environment, log_dir = recording
    run_dir = tmp_path / "run"
    learn_from_a_robot(
        [*LEARNER, "total_env_steps=20", f"run_dir={run_dir}"], run_dir, tmp_path / "robot", env=environment
    )
    messages = recorded(log_dir)
    wrong = [(m, fits_some_channel(m)) for m in messages if fits_some_channel(m)]
    assert not wrong, wrong[:5]
    welcome = next(m for m in messages if m["kind"] == "welcome")
    assert welcome["fields"]["learning"] == "bool" and welcome["fields"]["outcome_cameras"] == "list"
    assert {"hello", "welcome", "infer", "action", "episode", "ack"} <= {m["kind"] for m in messages}


@pytest.mark.slow
def test_infer_is_one_blocking_call_and_says_when_no_server_answers():
    from embodied.robots.policy_client import PolicyClient, ServerError
    from embodied.runtime.policy_server import PolicyServer, ServeConfig
    from tests.robots.test_deploy import free_endpoint

    spec = EnvSpec(state_dim=3, action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0), control_hz=20.0)

    def echo(observation):
        return np.repeat(observation.state[:, None, :2], 3, axis=1)

    server = PolicyServer(
        echo,
        spec,
        {"policy": "echo", "policy_version": 1, "chunk_size": 3},
        ServeConfig(endpoint="tcp://127.0.0.1:*", stats_every_s=0),
    )
    stop = threading.Event()
    thread = threading.Thread(target=server.serve_forever, args=(stop.is_set,), daemon=True)
    thread.start()
    client = PolicyClient(server.endpoint, spec, request_timeout_s=10.0)
    try:
        for value in (0.25, -0.5):
            actions = client.infer({"state": np.full(3, value, np.float32)}, "hold")
            np.testing.assert_array_equal(actions, np.full((3, 2), value, np.float32))
        with pytest.raises(ServerError, match="malformed"):  # a wrong state is refused, not waited on
            client.infer({"state": np.zeros(5, np.float32)})
    finally:
        client.close()
        stop.set()
        thread.join(5)
        server.close()
    silent = PolicyClient(free_endpoint(), spec, request_timeout_s=0.5)
    with pytest.raises(ServerError, match="no policy server answered"):
        silent.infer({"state": np.zeros(3, np.float32)})
    silent.close()
