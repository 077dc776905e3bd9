"""An endpoint that speaks openpi's client protocol (`openpi-client`'s WebsocketClientPolicy),
beside the policy server, so robot and evaluation scripts written for openpi (LIBERO, DROID,
ALOHA) can drive `embodied serve` without a rewrite.

openpi's protocol: a websocket; on connect the server sends its metadata (msgpack); then each
client message is one observation, a msgpack map whose numpy arrays are maps
`{__ndarray__: true, data, dtype, shape}`, answered by a map holding `actions` (C, A) the same
way, or by a text message (the client raises it as an error). It has no authentication, so the
endpoint listens on loopback unless `allow_remote` says that TLS or a tunnel is in front of it.

Each websocket connection is bridged to the policy server as one more robot client of its own
(`PolicyClient` over loopback): batching with the other robots, the checkpoint's statistics,
clipping to the action bounds and the client limits are the server's, unchanged. The
observation's keys are mapped onto the served env's (`observation`): a preset, or pairs
`<openpi key>=<target>` where a target is `state` (several concatenate in their order),
`instruction`, or `image:<camera>`; nested maps are addressed with `/` (`images/cam_high`)."""

from __future__ import annotations

import ipaddress
import itertools
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import msgpack
import numpy as np

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec

logger = logging.getLogger(__name__)

# openpi's example clients' keys, onto this project's env of the same suite
PRESETS = {
    # openpi's examples/libero/main.py: the agent view, the wrist view, eef pose + gripper (8,)
    "libero": {
        "observation/image": "image:agentview",
        "observation/wrist_image": "image:wrist",
        "observation/state": "state",
        "prompt": "instruction",
    },
}
DTYPES = ("|u1", "<f4", "<f8", "<i4", "<i8", "|b1")  # what an observation's arrays may be


@dataclass
class OpenpiConfig:
    port: Optional[int] = None  # null: no openpi endpoint
    host: str = "127.0.0.1"
    # openpi's protocol has no authentication: another host than loopback needs this, meaning
    # that TLS or a tunnel (ssh -L) stands in front of the endpoint
    allow_remote: bool = False
    observation: str = "libero"  # a preset (PRESETS) or `<openpi key>=<target>,...`
    request_timeout_s: float = 10.0  # the policy server's answer to one observation (and the connect)


def parse_mapping(text: str) -> dict[str, str]:
    """A preset's mapping, or explicit pairs."""
    if text in PRESETS:
        return dict(PRESETS[text])
    pairs = [item.strip() for item in text.split(",") if item.strip()]
    mapping = {}
    for pair in pairs:
        key, _, target = pair.partition("=")
        if not key or not (target in ("state", "instruction") or target.startswith("image:")):
            raise ConfigError(
                f"openpi.observation must be a preset ({', '.join(PRESETS)}) or pairs <openpi key>=<target> with "
                f"targets state, instruction or image:<camera>; got '{pair}'"
            )
        mapping[key.strip()] = target.strip()
    if not mapping:
        raise ConfigError(f"openpi.observation is empty: give a preset ({', '.join(PRESETS)}) or pairs")
    return mapping


def check_openpi_config(config: OpenpiConfig, spec: EnvSpec) -> dict[str, str]:
    """The mapping, checked against the served env: every camera it has and a state."""
    if config.port is None:
        return {}
    if not 0 <= config.port <= 65535:
        raise ConfigError(f"openpi.port must be in [0, 65535], got {config.port}")
    if not config.request_timeout_s > 0:
        raise ConfigError(f"openpi.request_timeout_s must be > 0, got {config.request_timeout_s}")
    if not is_loopback(config.host) and not config.allow_remote:
        raise ConfigError(
            f"openpi.host={config.host} is not loopback and openpi's protocol has no authentication: put TLS or "
            "a tunnel (ssh -L) in front and set openpi.allow_remote=true, or listen on 127.0.0.1"
        )
    mapping = parse_mapping(config.observation)
    cameras = {target.removeprefix("image:") for target in mapping.values() if target.startswith("image:")}
    if cameras != set(spec.image_shapes):
        raise ConfigError(
            f"openpi.observation maps images onto cameras {sorted(cameras)}; the served env has "
            f"{sorted(spec.image_shapes) or 'none'}"
        )
    if "state" not in mapping.values():
        raise ConfigError("openpi.observation maps no key onto the state")
    return mapping


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---- openpi's msgpack-numpy, read with limits ----------------------------------------------------
def _array(item: dict) -> Any:
    if b"__ndarray__" in item:
        dtype, shape, data = item.get(b"dtype"), item.get(b"shape"), item.get(b"data")
        if dtype not in DTYPES or not isinstance(data, bytes):
            raise ValueError(f"arrays may be of dtypes {DTYPES}, got {dtype!r}")
        if not isinstance(shape, (list, tuple)) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ValueError(f"an array's shape must be a list of sizes, got {shape!r}")
        if math.prod(shape) * np.dtype(dtype).itemsize != len(data):
            raise ValueError(f"an array of shape {tuple(shape)} and dtype {dtype} does not fit its {len(data)} bytes")
        return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
    if b"__npgeneric__" in item:
        raise ValueError("numpy scalars are not observations")
    return item


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, object_hook=_array, strict_map_key=False, raw=False)


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {b"__ndarray__": True, b"data": value.tobytes(), b"dtype": value.dtype.str, b"shape": value.shape}
    raise TypeError(f"cannot send {type(value).__name__}")


