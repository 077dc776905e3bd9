"""ZeroMQ helpers shared by every role: endpoint policy and message send/receive.

Loopback endpoints (tcp://127.0.0.1, tcp://localhost, tcp://[::1], ipc://, inproc://) are
always allowed; any other address only with CURVE authentication on (`authenticated=True`,
see `embodied.core.security`). Anything else is refused before a socket opens."""

from __future__ import annotations

import ipaddress
from typing import Any

import zmq

from embodied.core.codec import DEFAULT_LIMITS, Limits
from embodied.core.errors import ConfigError
from embodied.core.protocol import Message, decode_message, encode_message


class EndpointError(ConfigError):
    """An endpoint this build will not open."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a DNS name other than localhost
        return False


def check_endpoint(endpoint: str, authenticated: bool = False) -> str:
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "inproc"):
        return endpoint
    if scheme == "tcp":
        host = rest.rsplit(":", 1)[0]
        if ";" not in rest and (_is_loopback(host) or authenticated):
            return endpoint
        raise EndpointError(
            f"refusing non-loopback endpoint {endpoint} without authentication: "
            f"create keys with `embodied keys <dir>` and configure them on both ends"
        )
    raise EndpointError(f"unsupported endpoint '{endpoint}': use tcp://127.0.0.1:<port> or ipc://<path>")


def bind(socket: zmq.Socket, endpoint: str, curve: Any = None) -> str:
    """Bind after the endpoint check; `curve` (a `CurveServer`) makes the socket require CURVE.
    Returns the bound address (a `*` port resolved)."""
    check_endpoint(endpoint, authenticated=curve is not None)
    if curve is not None:
        curve.apply(socket)
    socket.bind(endpoint)
    return socket.getsockopt_string(zmq.LAST_ENDPOINT)


def connect(socket: zmq.Socket, endpoint: str, keys_dir: Any = None) -> None:
    """Connect after the endpoint check, as a CURVE client when `keys_dir` is given."""
    from embodied.core.security import apply_client_keys

    check_endpoint(endpoint, authenticated=keys_dir is not None)
    if keys_dir is not None:
        apply_client_keys(socket, keys_dir)
    socket.connect(endpoint)


def send(socket: zmq.Socket, message: Message, identity: bytes | None = None) -> None:
    frames = encode_message(message)
    socket.send_multipart(([identity] if identity is not None else []) + frames, copy=False)


def receive(socket: zmq.Socket, routed: bool = False, limits: Limits = DEFAULT_LIMITS) -> tuple[bytes | None, Any]:
    """One message: (sender identity or None, decoded Message). Protocol errors propagate as
    `ProtocolError` with the sender identity attached as `.identity`."""
    frames = socket.recv_multipart(copy=False)
    identity = bytes(frames[0].buffer) if routed else None
    payload = [frame.buffer for frame in (frames[1:] if routed else frames)]
    try:
        return identity, decode_message(payload, limits)
    except Exception as error:
        error.identity = identity  # type: ignore[attr-defined]
        raise
