"""Real-time chunking over the wire: the robot client sends the executing chunk's remaining
actions and its expected delay, the server batches such requests by shape and hands them to
the policy, and a served flow policy answers chunks that agree with them."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import zmq

from embodied.core.errors import ConfigError
from embodied.core.protocol import Message
from embodied.core.sockets import receive, send
from embodied.core.types import ChunkPrefix, Observation
from embodied.policies.denoising.flow import FlowPolicy, FlowPolicyConfig
from embodied.robots.client import BrokerConfig, RobotClient, check_client_config
from embodied.robots.policy_client import PolicyClient
from embodied.runs.loading import numpy_infer
from tests.robots.test_deploy import SPEC, client_config, observation, pendulum_robot, start_server

CHUNK = 4


def start(infer, spec=SPEC, realtime=True):
    """A policy server in a thread for `infer` (chunks of 4), with or without real-time chunking."""
    metadata = {"realtime_chunking": realtime}
    return start_server(spec, CHUNK, infer, "probe", metadata, batch_window_ms=200.0)


class Recorder:
    """An infer that answers action[c] = state[:A] + c and records each call's batch and prefix."""

    def __init__(self, action_dim: int = 2):
        self.action_dim = action_dim
        self.calls: list[tuple[np.ndarray, ChunkPrefix | None]] = []

    def __call__(self, observation: Observation, prefix: ChunkPrefix | None = None) -> np.ndarray:
        self.calls.append((observation.state.copy(), prefix))
        base = observation.state[:, None, : self.action_dim]
        return base + np.arange(CHUNK, dtype=np.float32)[None, :, None]


def test_requests_with_pending_actions_share_one_forward_pass_each_row_its_own():
    recorder = Recorder()
    server, shutdown = start(recorder)
    clients = [PolicyClient(server.endpoint, SPEC, name=f"robot{i}") for i in range(4)]
    try:
        for client in clients:
            client.connect(timeout_s=5)
        pending = [
            (np.full((2, 2), 0.5, np.float32), 1),
            (np.array([[-0.5, -0.5], [-0.7, -0.7]], np.float32), 2),
            (np.zeros((3, 2), np.float32), 2),
            None,  # robot3 asks without: the plain pass
        ]
        for index, (client, prefix) in enumerate(zip(clients, pending)):
            assert client.request(observation([index, 0, 0, 0]), 0, "", pending=prefix)
        replies = []
        for client in clients:
            while (reply := client.poll(0.05)) is None:
                pass
            replies.append(reply)
    finally:
        shutdown()
    assert [reply.actions[0, 0] for reply in replies] == [0.0, 1.0, 2.0, 3.0]  # each client its own answer
    plain = [state for state, prefix in recorder.calls if prefix is None]
    guided = [(state, prefix) for state, prefix in recorder.calls if prefix is not None]
    assert [len(state) for state in plain] == [1] and len(guided) == 1  # two forward passes
    state, prefix = guided[0]
    rows = {int(row[0]): i for i, row in enumerate(state)}
    assert sorted(rows) == [0, 1, 2] and prefix.actions.shape == (3, 3, 2)
    assert [int(prefix.pending[rows[c]]) for c in range(3)] == [2, 2, 3]
    assert [int(prefix.delay[rows[c]]) for c in range(3)] == [1, 2, 2]
    # a shorter row is padded with its own last action, which its count leaves unweighted
    np.testing.assert_array_equal(prefix.actions[rows[1], :, 0], np.float32([-0.5, -0.7, -0.7]))
    np.testing.assert_array_equal(prefix.actions[rows[0], :, 0], [0.5, 0.5, 0.5])


def hello(raw) -> None:
    send(raw, Message("hello", 1, {"name": "raw", "spec": json.loads(json.dumps(SPEC.to_dict()))}))
    assert raw.poll(5000) and receive(raw)[1].kind == "welcome"


@pytest.mark.parametrize("realtime", [True, False])
def test_malformed_pending_actions_get_a_typed_error(realtime):
    server, shutdown = start(Recorder(), realtime=realtime)
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    try:
        raw.connect(server.endpoint)
        hello(raw)
        state = {"state": np.zeros(4, np.float32)}
        bad = [
            {"pending": np.zeros((2, 2), np.float32), "delay": 3},  # delay beyond the pending actions
            {"pending": np.zeros((2, 3), np.float32), "delay": 1},  # not the action width
            {"pending": np.zeros((5, 2), np.float32), "delay": 1},  # more than a chunk
            {"pending": np.full((2, 2), np.nan, np.float32), "delay": 1},
            {"pending": np.zeros((2, 2), np.float64), "delay": 1},
            {"pending": np.zeros((2, 2), np.float32)},  # no delay
        ]
        for seq, extra in enumerate(bad if realtime else bad[:1], start=2):
            send(raw, Message("infer", seq, {"tick": 0, "observation": state, **extra}))
            assert raw.poll(5000)
            reply = receive(raw)[1]
            assert reply.kind == "error" and reply.body["code"] == "malformed", extra
            if not realtime:
                assert "without real-time chunking" in reply.body["message"]
    finally:
        raw.close()
        shutdown()


