"""The message bodies of the protocol, each defined once: on which channel it travels, who
sends it, what handles it, and its fields. Every message is an envelope `{v, kind, seq,
body}` (`embodied.core.protocol`); this module says what `body` holds.

Three channels speak it:

    env      env worker (DEALER, `embodied.sim.worker`) <-> env hub (ROUTER, in the rollout)
    policy   robot client (DEALER, `PolicyClient`) <-> policy server (ROUTER, `embodied serve`,
             or the learner itself under `runtime=robots`)
    learner  rollout (DEALER + SUB) <-> learner (ROUTER + PUB)

`check_body` says what in a body breaks its definition; the protocol page of the
documentation is `protocol_page()`, and the tests hold both to the bodies the real senders
build."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

CHANNELS = {
    "env": "env worker <-> env hub: a rollout's envs in other processes or on other machines",
    "policy": "robot client <-> policy server: observations up, action chunks down, episodes to a learner",
    "learner": "rollout <-> learner: numbered trajectories up (acknowledged), versioned weights down",
}


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # int, float, str, bool, map, list, array, any, null; alternatives joined by |
    meaning: str
    required: bool = True


@dataclass(frozen=True)
class Body:
    channel: str
    kind: str
    sender: str
    handler: str  # "module:qualified name" of the code that handles it
    meaning: str
    fields: tuple[Field, ...] = ()


def _f(name: str, type_: str, meaning: str, required: bool = True) -> Field:
    return Field(name, type_, meaning, required)


ERROR = (
    _f("code", "str", "malformed | version | kind | seq | hello | mismatch | full | busy | infer | episode"),
    _f("message", "str", "what was wrong, for a person"),
)
SPEC = "the env spec (`EnvSpec.to_dict()`: state_dim, action_dim, action bounds, image_shapes, control_hz, ...)"
MARKS = (
    _f("received", "int", "the last trajectory number queued for the learner"),
    _f("consumed", "int", "the last one used in an update or dropped as stale (the sender's flow control)"),
    _f("durable", "int", "the last one a saved checkpoint holds (the sender may forget up to it)"),
    _f("policy_version", "int", "the learner's newest weights"),
)

BODIES: tuple[Body, ...] = (
    # ---- env worker <-> env hub -------------------------------------------------------------
    Body(
        "env",
        "hello",
        "env worker",
        "embodied.sim.remote:EnvHub._handshake",
        "a worker introduces the envs it holds; the hub checks their spec against the others'",
        (
            _f("protocol", "int", "the protocol version"),
            _f("role", "str", "'env'"),
            _f("env_ids", "list", "the env ids this worker steps"),
            _f("spec", "map", SPEC),
            _f("tasks", "list", "each env's task"),
            _f("instructions", "list", "each env's instruction"),
        ),
    ),
    Body(
        "env",
        "welcome",
        "env hub",
        "embodied.sim.worker:serve",
        "the hub accepts the worker; the worker checks the spec the rollout expects",
        (_f("protocol", "int", "the protocol version"), _f("spec", "map", SPEC)),
    ),
    Body(
        "env",
        "command",
        "env hub",
        "embodied.sim.worker_envs:run_command",
        "call one of the worker's env-group methods (describe, observe, reset, rewind, step, render, "
        "resume_state, restore); answered by a result with the same seq",
        (_f("command", "str", "the method"), _f("args", "map", "its keyword arguments")),
    ),
    Body(
        "env",
        "result",
        "env worker",
        "embodied.sim.worker_envs:unwrap_reply",
        "the answer to a command: exactly one of ok and error",
        (
            _f("ok", "any", "the method's return value", required=False),
            _f("error", "str", "the traceback of a failed call", required=False),
        ),
    ),
    Body(
        "env",
        "heartbeat",
        "env worker",
        "embodied.sim.remote:EnvHub.pump",
        "sent when the worker has been idle for a heartbeat period",
        (_f("time", "float", "the worker's clock"),),
    ),
    Body("env", "close", "env hub", "embodied.sim.worker:serve", "the worker exits"),
    Body(
        "env",
        "error",
        "env hub or env worker",
        "embodied.sim.remote:SocketWorker.wait_for",
        "a message that could not be used, or a worker whose envs do not match",
        ERROR,
    ),
    # ---- robot client <-> policy server -------------------------------------------------------
    Body(
        "policy",
        "hello",
        "robot client",
        "embodied.runtime.policy_server:PolicyServer._hello",
        "a robot introduces itself; the server checks its spec against the policy's",
        (
            _f("protocol", "int", "the protocol version"),
            _f("role", "str", "'robot'"),
            _f("name", "str", "the client's name, for logs"),
            _f("session", "str", "the same across reconnects of one client run"),
            _f("spec", "map", SPEC),
        ),
    ),
    Body(
        "policy",
        "welcome",
        "policy server",
        "embodied.robots.policy_client:PolicyClient._welcome",
        "the server's metadata; a client that reconnects refuses another policy or normalisation",
        (
            _f("protocol", "int", "the protocol version"),
            _f("server_id", "str", "this server process (a restarted one has another)"),
            _f("spec", "map", SPEC),
            _f("max_clients", "int", "robots served at once"),
            _f("client_timeout_s", "float", "a client silent this long loses its slot"),
            _f("policy", "str", "the policy's registry name"),
            _f("policy_version", "int", "the weights' version"),
            _f("chunk_size", "int", "actions per chunk"),
            _f("normalization_id", "str|null", "a hash of the policy's input statistics"),
            _f("deterministic", "bool", "whether actions are the policy's mode"),
            _f("checkpoint", "str", "the checkpoint served (a fixed policy server)", required=False),
            _f("learning", "bool", "the server learns from episodes (runtime=robots)", required=False),
            _f(
                "realtime_chunking",
                "bool",
                "infer may carry pending actions (the policy samples with real-time chunking)",
                required=False,
            ),
            _f("run", "str", "the learning run's directory", required=False),
            _f("outcome_cameras", "list", "cameras whose outcome images episodes must carry", required=False),
            _f("policy_cameras", "list", "cameras whose frames episodes must carry, as states", required=False),
        ),
    ),
    Body(
        "policy",
        "infer",
        "robot client",
        "embodied.runtime.policy_server:PolicyServer._queue",
        "one observation; answered by an action (or an error) with the same seq",
        (
            _f("tick", "int", "the client's control tick"),
            _f("observation", "map", "{state: float32 (S,), images: {camera: uint8 (H, W, 3)}, instruction: str}"),
            _f("feedback", "map", "since the last request: reward, executed_action, intervened_ticks", required=False),
            _f(
                "pending",
                "array",
                "float32 (P, A), 1 <= P <= C: the actions of the executing chunk from this tick on "
                "(real-time chunking; with delay)",
                required=False,
            ),
            _f(
                "delay",
                "int",
                "0..P: the ticks until this answer is expected to take over; its first `delay` actions "
                "are held to the pending ones",
                required=False,
            ),
        ),
    ),
    Body(
        "policy",
        "action",
        "policy server",
        "embodied.robots.policy_client:PolicyClient._action",
        "the action chunk for one infer",
        (
            _f("actions", "array", "float32 (C, A)"),
            _f("tick", "int", "the request's tick"),
            _f("policy_version", "int|null", "the weights that acted"),
            _f("timing", "map", "queue_ms, infer_ms, server_ms, batch_size"),
        ),
    ),
    Body(
        "policy",
        "episode",
        "robot client",
        "embodied.core.episodes:parse_episode",
        "a finished episode for a learning server (runtime=robots); answered by an ack",
        (
            _f("states", "array", "float32 (T + 1, S)"),
            _f("actions", "array", "float32 (T, A), as executed"),
            _f("rewards", "array", "float32 (T,)"),
            _f("intervened", "array", "bool (T,)"),
            _f("terminated", "bool", "the task ended it"),
            _f("success", "bool", "the robot's or the operator's verdict"),
            _f("instruction", "str", "the task's instruction"),
            _f("policy_version", "int|null", "the weights that acted at the episode's end"),
            _f(
                "images",
                "map",
                "camera -> uint8 (T + 1, H, W, 3), for the welcome's policy_cameras",
                required=False,
            ),
            _f(
                "outcome_images",
                "map",
                "camera -> uint8 (T, H, W, 3), for the welcome's outcome_cameras",
                required=False,
            ),
        ),
    ),
    Body(
        "policy",
        "ack",
        "policy server",
        "embodied.robots.policy_client:PolicyClient.send_episode",
        "an episode taken by the learner",
        (
            _f("transitions", "int", "the episode's length"),
            _f("policy_version", "int", "the learner's newest weights"),
            _f("queued", "int", "episodes waiting for the learner"),
            _f("finished", "bool", "the run needs no more episodes"),
        ),
    ),
    Body(
        "policy",
        "heartbeat",
        "robot client",
        "embodied.runtime.policy_server:PolicyServer._dispatch",
        "keeps an idle client's slot; answered by the server's heartbeat",
        (_f("time", "float", "the client's clock"),),
    ),
    Body(
        "policy",
        "heartbeat",
        "policy server",
        "embodied.robots.policy_client:PolicyClient.ping",
        "the answer to a client's heartbeat",
        (
            _f("time", "float", "the server's clock"),
            _f("clients", "int", "clients connected"),
            _f("requests", "int", "requests served"),
            _f("policy_version", "int|null", "the served weights"),
        ),
    ),
    Body(
        "policy",
        "close",
        "robot client",
        "embodied.runtime.policy_server:PolicyServer._forget",
        "the client leaves; its slot is free",
    ),
    Body(
        "policy",
        "error",
        "policy server",
        "embodied.robots.policy_client:PolicyClient._handle",
        "a refused or failed request (mismatch, full, busy, hello: say hello first, infer: inference failed)",
        ERROR,
    ),
    # ---- rollout <-> learner ---------------------------------------------------------------------
    Body(
        "learner",
        "hello",
        "rollout",
        "embodied.runtime.learner_link:LearnerLink._on_hello",
        "a rollout introduces itself; the learner checks it serves the same run, policy and envs",
        (
            _f("protocol", "int", "the protocol version"),
            _f("pid", "int", "the rollout's process"),
            _f("sender", "str", "the rollout's name (rollout-0, ...)"),
            _f("run", "str", "the run directory"),
            _f("policy", "str", "the policy's registry name"),
            _f("chunk_size", "int", "actions per chunk"),
            _f("spec", "map", SPEC),
            _f("first_held", "int", "the first trajectory number the rollout still holds"),
        ),
    ),
    Body(
        "learner",
        "welcome",
        "learner",
        "embodied.runtime.rollout_link:RolloutLink._on_welcome",
        "the learner accepts the rollout, repeats what must match and gives its marks",
        (
            _f("learner_id", "str", "this learner process (a restarted one has another)"),
            _f("protocol", "int", "the protocol version"),
            _f("run", "str", "the run directory"),
            _f("policy", "str", "the policy's registry name"),
            _f("chunk_size", "int", "actions per chunk"),
            _f("spec", "map", SPEC),
            *MARKS,
        ),
    ),
    Body(
        "learner",
        "trajectory",
        "rollout",
        "embodied.runtime.learner_link:LearnerLink._on_trajectory",
        "one batch, numbered by seq (go-back-N), with what the rollout measured while collecting it",
        (
            _f("trajectory", "map", "each field of `Trajectory`, time-major arrays (`embodied.runtime.wire`)"),
            _f("episodes", "list", "the episodes that ended in the batch (`EpisodeStats` fields)"),
            _f("env_steps", "int", "env steps the batch took"),
            _f("env_restarts", "int", "env workers restarted so far"),
            _f("resent", "int", "trajectories resent so far"),
            _f("reconnects", "int", "reconnections to a learner so far"),
            _f("offload_s", "float", "time spent moving the policy off and onto the device (collocated)"),
        ),
    ),
    Body(
        "learner",
        "ack",
        "learner",
        "embodied.runtime.rollout_link:RolloutLink._on_message",
        "the learner's marks after a trajectory, an update or a checkpoint",
        (*MARKS, _f("resend_from", "int", "the first number missing: resend from it", required=False)),
    ),
    Body(
        "learner",
        "weights",
        "learner",
        "embodied.runtime.rollout_link:RolloutLink._on_weights",
        "published on PUB (latest only): the trainable weights, tagged with their version",
        (
            _f("learner_id", "str", "the learner that trained them"),
            _f("policy_version", "int", "their version"),
            _f("weights", "map", "name -> array"),
        ),
    ),
    Body(
        "learner",
        "heartbeat",
        "rollout",
        "embodied.runtime.learner_link:LearnerLink._handle_message",
        "the weights the rollout holds, so the learner republishes to one that missed them",
        (_f("learner_id", "str", "whose weights"), _f("policy_version", "int", "their version")),
    ),
    Body(
        "learner",
        "heartbeat",
        "learner",
        "embodied.runtime.rollout_link:RolloutLink._on_message",
        "the learner's marks, every heartbeat period",
        MARKS,
    ),
    Body(
        "learner",
        "close",
        "learner",
        "embodied.runtime.rollout_link:RolloutLink._on_message",
        "training is over: the rollout exits",
    ),
    Body(
        "learner",
        "close",
        "rollout",
        "embodied.runtime.learner_link:LearnerLink._handle_message",
        "the answer to the learner's close: this rollout is exiting (the learner says close until it hears this)",
    ),
    Body(
        "learner",
        "error",
        "learner",
        "embodied.runtime.rollout_link:RolloutLink._on_message",
        "a rollout that does not match, or one the learner does not know (hello)",
        ERROR,
    ),
)

_CHECKS = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "map": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
    "array": lambda v: isinstance(v, np.ndarray),
    "any": lambda v: True,
    "null": lambda v: v is None,
}


def definitions(channel: str, kind: str) -> list[Body]:
    """The definitions of `kind` on `channel` (one per sender)."""
    return [body for body in BODIES if body.channel == channel and body.kind == kind]


def check_body(channel: str, kind: str, body: Any) -> list[str]:
    """What in `body` breaks every definition of `kind` on `channel` ([] if one fits)."""
    candidates = definitions(channel, kind)
    if not candidates:
        return [f"no '{kind}' message is defined on the {channel} channel"]
    problems: list[str] = []
    for definition in candidates:
        found = _problems(definition, body)
        if not found:
            return []
        problems += [f"{definition.sender}'s {kind}: {problem}" for problem in found]
    return problems


def _problems(definition: Body, body: Any) -> list[str]:
    if not isinstance(body, dict):
        return [f"the body is a {type(body).__name__}, not a map"]
    problems = []
    declared = {field.name: field for field in definition.fields}
    for field in definition.fields:
        if field.name not in body:
            if field.required:
                problems.append(f"'{field.name}' is missing")
        elif not any(_CHECKS[t](body[field.name]) for t in field.type.split("|")):
            problems.append(f"'{field.name}' should be {field.type}, got {type(body[field.name]).__name__}")
    problems += [f"'{key}' is not a field of it" for key in body if key not in declared]
    return problems


def protocol_page() -> str:
    """The documentation's protocol page, generated from the definitions above."""
    lines = [
        "# The protocol",
        "",
        "Generated from `embodied/core/messages.py` (`python -m embodied.core.messages > docs/protocol.md`); "
        "the tests check that this page and the code agree.",
        "",
        "Every message is a msgpack envelope `{v, kind, seq, body}`, numpy arrays travelling as raw frames "
        "beside it (`embodied/core/codec.py`): no pickle, object dtypes refused, every size bounded, every "
        "malformed message answered with a typed `error`. Handshakes check the protocol version and what both "
        "ends must agree on; every request has a deadline and both directions send heartbeats.",
        "",
    ]
    for channel, description in CHANNELS.items():
        lines += [f"## The {channel} channel", "", description + ".", ""]
        for body in (b for b in BODIES if b.channel == channel):
            lines += [
                f"### `{body.kind}` from the {body.sender}",
                "",
                f"{body.meaning[0].upper()}{body.meaning[1:]}. Handled by `{body.handler}`.",
                "",
            ]
            if body.fields:
                lines += ["| field | type | meaning |", "| --- | --- | --- |"]
                lines += [
                    f"| `{f.name}` | {f.type}{'' if f.required else ', optional'} | {f.meaning} |" for f in body.fields
                ]
                lines.append("")
            else:
                lines += ["An empty map.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(protocol_page(), end="")
