"""CURVE on real sockets over loopback TCP."""

import zmq

from embodied.cli import main
from embodied.core.protocol import Message
from embodied.core.security import CurveServer, apply_client_keys, generate_keys
from embodied.core.sockets import check_endpoint, receive, send


def _server(context, keys_dir):
    curve = CurveServer(context, keys_dir)
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    curve.apply(socket)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    return curve, socket, f"tcp://127.0.0.1:{port}"


def _client(context, endpoint, keys_dir=None):
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    if keys_dir is not None:
        apply_client_keys(socket, keys_dir)
    socket.connect(endpoint)
    send(socket, Message("hello", 1, {"role": "env"}))
    return socket


def test_only_clients_holding_an_authorized_key_get_through(tmp_path):
    trusted, stranger = tmp_path / "trusted", tmp_path / "stranger"
    generate_keys(trusted)
    generate_keys(stranger)
    context = zmq.Context()
    curve, server, endpoint = _server(context, trusted)
    try:
        clients = [_client(context, endpoint), _client(context, endpoint, stranger)]  # the second: valid CURVE
        assert server.poll(1500) == 0, "an unauthenticated client reached the server"  # keys, but not authorized
        clients.append(_client(context, endpoint, trusted))
        assert server.poll(60_000) != 0, "the authorized client's hello never arrived"  # as soon as it does
        identity, message = receive(server, routed=True)
        assert message.kind == "hello" and message.body == {"role": "env"}
        assert server.poll(500) == 0
    finally:
        curve.stop()
        context.destroy(linger=0)  # every socket closed, even after a failed check, so nothing waits on them


def test_keys_command_writes_both_keypairs_with_private_secrets(tmp_path, capsys):
    assert main(["keys", str(tmp_path / "k")]) == 0
    for name in ("server.key", "server.key_secret", "client.key", "client.key_secret", "authorized/client.key"):
        assert (tmp_path / "k" / name).is_file()
    assert oct((tmp_path / "k" / "server.key_secret").stat().st_mode & 0o777) == "0o600"
    assert "server_secret" in capsys.readouterr().out


def test_non_loopback_endpoints_need_authentication():
    assert check_endpoint("tcp://10.0.0.5:5555", authenticated=True) == "tcp://10.0.0.5:5555"


def test_keys_are_never_overwritten(tmp_path):
    import pytest

    from embodied.core.errors import ConfigError

    generate_keys(tmp_path)
    with pytest.raises(ConfigError, match="already holds keys"):
        generate_keys(tmp_path)