def test_the_client_refuses_realtime_chunking_a_server_cannot_do(tmp_path):
    with pytest.raises(ConfigError, match="broker.mode=chunk"):
        check_client_config(
            client_config("tcp://127.0.0.1:1", tmp_path, broker=BrokerConfig(mode="ensemble", realtime=True))
        )
    robot = pendulum_robot()
    server, shutdown = start(Recorder(robot.spec.action_dim), spec=robot.spec, realtime=False)
    try:
        config = client_config(server.endpoint, tmp_path, broker=BrokerConfig(realtime=True))
        client = RobotClient(robot, PolicyClient(server.endpoint, robot.spec, request_timeout_s=1.0), config, tmp_path)
        with pytest.raises(ConfigError, match="broker.realtime needs a server whose policy samples with real-time"):
            client.run()
    finally:
        shutdown()


def test_a_served_flow_policy_answers_chunks_that_agree_with_what_the_robot_still_executes(tmp_path):
    """The pendulum robot under the client at 50 Hz, an untrained flow policy (its chunks
    are near its initial noise, far from one another) served with real-time chunking: every
    query after the first carries the executing chunk's remaining actions, and each answer
    holds its first `delay` actions close to them."""
    robot = pendulum_robot()
    torch.manual_seed(0)
    policy = FlowPolicy(
        FlowPolicyConfig(
            horizon=CHUNK, chunk_size=CHUNK, denoise_steps=10, sampler="ode", hidden=[32], critic_hidden=[8]
        ),
        robot.spec,
    ).eval()
    infer = numpy_infer(SimpleNamespace(policy=policy, spec=robot.spec))
    served: list[tuple[ChunkPrefix | None, np.ndarray]] = []

    def recorded(observation, prefix=None):
        actions = infer(observation, prefix) if prefix is not None else infer(observation)
        served.append((prefix, actions))
        return actions

    server, shutdown = start(recorded, spec=robot.spec, realtime=policy.accepts_prefix(True))
    try:
        broker = BrokerConfig(execute_steps=2, realtime=True)
        config = client_config(server.endpoint, tmp_path, episodes=3, control_hz=50.0, broker=broker)
        summary = RobotClient(
            robot, PolicyClient(server.endpoint, robot.spec, request_timeout_s=1.0), config, tmp_path
        ).run()
    finally:
        shutdown()
    guided = [(prefix, actions) for prefix, actions in served if prefix is not None]
    # an episode's first query has nothing pending; the pendulum falls within a few chunks
    assert served[0][0] is None and guided, (len(served), summary["episodes"])
    low, high = robot.spec.action_low[0], robot.spec.action_high[0]
    for prefix, actions in guided:
        delay, count = int(prefix.delay[0]), int(prefix.pending[0])  # one robot: one row
        assert 1 <= delay <= count == prefix.actions.shape[1] <= CHUNK - 2  # queried after 2 of the chunk's 4
        held = np.abs(actions[0, :delay] - prefix.actions[0, :delay]).max()
        assert held < 0.05 * (high - low), (held, prefix.actions, actions)
    lines = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    # every guided answer was asked for with a logged delay (an episode's last query may go unanswered)
    assert len(guided) <= sum("rtc_delay" in line for line in lines) <= len(guided) + len(summary["episodes"])


def test_an_injected_delay_holds_each_answer_back_and_sets_the_chunking_delay(tmp_path):
    """`inject_delay_ticks=2` on the simulated pendulum: no answer acts before two ticks after its
    query, and real-time chunking's queries say so."""
    robot = pendulum_robot()
    server, shutdown = start(Recorder(robot.spec.action_dim), spec=robot.spec)
    try:
        broker = BrokerConfig(execute_steps=2, realtime=True)
        config = client_config(
            server.endpoint, tmp_path, episodes=2, control_hz=50.0, inject_delay_ticks=2, broker=broker
        )
        connection = PolicyClient(server.endpoint, robot.spec, request_timeout_s=1.0)
        summary = RobotClient(robot, connection, config, tmp_path).run()
    finally:
        shutdown()
    lines = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    handoffs = [line["handoff_ticks"] for line in lines if "handoff_ticks" in line]
    delays = [line["rtc_delay"] for line in lines if "rtc_delay" in line]
    assert handoffs and min(handoffs) >= 2 and delays and set(delays) == {2}, (handoffs, delays)
    # the first two of every answer never act, but for an episode's first: the robot stood still
    assert summary["skipped_actions"] >= 2 * (len(handoffs) - len(summary["episodes"]))
    with pytest.raises(ConfigError, match="inject_delay_ticks must be >= 0"):
        check_client_config(client_config(server.endpoint, tmp_path, inject_delay_ticks=-1))
