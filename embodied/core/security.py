"""ZeroMQ CURVE authentication: key files, and server/client socket set-up.

    embodied keys <dir>   writes <dir>/server.key(_secret) and <dir>/client.key(_secret)

A server holds its secret key and accepts only clients whose public key is in its
`authorized` directory; a client holds its own keypair and the server's public key.
Unauthenticated peers never complete the handshake: their messages never reach the socket."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from embodied.core.errors import ConfigError


def generate_keys(directory: str | Path) -> dict[str, Path]:
    """Server and client keypairs in `directory` (public `.key`, secret `.key_secret`), and an
    `authorized/` folder holding the client's public key for the server to trust."""
    directory = Path(directory)
    existing = [p.name for p in directory.glob("*.key*")] if directory.is_dir() else []
    if existing:
        raise ConfigError(
            f"{directory} already holds keys ({', '.join(sorted(existing))}); "
            f"choose an empty directory rather than replace keys peers may trust"
        )
    previous = os.umask(0o077)  # secret keys are never readable by others, not even briefly
    try:
        (directory / "authorized").mkdir(parents=True, exist_ok=True)
        server_public, server_secret = zmq.auth.create_certificates(str(directory), "server")
        client_public, client_secret = zmq.auth.create_certificates(str(directory), "client")
        authorized = directory / "authorized" / "client.key"
        authorized.write_bytes(Path(client_public).read_bytes())
    finally:
        os.umask(previous)
    return {
        "server_public": Path(server_public),
        "server_secret": Path(server_secret),
        "client_public": Path(client_public),
        "client_secret": Path(client_secret),
        "authorized": authorized,
    }


def _load(path: Path, secret: bool) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise ConfigError(f"CURVE key file {path} is missing; create keys with `embodied keys <dir>`")
    public, private = zmq.auth.load_certificate(str(path))
    if secret and private is None:
        raise ConfigError(f"{path} holds no secret key")
    return public, private


class CurveServer:
    """Makes a server socket require CURVE with the given keys; keep it alive while serving."""

    def __init__(self, context: zmq.Context, keys_dir: str | Path):
        keys_dir = Path(keys_dir)
        self.public, self.secret = _load(keys_dir / "server.key_secret", secret=True)
        authorized = keys_dir / "authorized"
        if not authorized.is_dir() or not any(authorized.glob("*.key")):
            raise ConfigError(f"{authorized} holds no authorized client keys")
        self.authenticator = ThreadAuthenticator(context)
        self.authenticator.start()
        try:
            self.authenticator.configure_curve(domain="*", location=str(authorized))
        except BaseException:
            self.authenticator.stop()
            raise

    def apply(self, socket: zmq.Socket) -> None:
        socket.curve_secretkey = self.secret
        socket.curve_publickey = self.public
        socket.curve_server = True

    def stop(self) -> None:
        self.authenticator.stop()


def apply_client_keys(socket: zmq.Socket, keys_dir: str | Path) -> None:
    keys_dir = Path(keys_dir)
    public, secret = _load(keys_dir / "client.key_secret", secret=True)
    server_public, _ = _load(keys_dir / "server.key", secret=False)
    socket.curve_publickey = public
    socket.curve_secretkey = secret
    socket.curve_serverkey = server_public


def describe(keys: dict[str, Any]) -> str:
    return "\n".join(f"{name:14s} {path}" for name, path in keys.items())