def pack(value: Any) -> bytes:
    return msgpack.packb(value, default=_encode)


MAX_DEPTH = 8  # nested maps in an observation (ALOHA's has 2 levels)


def flatten(observation: Any, prefix: str = "", depth: int = 0) -> dict[str, Any]:
    """Nested maps as `a/b` keys."""
    if not isinstance(observation, dict):
        raise ValueError("an observation must be a map")
    if depth >= MAX_DEPTH:
        raise ValueError(f"an observation nests maps at most {MAX_DEPTH} deep")
    flat = {}
    for key, value in observation.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}/", depth + 1))
        else:
            flat[name] = value
    return flat


def to_observation(raw: Any, mapping: dict[str, str], spec: EnvSpec) -> tuple[dict[str, Any], str]:
    """openpi's observation -> ({state, images}, instruction) for the served env, or a ValueError
    that names the key at fault."""
    flat = flatten(raw)
    missing = sorted(set(mapping) - set(flat))
    if missing:
        raise ValueError(f"the observation lacks {missing} (openpi.observation maps them); it has {sorted(flat)}")
    states, images, instruction = [], {}, ""
    for key, target in mapping.items():
        value = flat[key]
        if target == "instruction":
            if not isinstance(value, str):
                raise ValueError(f"'{key}' must be a string")
            instruction = value
        elif target == "state":
            states.append(np.asarray(value, dtype=np.float32).reshape(-1))
        else:
            camera = target.removeprefix("image:")
            shape = tuple(spec.image_shapes[camera])
            if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.shape != shape:
                raise ValueError(
                    f"'{key}' must be a uint8 image of shape {shape} (the served env's '{camera}'), got "
                    f"{getattr(value, 'dtype', type(value).__name__)} {getattr(value, 'shape', '')}"
                )
            images[camera] = value
    state = np.concatenate(states)
    if state.shape != (spec.state_dim,):
        raise ValueError(f"the state keys give {state.shape[0]} numbers; the served env's state has {spec.state_dim}")
    return {"state": state, "images": images}, instruction


class OpenpiEndpoint:
    """A websocket server in a thread of its own; each connection a client of `server_endpoint`."""

    def __init__(
        self,
        config: OpenpiConfig,
        spec: EnvSpec,
        metadata: dict[str, Any],
        server_endpoint: str,
        keys_dir: str | None = None,
    ):
        from websockets.sync.server import serve

        self.mapping = check_openpi_config(config, spec)
        self.request_timeout_s = config.request_timeout_s
        self.spec, self.metadata = spec, metadata
        self.server_endpoint, self.keys_dir = server_endpoint, keys_dir
        self._numbers = itertools.count(1)  # names the bridging clients
        # nothing much larger than an observation of this spec is read off the wire (clients
        # may send more than is mapped: a few full-size frames)
        image_bytes = sum(math.prod(shape) for shape in spec.image_shapes.values())
        limit = 2 * image_bytes + 8 * spec.state_dim + (8 << 20)
        self._server = serve(self._handle, config.host, config.port, compression=None, max_size=limit)
        self.port = self._server.socket.getsockname()[1]
        self.address = f"ws://{config.host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="openpi-endpoint", daemon=True)
        self._thread.start()

    def _handle(self, websocket: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        from embodied.robots.policy_client import HEARTBEAT_S, PolicyClient

        name = f"openpi-{next(self._numbers)}"
        client = PolicyClient(
            self.server_endpoint, self.spec, name=name, keys_dir=self.keys_dir, request_timeout_s=self.request_timeout_s
        )
        try:
            websocket.send(pack(self.metadata))
            while True:
                try:
                    message = websocket.recv(timeout=HEARTBEAT_S / 2)
                except TimeoutError:  # an idle openpi client (a reset, a prompt): keep the slot
                    client.maintain()
                    client.poll(0.0)
                    continue
                websocket.send(self._answer(client, message))
        except ConnectionClosed:
            return  # the openpi client went away
        finally:
            client.close()

    def _answer(self, client: Any, message: str | bytes) -> str | bytes:
        """The packed actions for one observation, or the text of what was wrong with it."""
        from embodied.robots.policy_client import ServerError

        if isinstance(message, str):
            return "an observation is a binary msgpack message, not text"
        start = time.monotonic()
        try:
            observation, instruction = to_observation(unpack(message), self.mapping, self.spec)
            actions = client.infer(observation, instruction)
        except (ValueError, TypeError) as error:  # msgpack's own errors are ValueErrors
            return f"malformed observation: {error}"
        except ServerError as error:
            return f"the policy server did not answer: {error}"
        return pack({"actions": actions, "server_timing": {"infer_ms": (time.monotonic() - start) * 1000}})

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(5)
