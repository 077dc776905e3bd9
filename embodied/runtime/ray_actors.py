"""Ray actors for roles, without torch: env worker actors import only what `embodied.sim.worker`
does, so the env side stays free of torch under `runtime=ray` too.

`ActorProcess` gives a role's actor the shape of `subprocess.Popen` (pid, poll, returncode,
wait, kill), so the code that supervises processes supervises actors unchanged."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from typing import Any

LOOPBACK_HOSTS = ("127.0.0.1", "localhost")


@dataclass
class RoleResources:
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict = field(default_factory=dict)  # custom Ray resources, e.g. {sim_node: 1}


class ActorProcess:
    def __init__(self, actor: Any, ref: Any, pid: int, node_id: str):
        self.actor = actor
        self.ref = ref
        self.pid = pid
        self.node_id = node_id  # the Ray node it runs on: its pid means something only there
        self.returncode: int | None = None
        self.error = ""  # why the actor ended, when it failed

    def poll(self) -> int | None:
        import ray

        if self.returncode is None:
            ready, _ = ray.wait([self.ref], timeout=0)
            if ready:
                try:
                    self.returncode = int(ray.get(self.ref) or 0)
                except Exception as error:  # the actor died or its role raised
                    self.returncode = 1
                    self.error = f"{type(error).__name__}: {error}"
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import ray

        ready, _ = ray.wait([self.ref], timeout=timeout)
        if not ready:
            raise subprocess.TimeoutExpired(f"ray actor (pid {self.pid})", timeout or 0)
        return self.poll()  # type: ignore[return-value]

    def kill(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)

    def on_this_node(self) -> bool:
        import ray

        return self.node_id == ray.get_runtime_context().get_node_id()


class Role:
    """What every role's actor answers before it serves."""

    def locate(self) -> tuple[int, str]:
        """This actor's pid and Ray node."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()


class EnvWorkerRole(Role):
    """One env worker (`embodied.sim.worker.serve`) as a Ray actor. An env that lives in its own
    virtualenv (`env.python`: LIBERO) runs in a child process under that interpreter, which
    must exist on the actor's node."""

    def serve(self, arguments: dict[str, Any]) -> int:
        if arguments["env_config"].get("python"):
            return self._serve_in_child(arguments)
        from embodied.sim.worker import serve, worker_envs_factory

        serve(
            arguments["endpoint"],
            worker_envs_factory(arguments["env_config"]),
            arguments["env_ids"],
            arguments["base_seed"],
            arguments["stream"],
            arguments["worker_id"],
            keys_dir=arguments["keys_dir"],
        )
        return 0

    @staticmethod
    def _serve_in_child(arguments: dict[str, Any]) -> int:
        from embodied.sim.remote import worker_command

        command, environment = worker_command(
            arguments["endpoint"],
            arguments["env_config"],
            arguments["env_ids"],
            arguments["base_seed"],
            arguments["stream"],
            arguments["worker_id"],
            arguments["keys_dir"],
        )
        child = subprocess.Popen(command, env=environment)  # it exits once its parent, this actor, is gone
        returncode = child.wait()
        if returncode:
            raise RuntimeError(f"the env worker under {command[0]} exited with status {returncode}")
        return 0


def start_actor(role: type, resources: RoleResources, timeout_s: float, *arguments: Any) -> ActorProcess:
    """`role` as a new actor running `serve(*arguments)`. Replacing a dead role is the
    supervisor's job, with fresh state, so Ray does not restart it."""
    import ray

    actor = (
        ray.remote(role)
        .options(
            num_cpus=resources.num_cpus,
            num_gpus=resources.num_gpus,
            resources=dict(resources.resources),
            max_restarts=0,
        )
        .remote()
    )
    try:
        pid, node_id = ray.get(actor.locate.remote(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.kill(actor)
        raise RuntimeError(
            f"Ray could not start a {role.__name__} actor within {timeout_s:.0f} s asking for "
            f"{resources}: does any node offer these resources?"
        ) from None
    return ActorProcess(actor, actor.serve.remote(*arguments), pid, node_id)
