"""Robot client <-> policy server on loopback, with real ZeroMQ sockets and a simulated robot."""

import json
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from embodied.core.protocol import Message
from embodied.core.sockets import EndpointError, receive, send
from embodied.core.types import EnvSpec, Observation
from embodied.robots.client import BrokerConfig, RobotClient, RobotClientConfig
from embodied.robots.policy_client import PolicyClient, ServerError
from embodied.robots.safety import SafetyConfig, WorkspaceConfig
from embodied.robots.sim_robot import SimRobot, SimRobotConfig
from embodied.runtime.policy_server import PolicyServer, ServeConfig
from tests.waiting import wait_until

SPEC = EnvSpec(state_dim=4, action_dim=2, action_low=(-3.0, -3.0), action_high=(3.0, 3.0), control_hz=25.0)
PENDULUM = {"name": "gymnasium", "task": "InvertedPendulum-v4"}


def free_endpoint() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def echo(chunk_size: int, action_dim: int):
    """Actions that tell each client its own state back: action[c] = state[:A] + c."""

    def infer(observation: Observation) -> np.ndarray:
        base = observation.state[:, None, :action_dim]
        return base + np.arange(chunk_size, dtype=np.float32)[None, :, None]

    return infer


def start_server(spec=SPEC, chunk_size=2, infer=None, policy="echo", metadata=None, **config):
    """A policy server in a thread (default policy: `echo`); returns it and its shutdown.
    `metadata` adds to the welcome's."""
    server = PolicyServer(
        infer or echo(chunk_size, spec.action_dim),
        spec,
        {"policy": policy, "policy_version": 3, "chunk_size": chunk_size, **(metadata or {})},
        ServeConfig(endpoint=config.pop("endpoint", "tcp://127.0.0.1:*"), stats_every_s=0, **config),
    )
    stop = threading.Event()
    thread = threading.Thread(target=server.serve_forever, args=(stop.is_set,), daemon=True)
    thread.start()

    def shutdown():
        stop.set()
        thread.join(5)
        server.close()

    return server, shutdown


def observation(state):
    from embodied.robots.base import RobotObservation

    return RobotObservation(state=np.asarray(state, dtype=np.float32))


def ask(client: PolicyClient, state, tick=0, timeout_s=5.0):
    assert client.request(observation(state), tick, "balance")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply = client.poll(0.05)
        if reply is not None:
            return reply
    raise AssertionError("no reply")


