"""`embodied serve checkpoint=<run>` (or `policy=<name> policy.pretrained=<folder> env=<env>`):
loads the policy and runs the policy server (`embodied.runtime.policy_server`) until Ctrl-C."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.runtime.policy_server import PolicyServer, ServeConfig


def load_checkpoint_policy(config: ServeConfig) -> tuple[Callable[[Observation], np.ndarray], EnvSpec, dict[str, Any]]:
    """The checkpoint's policy (or the published model `policy.pretrained`, for `env`'s
    robots) as a batch `infer` function, its env spec and the metadata a client is welcomed
    with. Normalisation statistics are module buffers, so they come with the weights; their
    hash is the `normalization_id` clients see."""
    from embodied.build import resolve_device
    from embodied.runs.loading import env_spec, load_run_policy, numpy_infer, policy_source

    device = resolve_device(config.runtime.device)
    if config.policy is not None:
        if config.env is None:
            raise ConfigError("serving a published model needs env=<env config>: its spec is what robots must match")
        loaded = policy_source(config.checkpoint, config.policy, device).load(env_spec(config.env), "env")
    else:
        if config.env is not None:
            raise ConfigError("env= goes with policy.pretrained; a run's checkpoint is served for its own env's spec")
        if not config.checkpoint:
            raise ConfigError(
                "serve needs checkpoint=<run dir or checkpoint dir> or policy=<name> policy.pretrained=<folder>"
            )
        loaded = load_run_policy(config.checkpoint, device=device)
    policy = loaded.policy
    metadata = {
        "policy": loaded.config.policy.name,
        "policy_version": loaded.policy_version,
        "checkpoint": loaded.checkpoint.name,
        "chunk_size": int(policy.chunk_size),
        "normalization_id": normalization_id(policy),
        "deterministic": config.deterministic,
        # whether requests may carry pending actions (robot client: broker.realtime)
        "realtime_chunking": bool(getattr(policy, "accepts_prefix", lambda _: False)(config.deterministic)),
    }
    return numpy_infer(loaded, config.deterministic), loaded.spec, metadata


def normalization_id(policy: Any) -> str:
    """A hash of the policy's buffers (its normalisation statistics, running or a pretrained
    checkpoint's): a client that reconnects to a server with other statistics refuses it."""
    import hashlib

    digest = hashlib.sha256()
    parameters = dict(policy.named_parameters())
    for name, buffer in sorted(policy.state_dict().items()):
        if name not in parameters:
            digest.update(name.encode())
            digest.update(buffer.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def serve_checkpoint(config: ServeConfig, should_stop: Callable[[], bool] = lambda: False) -> None:
    from embodied.runtime.process import start_process

    start_process(seed=0, torch_threads=config.runtime.torch_threads)
    infer, spec, metadata = load_checkpoint_policy(config)
    server = PolicyServer(infer, spec, metadata, config)
    openpi = None
    try:
        if config.openpi.port is not None:
            from embodied.runtime.openpi_endpoint import OpenpiEndpoint

            openpi = OpenpiEndpoint(config.openpi, spec, server.metadata, server.endpoint, config.keys_dir)
        print(
            f"serving {metadata['policy']} (version {metadata['policy_version']}, {metadata['checkpoint']}) "
            f"on {server.endpoint}{f' and to openpi clients on {openpi.address}' if openpi else ''}; "
            f"chunk {metadata['chunk_size']} x {spec.action_dim}, control {spec.control_hz} Hz; Ctrl-C stops",
            flush=True,
        )
        server.serve_forever(should_stop)
    finally:
        if openpi is not None:
            openpi.close()
        server.close()
