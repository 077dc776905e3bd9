"""`embodied serve`'s openpi endpoint against the real openpi-client (0.1.2): its observation
keys mapped onto the served env's, answered through the policy server's own batching, bad
observations answered with an error its client raises, and a public address refused."""

import time

import msgpack
import numpy as np
import pytest
from websockets.sync.client import connect

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.runtime.openpi_endpoint import OpenpiConfig, OpenpiEndpoint, check_openpi_config, pack, unpack
from tests.robots.test_deploy import start_server
from tests.robots.test_realtime_client import start

SPEC = EnvSpec(
    state_dim=8,
    action_dim=2,
    action_low=(-9.0, -9.0),
    action_high=(9.0, 9.0),
    image_shapes={"agentview": (8, 8, 3), "wrist": (8, 8, 3)},
    control_hz=20.0,
)


def infer(observation: Observation, prefix=None) -> np.ndarray:
    """action[c] = (state[0] + mean agent-view pixel / 100, instruction length) + c: what reached the policy."""
    first = observation.state[:, 0] + observation.images["agentview"].reshape(len(observation.state), -1).mean(1) / 100
    words = np.array([len(text) for text in observation.instruction], np.float32)
    return np.stack([first, words], -1)[:, None, :] + np.arange(4, dtype=np.float32)[None, :, None]


def libero_observation(state0=0.5, prompt="pick up the bowl", image=None):
    return {
        "observation/image": np.full((8, 8, 3), 100, np.uint8) if image is None else image,
        "observation/wrist_image": np.zeros((8, 8, 3), np.uint8),
        "observation/state": np.array([state0, 0, 0, 0, 0, 0, 0, 0], np.float64),  # openpi's clients send float64
        "prompt": prompt,
    }


@pytest.fixture
def endpoint():
    server, shutdown = start(infer, spec=SPEC, realtime=False)
    bridge = OpenpiEndpoint(OpenpiConfig(port=0), SPEC, server.metadata, server.endpoint)
    yield server, bridge
    bridge.close()
    shutdown()


def test_openpi_clients_are_served_through_the_policy_server(endpoint):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    server, bridge = endpoint
    first = WebsocketClientPolicy(host="127.0.0.1", port=bridge.port)
    second = WebsocketClientPolicy(host="127.0.0.1", port=bridge.port)
    assert first.get_server_metadata()["policy"] == "probe" and first.get_server_metadata()["chunk_size"] == 4
    answer = first.infer(libero_observation(0.5, "pick up the bowl"))
    assert answer["actions"].dtype == np.float32 and answer["actions"].shape == (4, 2)
    np.testing.assert_allclose(answer["actions"][:, 0], 0.5 + 1.0 + np.arange(4), rtol=1e-6)
    np.testing.assert_allclose(answer["actions"][:, 1], len("pick up the bowl") + np.arange(4))
    assert second.infer(libero_observation(-2.0, "go"))["actions"][0].tolist() == [-1.0, 2.0]
    assert len(server.clients) == 2  # one robot client of the server per connection


def test_a_bad_observation_is_answered_with_an_error_and_the_connection_goes_on(endpoint):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    _, bridge = endpoint
    client = WebsocketClientPolicy(host="127.0.0.1", port=bridge.port)
    missing = libero_observation()
    del missing["observation/wrist_image"]
    with pytest.raises(RuntimeError, match=r"lacks \['observation/wrist_image'\]"):
        client.infer(missing)
    with pytest.raises(RuntimeError, match=r"uint8 image of shape \(8, 8, 3\)"):
        client.infer(libero_observation(image=np.zeros((224, 224, 3), np.uint8)))
    with pytest.raises(RuntimeError, match="state keys give 3 numbers"):
        client.infer({**libero_observation(), "observation/state": np.zeros(3)})
    with connect(f"ws://127.0.0.1:{bridge.port}") as raw:
        unpack(raw.recv())  # the metadata
        hostile = msgpack.packb(
            {"observation/image": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]}}
        )
        raw.send(hostile)
        assert "dtypes" in raw.recv()
        raw.send(pack({"observation/image": np.zeros(3, np.uint8)})[:-1])  # cut short
        assert raw.recv().startswith("malformed observation")
        nested: dict = {}
        for _ in range(20):
            nested = {"a": nested}
        raw.send(pack(nested))
        assert "at most 8 deep" in raw.recv()
    assert client.infer(libero_observation(1.0, "x"))["actions"][0].tolist() == [2.0, 1.0]


def test_an_idle_openpi_client_keeps_its_slot():
    """A reset or a prompt between episodes: the bridge keeps the server's slot with heartbeats."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    server, shutdown = start_server(SPEC, 4, infer, "probe", client_timeout_s=3.0)
    bridge = OpenpiEndpoint(OpenpiConfig(port=0), SPEC, server.metadata, server.endpoint)
    try:
        client = WebsocketClientPolicy(host="127.0.0.1", port=bridge.port)
        assert client.infer(libero_observation(1.0, "x"))["actions"][0].tolist() == [2.0, 1.0]
        idle_until = time.monotonic() + 2 * server.config.client_timeout_s
        while time.monotonic() < idle_until:  # silent for two of the server's timeouts
            assert len(server.clients) == 1
            time.sleep(0.1)
        assert client.infer(libero_observation(2.0, "x"))["actions"][0].tolist() == [3.0, 1.0]
    finally:
        bridge.close()
        shutdown()


def test_a_public_address_or_a_mapping_that_does_not_fit_is_refused():
    with pytest.raises(ConfigError, match="no authentication"):
        check_openpi_config(OpenpiConfig(port=8000, host="0.0.0.0"), SPEC)
    check_openpi_config(OpenpiConfig(port=8000, host="0.0.0.0", allow_remote=True), SPEC)
    with pytest.raises(ConfigError, match=r"cameras \['agentview'\]; the served env has \['agentview', 'wrist'\]"):
        check_openpi_config(OpenpiConfig(port=8000, observation="image=image:agentview,state=state"), SPEC)
    with pytest.raises(ConfigError, match="targets state, instruction or image:<camera>"):
        check_openpi_config(OpenpiConfig(port=8000, observation="image=camera"), SPEC)
    assert check_openpi_config(OpenpiConfig(), SPEC) == {}  # no port: no endpoint