def test_eight_clients_are_served_in_batches_each_with_its_own_answer():
    server, shutdown = start_server(batch_window_ms=20)
    errors, replies = [], []

    def robot(index):
        try:
            client = PolicyClient(server.endpoint, SPEC, name=f"robot{index}")
            client.connect()
            for tick in range(15):
                state = [index, tick, 0.0, 0.0]
                reply = ask(client, state, tick)
                np.testing.assert_allclose(reply.actions, [[index, tick], [index + 1, tick + 1]])
                assert reply.tick == tick and reply.policy_version == 3
                replies.append(reply.timing["batch_size"])
            client.close()
        except Exception as error:  # surfaced below with the robot's index
            errors.append(f"robot{index}: {error!r}")

    threads = [threading.Thread(target=robot, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    shutdown()
    assert not errors, errors
    assert len(replies) == 8 * 15
    assert max(server.stats.batch_sizes) > 1 and max(replies) > 1
    assert server.stats.requests == 8 * 15 and server.stats.batches < 8 * 15


def test_the_server_refuses_a_robot_that_does_not_fit_the_policy_or_does_not_fit_in():
    server, shutdown = start_server(max_clients=1)
    try:
        other = EnvSpec(state_dim=5, action_dim=2, action_low=(-3.0, -3.0), action_high=(3.0, 3.0), control_hz=25.0)
        with pytest.raises(ServerError, match="state_dim: policy 4, robot 5"):
            PolicyClient(server.endpoint, other).connect(timeout_s=5)
        first = PolicyClient(server.endpoint, SPEC, name="first")
        first.connect(timeout_s=5)
        with pytest.raises(ServerError, match="full"):
            PolicyClient(server.endpoint, SPEC, name="second").connect(timeout_s=5)
        assert ask(first, [1, 2, 3, 4]).actions.shape == (2, 2)
        assert first.ping() > 0
    finally:
        shutdown()


def test_a_malformed_request_gets_a_typed_error_and_harms_no_other_client():
    server, shutdown = start_server()
    try:
        good = PolicyClient(server.endpoint, SPEC, name="good")
        good.connect(timeout_s=5)
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(server.endpoint)
        send(raw, Message("infer", 1, {"tick": 0, "observation": {"state": np.zeros(4, np.float32)}}))
        assert raw.poll(5000)
        assert receive(raw)[1].body["code"] == "hello"  # unknown clients must say hello first
        send(raw, Message("hello", 2, {"name": "raw", "spec": json.loads(json.dumps(SPEC.to_dict()))}))
        assert raw.poll(5000) and receive(raw)[1].kind == "welcome"
        for bad in (
            {"tick": 0, "observation": {"state": np.zeros(4, np.float64)}},
            {"tick": 0, "observation": {"state": np.zeros(3, np.float32)}},
            {"tick": "0", "observation": {"state": np.zeros(4, np.float32)}},
            {"observation": {"state": np.zeros(4, np.float32), "images": {"wrist": np.zeros((2, 2, 3), np.uint8)}}},
        ):
            send(raw, Message("infer", 3, bad))
            assert raw.poll(5000)
            reply = receive(raw)[1]
            assert reply.kind == "error" and reply.body["code"] == "malformed", bad
        raw.send_multipart([b"not msgpack"])
        assert raw.poll(5000) and receive(raw)[1].body["code"] == "malformed"
        raw.close()
        assert ask(good, [5, 6, 0, 0]).actions[0].tolist() == [5.0, 6.0]
        assert server.stats.malformed == 5
    finally:
        shutdown()


def test_a_public_endpoint_needs_curve_keys():
    with pytest.raises(EndpointError, match="embodied keys"):
        PolicyServer(echo(1, 2), SPEC, {"chunk_size": 1}, ServeConfig(endpoint="tcp://0.0.0.0:5999"))


class FakeServer:
    """A ROUTER that welcomes a robot and then answers with whatever the test queues."""

    def __init__(self, chunk_size=2):
        self.socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.chunk_size = chunk_size

    def welcome(self):
        assert self.socket.poll(5000)
        identity, message = receive(self.socket, routed=True)
        send(self.socket, Message("welcome", message.seq, {"policy": "fake", "chunk_size": self.chunk_size}), identity)
        return identity

    def answer(self, frames_or_body):
        assert self.socket.poll(5000)
        identity, message = receive(self.socket, routed=True)
        if isinstance(frames_or_body, list):
            self.socket.send_multipart([identity, *frames_or_body])
        else:
            send(self.socket, Message("action", message.seq, frames_or_body), identity)


@pytest.mark.parametrize(
    "reply",
    [
        {"actions": np.zeros((3, 2), np.float32)},  # wrong chunk length
        {"actions": np.zeros((2, 2), np.float64)},  # wrong dtype
        {"actions": np.full((2, 2), np.nan, np.float32)},  # not finite
        {"actions": [[0.0, 0.0], [0.0, 0.0]]},  # not an array
        [b"\x93garbage"],  # not a message at all
    ],
)
def test_malformed_replies_are_rejected_and_counted(reply):
    fake = FakeServer()
    client = PolicyClient(fake.endpoint, SPEC, request_timeout_s=5.0)
    connecting = threading.Thread(target=client.connect, kwargs={"timeout_s": 5})
    connecting.start()
    fake.welcome()
    connecting.join()
    assert client.request(observation([0, 0, 0, 0]), 0, "")
    fake.answer(reply)
    assert client.poll(1.0) is None
    assert client.counts["malformed_replies"] == 1 and client.in_flight is None
    assert client.request(observation([0, 0, 0, 0]), 1, "")  # and it can ask again
    fake.answer({"actions": np.ones((2, 2), np.float32), "timing": {"server_ms": 1.0}})
    assert client.poll(2.0).actions.sum() == 4.0


def pendulum_robot():
    return SimRobot(SimRobotConfig(env=PENDULUM))


def client_config(endpoint, tmp_path, **overrides):
    values = dict(
        server=endpoint,
        episodes=2,
        max_episode_steps=30,
        control_hz=100.0,
        output=str(tmp_path),
        request_timeout_s=1.0,
        safety=SafetyConfig(safe_action="zero", watchdog_s=0.2),
    )
    values.update(overrides)
    return RobotClientConfig(**values)


def test_a_simulated_robot_completes_episodes_driven_by_the_server(tmp_path):
    robot = pendulum_robot()
    server, shutdown = start_server(spec=robot.spec, chunk_size=4)
    try:
        config = client_config(server.endpoint, tmp_path, broker=BrokerConfig(execute_steps=2))
        summary = RobotClient(
            robot, PolicyClient(server.endpoint, robot.spec, request_timeout_s=1.0), config, tmp_path
        ).run()
    finally:
        shutdown()
    assert [e["episode"] for e in summary["episodes"]] == [0, 1]
    assert all(e["steps"] > 0 for e in summary["episodes"])
    assert summary["action_sources"]["policy"] == sum(e["steps"] for e in summary["episodes"])
    assert summary["safety_interventions"]["watchdog"] == 0
    # a chunk of 4, asked again after 2: about one request per two ticks
    assert server.stats.requests <= summary["action_sources"]["policy"] // 2 + 4
    lines = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert len(lines) == sum(e["ticks"] for e in summary["episodes"])
    assert any("round_trip_ms" in line and "server_ms" in line for line in lines)
    assert json.loads((tmp_path / "summary.json").read_text())["round_trip_ms"]["p50"] > 0


SERVER_SCRIPT = """
import sys, numpy as np
from embodied.runtime.policy_server import PolicyServer, ServeConfig
from embodied.core.types import EnvSpec
spec = EnvSpec.from_dict({spec})
def infer(observation):
    return np.zeros((observation.batch_size, 1, spec.action_dim), np.float32)
server = PolicyServer(infer, spec, {{"policy": "zeros", "chunk_size": 1}},
                      ServeConfig(endpoint="{endpoint}", stats_every_s=0))
print("ready", flush=True)
server.serve_forever()
"""


def launch_server(spec, endpoint):
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER_SCRIPT.format(spec=spec.to_dict(), endpoint=endpoint)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "ready"
    return process


def test_watchdog_holds_the_robot_when_the_server_dies_and_the_client_reconnects(tmp_path):
    # Pendulum-v1 never terminates: one episode spans the whole outage
    robot = SimRobot(SimRobotConfig(env={"name": "gymnasium", "task": "Pendulum-v1", "max_episode_steps": 10_000}))
    endpoint = free_endpoint()
    server = launch_server(robot.spec, endpoint)
    config = client_config(endpoint, tmp_path, episodes=1, max_episode_steps=10_000, control_hz=50.0)
    client = RobotClient(
        robot, PolicyClient(endpoint, robot.spec, request_timeout_s=0.5, retry_s=0.2), config, tmp_path
    )
    quit_requested = threading.Event()
    client.should_quit = quit_requested.is_set
    result = {}
    runner = threading.Thread(target=lambda: result.update(client.run()))
    runner.start()
    try:
        wait_until(lambda: client.sources["policy"] >= 20, "the policy to drive the robot")
        server.kill()
        server.wait()
        wait_until(lambda: client.sources["watchdog"] >= 10, "the watchdog to hold the robot")
        server = launch_server(robot.spec, endpoint)
        resumed_from = client.sources["policy"]
        wait_until(lambda: client.sources["policy"] >= resumed_from + 20, "policy actions to resume")
        quit_requested.set()
        runner.join(30)
    finally:
        server.kill()
        server.wait()
    assert result, "the client did not finish"
    assert len(result["episodes"]) == 1
    sources = [json.loads(line)["source"] for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    first_safe = sources.index("watchdog")
    last_policy = max(i for i in range(first_safe) if sources[i] == "policy")
    period = 1 / 50.0
    assert (first_safe - last_policy) * period <= 0.2 + 2 * period  # within the watchdog's period
    assert "policy" in sources[first_safe:], "policy actions did not resume after the server returned"
    assert result["connection"]["reconnects"] >= 1
    assert set(sources[last_policy + 1 : first_safe]) <= {"none"}  # nothing else was sent meanwhile


def test_the_workspace_box_keeps_a_maniskill_arm_inside(tmp_path):
    robot = SimRobot(
        SimRobotConfig(
            env={"name": "maniskill", "task": "PickCube-v1", "control_mode": "pd_ee_delta_pos"}, hold_keeps_dims=[-1]
        )
    )
    start = robot.env.end_effector_position()
    reach = start[0] + 0.05

    def push_forward(observation):  # a policy that drives the gripper straight along +x
        actions = np.zeros((observation.batch_size, 1, 4), np.float32)
        actions[..., 0] = 1.0
        return actions

    server, shutdown = start_server(robot.spec, 1, push_forward, "forward")
    box = WorkspaceConfig(low=[-1.0, -1.0, 0.0], high=[float(reach), 1.0, 1.0], action_scale=0.1)
    try:
        config = client_config(
            server.endpoint, tmp_path, episodes=1, max_episode_steps=40, safety=SafetyConfig(workspace=box)
        )
        summary = RobotClient(robot, PolicyClient(server.endpoint, robot.spec), config, tmp_path).run()
    finally:
        shutdown()
    assert summary["safety_interventions"]["workspace"] > 0
    final = json.loads((tmp_path / "steps.jsonl").read_text().splitlines()[-1])["ee_position"]
    assert start[0] + 0.03 < final[0] <= reach + 0.005  # it moved toward the wall and stopped there
    np.testing.assert_allclose(robot.hold_action(), [0, 0, 0, 0])  # the gripper's last target was 0


def test_with_curve_keys_only_an_authorized_robot_is_heard(tmp_path):
    from embodied.core.security import generate_keys

    generate_keys(tmp_path / "keys")
    server, shutdown = start_server(keys_dir=str(tmp_path / "keys"))
    try:
        trusted = PolicyClient(server.endpoint, SPEC, keys_dir=str(tmp_path / "keys"))
        trusted.connect(timeout_s=5)
        assert ask(trusted, [1, 0, 0, 0]).actions[0, 0] == 1.0
        with pytest.raises(ServerError, match="no policy server answered"):
            PolicyClient(server.endpoint, SPEC).connect(timeout_s=1.0)
        assert len(server.clients) == 1
    finally:
        shutdown()


def zeros_after(seconds: float, chunk_size: int):
    """An infer that answers chunks of zeros (for the pendulum's one action) after `seconds`."""

    def slow(observation):
        time.sleep(seconds)
        return np.zeros((observation.batch_size, chunk_size, 1), np.float32)

    return slow


def test_answers_slower_than_a_tick_act_where_the_robot_stood_and_the_watchdog_fires_between(tmp_path):
    """Chunks of one action, each answer 40 ms after its 10 ms tick: the robot stands still
    while it waits, so no answer is skipped: each acts once it arrives. Between them the
    watchdog (20 ms here) sends the safe action."""
    robot = pendulum_robot()
    server, shutdown = start_server(robot.spec, 1, zeros_after(0.04, 1), "slow")
    try:
        config = client_config(server.endpoint, tmp_path, episodes=1, max_episode_steps=60, control_hz=100.0)
        config.safety.watchdog_s = 0.02
        summary = RobotClient(robot, PolicyClient(server.endpoint, robot.spec), config, tmp_path).run()
    finally:
        shutdown()
    acted, answered = summary["action_sources"]["policy"], summary["round_trip_ms"]["n"]
    assert summary["skipped_actions"] == 0 and acted >= 2
    # each answer acts once, but where a stall skipped its tick or the episode ended first
    assert answered - summary["overrun_ticks"] - 1 <= acted <= answered
    assert summary["action_sources"]["watchdog"] > 0


def test_an_answer_asked_for_before_an_estop_never_acts_after_its_reset(tmp_path):
    """Answers take about 8 ticks; the e-stop latches at tick 12 and is reset at tick 13, while
    an answer is on its way: no answer to an observation from before the reset acts after it."""
    robot = pendulum_robot()
    server, shutdown = start_server(robot.spec, 4, zeros_after(0.08, 4), "slow")
    try:
        config = client_config(server.endpoint, tmp_path, episodes=1, max_episode_steps=50, control_hz=100.0)
        client = RobotClient(robot, PolicyClient(server.endpoint, robot.spec), config, tmp_path)
        ticks = iter(range(10**6))

        def position_and_estop():  # called once a tick, between the answers' intake and the decision
            tick = next(ticks)
            if tick == 12:
                client.safety.estop("test")
            if tick == 13:
                client.safety.reset_estop()
            return None

        robot.end_effector_position = position_and_estop
        client.run()
    finally:
        shutdown()
    lines = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    taken = [(line["tick"], line["tick"] - line["handoff_ticks"]) for line in lines if "handoff_ticks" in line]
    after = [(tick, asked) for tick, asked in taken if tick > 12]
    assert after and all(asked >= 13 for _, asked in after), taken
    assert any(line["source"] == "estop" for line in lines)


class StallingRobot(SimRobot):
    """A robot whose driver blocks once for 0.15 s, as a USB hiccup would."""

    def send_action(self, action):
        self.sent = getattr(self, "sent", 0) + 1
        if self.sent == 5:
            time.sleep(0.15)
        return super().send_action(action)


def test_after_a_stall_the_loop_skips_the_missed_ticks_instead_of_bursting(tmp_path):
    robot = StallingRobot(SimRobotConfig(env={"name": "gymnasium", "task": "Pendulum-v1"}))
    server, shutdown = start_server(spec=robot.spec, chunk_size=4)
    try:
        config = client_config(server.endpoint, tmp_path, episodes=1, max_episode_steps=40, control_hz=100.0)
        summary = RobotClient(robot, PolicyClient(server.endpoint, robot.spec), config, tmp_path).run()
    finally:
        shutdown()
    assert summary["overrun_ticks"] >= 10
    lines = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    after = next(i for i, line in enumerate(lines) if "overrun_ticks" in line)
    assert all(line["jitter_ms"] < 10.0 for line in lines[after:])  # back on schedule at once
    assert len(lines) == 40 - summary["overrun_ticks"]


def test_a_hostile_hello_or_a_failing_policy_harms_only_its_sender():
    def fragile(observation):
        if "boom" in observation.instruction:
            raise RuntimeError("tokenizer failed")
        return echo(2, 2)(observation)

    server, shutdown = start_server(SPEC, 2, fragile, "fragile", batch_window_ms=0)
    try:
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(server.endpoint)
        send(raw, Message("hello", 1, {"spec": {"state_dim": np.array([4, 4])}}))
        assert raw.poll(5000) and receive(raw)[1].kind == "error"
        raw.close()
        client = PolicyClient(server.endpoint, SPEC)
        client.connect(timeout_s=5)
        assert client.request(observation([1, 2, 3, 4]), 0, "boom")
        deadline = time.monotonic() + 5
        while client.counts["server_errors"] == 0 and time.monotonic() < deadline:
            client.poll(0.05)
        assert client.counts["server_errors"] == 1 and client.in_flight is None
        assert ask(client, [1, 2, 3, 4], tick=1).actions[0].tolist() == [1.0, 2.0]
    finally:
        shutdown()


def test_one_request_pending_per_client():
    server = PolicyServer(
        echo(2, 2),
        SPEC,
        {"policy": "echo", "chunk_size": 2},
        ServeConfig(endpoint="tcp://127.0.0.1:*", stats_every_s=0),
    )
    try:
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(server.endpoint)
        send(raw, Message("hello", 1, {"name": "greedy", "spec": json.loads(json.dumps(SPEC.to_dict()))}))
        server.run_once(1.0)
        assert receive(raw)[1].kind == "welcome"
        for seq in (2, 3, 4):
            send(raw, Message("infer", seq, {"tick": seq, "observation": {"state": np.zeros(4, np.float32)}}))
        replies = []

        def both_later_requests_refused() -> bool:
            server._drain(0.05)  # takes in what has arrived; answers only what it refuses
            while raw.poll(0):
                replies.append(receive(raw)[1])
            return len(replies) == 2

        wait_until(both_later_requests_refused, "the two requests sent behind a pending one to be refused")
        assert server.run_once(1.0) == 1
        replies.append(receive(raw)[1])
        assert sorted((r.seq, r.kind, r.body.get("code")) for r in replies) == [
            (2, "action", None),
            (3, "error", "busy"),
            (4, "error", "busy"),
        ]
        raw.close()
    finally:
        server.close()


def test_a_reconnecting_robot_takes_back_its_own_slot_but_refuses_another_policy():
    endpoint = free_endpoint()
    server, shutdown = start_server(endpoint=endpoint, max_clients=1)
    client = PolicyClient(endpoint, SPEC, request_timeout_s=0.3, retry_s=0.1)
    try:
        client.connect(timeout_s=5)
        client._reconnect("test")  # a new socket, as after a timeout
        deadline = time.monotonic() + 5
        while not client.connected and time.monotonic() < deadline:
            client.poll(0.05)
        assert client.connected and len(server.clients) == 1  # not refused as "full"
    finally:
        shutdown()
    deadline = time.monotonic() + 10
    while True:  # the closed socket's port is released by ZeroMQ's IO thread, shortly
        try:
            other, shutdown = start_server(endpoint=endpoint, chunk_size=3)
            break
        except zmq.ZMQError:
            assert time.monotonic() < deadline, "the port was not released"
            time.sleep(0.1)
    try:
        assert client.request(observation([0, 0, 0, 0]), 0, "")
        with pytest.raises(ServerError, match="chunk_size changed"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                client.maintain()
                client.poll(0.05)
    finally:
        shutdown()
