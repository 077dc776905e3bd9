"""`VectorizedEnv`: B single envs behind the batched interface, either in this process or
spread over worker processes (each steps its share of the envs), so CPU simulators use every core."""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import traceback
from dataclasses import asdict
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from embodied.core import codec
from embodied.core.env import BatchedEnv, SingleEnv, select_env_ids
from embodied.core.errors import CheckpointError, ConfigError, EnvWorkerError
from embodied.core.types import EnvSpec, EpisodeStats, Observation, StepResult
from embodied.sim.latency import with_latency
from embodied.sim.worker_envs import WorkerEnvs, run_command, unwrap_reply


class _LocalWorker:
    """Runs a share of the envs in this process with the same send/receive shape as a worker."""

    def __init__(self, make_env: Callable[[int], SingleEnv], env_ids: Sequence[int], base_seed: int, stream: int):
        self.envs = WorkerEnvs(make_env, env_ids, base_seed, stream)
        self._pending: Any = None

    def wait_ready(self) -> None:
        """Its envs are built when it is made (pipe and ZeroMQ workers build theirs after they start)."""

    def send(self, command: str, **args: Any) -> None:
        self._pending = getattr(self.envs, command)(**args)

    def receive(self) -> Any:
        result, self._pending = self._pending, None
        return result

    def close(self) -> None:
        self.envs.close()


def worker_context(preload: Sequence[str]) -> Any:
    """The multiprocessing context pipe workers start in: forked from this process's
    forkserver, which imports `preload` (the simulator's modules) once, so every worker after
    it (training's, periodic evaluation's, the final evaluation's) starts without the 5-6 s of
    CPU that importing torch and ManiSkill costs a fresh interpreter; `spawn` where there is no
    forkserver. Nothing is forked from this process itself, whose threads a fork would break."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    from multiprocessing import forkserver

    context = mp.get_context("forkserver")
    context.set_forkserver_preload(list(preload))  # read when the server starts: the first env set's modules
    # the server and the workers forked from it keep one thread for torch and BLAS, as
    # spawned workers did (_worker_main's OMP_NUM_THREADS comes too late for a preloaded torch)
    threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        forkserver.ensure_running()
    finally:
        if threads is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = threads
    return context


@atexit.register
def _stop_forkserver() -> None:
    """At exit: the forkserver (if this process started one) stopped and waited for, so it
    does not outlive the run and its workers' CPU time is counted as this process's children's
    (`time`, resource accounting)."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)  # the method Python's own tests use
    if stop is not None:
        with contextlib.suppress(FileNotFoundError):  # its socket file already removed with its folder
            stop()  # nothing to do where no server was started


def _worker_main(
    connection: Any, make_env: Callable[[int], SingleEnv], env_ids: list[int], base_seed: int, stream: int
) -> None:
    # Simulators that use torch or BLAS internally get one thread per worker process.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    envs = None
    try:
        envs = WorkerEnvs(make_env, env_ids, base_seed, stream)
        connection.send_bytes(codec.encode({"ok": None}))
        while True:
            request = codec.decode(connection.recv_bytes())
            if request.get("command") == "close":
                break
            connection.send_bytes(codec.encode(run_command(envs, request)))
    except (EOFError, ConnectionError, KeyboardInterrupt):
        pass  # the parent closed the pipe or died (e.g. killed): nobody is left to tell
    except Exception:
        connection.send_bytes(codec.encode({"error": traceback.format_exc()}))
    finally:
        if envs is not None:
            envs.close()


class _PipeWorker:
    def __init__(
        self,
        make_env: Callable[[int], SingleEnv],
        env_ids: Sequence[int],
        base_seed: int,
        stream: int,
        timeout_s: float,
        preload: Sequence[str] = (),
    ):
        self.timeout_s = timeout_s
        context = worker_context(preload)
        self.connection, child = context.Pipe()
        self.process = context.Process(
            target=_worker_main, args=(child, make_env, list(env_ids), base_seed, stream), daemon=True
        )
        self.process.start()
        child.close()

    def wait_ready(self) -> None:
        """Until the worker has built its envs (started first, so that several build side by side)."""
        try:
            self.receive()
        except BaseException:
            self.close()
            raise

    def _dead(self, during: str) -> EnvWorkerError:
        self.process.join(timeout=1)
        return EnvWorkerError(f"env worker {self.process.pid} died during {during} (exit code {self.process.exitcode})")

    def send(self, command: str, **args: Any) -> None:
        try:
            self.connection.send_bytes(codec.encode({"command": command, "args": args}))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            raise self._dead(f"'{command}'") from None

    def receive(self) -> Any:
        if not self.connection.poll(self.timeout_s):
            raise EnvWorkerError(f"env worker {self.process.pid} gave no answer within {self.timeout_s:.0f} s")
        try:
            data = self.connection.recv_bytes()
        except (EOFError, ConnectionResetError):
            raise self._dead("a request") from None
        return unwrap_reply(codec.decode(data), f"env worker {self.process.pid}")

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.connection.send_bytes(codec.encode({"command": "close", "args": {}}))
            except (BrokenPipeError, OSError):
                pass
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.connection.close()


def vectorize(
    make_env: Callable[[int], SingleEnv],
    env_ids: Sequence[int],
    num_workers: int = 0,
    base_seed: int = 0,
    stream: int = 0,
    transport: str = "pipe",
    env_config: dict[str, Any] | None = None,
    worker_timeout_s: float = 300.0,
    preload: Sequence[str] = (),
) -> "VectorizedEnv":
    """The single envs `env_ids` (all of a config's, or a rollout's share of them) in this
    process (num_workers=0) or in worker processes reached over pipes (`transport=pipe`) or
    ZeroMQ (`transport=zmq`, needs the env's config dict). `preload`: the modules pipe workers
    import before they are forked (`worker_context`)."""
    if num_workers == 0:
        return VectorizedEnv(lambda ids: _LocalWorker(make_env, ids, base_seed, stream), env_ids, 1)
    if transport == "pipe":
        return VectorizedEnv(
            lambda ids: _PipeWorker(make_env, ids, base_seed, stream, worker_timeout_s, preload), env_ids, num_workers
        )
    if transport == "zmq":
        from embodied.sim.remote import EnvHub

        hub = EnvHub(env_config or {}, base_seed, stream, worker_timeout_s)
        return VectorizedEnv(hub.start_worker, env_ids, num_workers, on_close=hub.close)
    raise ConfigError(f"env.transport must be 'pipe' or 'zmq', got '{transport}'")


def vectorize_config(
    env_class: Callable[..., SingleEnv],
    cfg: Any,
    seed: int,
    stream: int,
    env_ids: Sequence[int] | None,
    preload: Sequence[str] = (),
    transport: str | None = None,
    env_config: dict[str, Any] | None = None,
) -> "VectorizedEnv":
    """`vectorize` for an env config with the common fields (num_envs, num_workers,
    transport, latency): `env_class(cfg, env_id, ...)` behind the configured latency, the
    config's own envs or `env_ids` of them. `transport` and `env_config` (default: the
    config's, and the config as a dict) for an env whose workers must run elsewhere."""
    return vectorize(
        with_latency(partial(env_class, cfg), cfg.latency),
        select_env_ids(cfg.num_envs, env_ids),
        cfg.num_workers,
        seed,
        stream,
        transport or cfg.transport,
        asdict(cfg) if env_config is None else env_config,
        preload=preload,
    )


class VectorizedEnv(BatchedEnv):
    def __init__(
        self,
        make_worker: Callable[[list[int]], Any],
        env_ids: Sequence[int],
        num_workers: int,
        on_close: Callable[[], None] | None = None,
    ):
        if len(env_ids) < 1:
            raise ValueError("a vectorized env needs at least one env")
        self.env_ids = [int(i) for i in env_ids]
        self.num_envs = len(self.env_ids)
        self._on_close = on_close
        self._make_worker = make_worker
        self._failed: set[int] = set()  # workers that died or stopped answering
        self._awaiting: set[int] = set()  # workers with a stage step sent and not yet received
        splits = np.array_split(np.asarray(self.env_ids), max(min(num_workers, self.num_envs), 1))
        self._splits = [ids.tolist() for ids in splits]
        self._starts = np.cumsum([0] + [len(ids) for ids in splits])  # first env index of each worker
        self.workers: list[Any] = []
        self._stages = [[k] for k in range(len(self._splits))]  # pipelined rollout: `group_stages`
        try:
            for ids in self._splits:
                self.workers.append(make_worker(ids))
            for worker in self.workers:  # they build their envs side by side
                worker.wait_ready()
            descriptions = self._all("describe")
        except BaseException:
            self.close()
            raise
        self.spec = EnvSpec.from_dict(descriptions[0]["spec"])
        self.tasks = [t for d in descriptions for t in d["tasks"]]
        self.instructions = [t for d in descriptions for t in d["instructions"]]

    def _all(self, command: str, per_worker: list[dict[str, Any]] | None = None) -> list[Any]:
        """Send to every worker, then collect every reply before raising the first failure,
        so no stale reply is left in a pipe."""
        sent, failure = [], None
        for k, worker in enumerate(self.workers):
            try:
                worker.send(command, **(per_worker[k] if per_worker else {}))
                sent.append(k)
            except EnvWorkerError as error:
                self._failed.add(k)
                failure = failure or error
        replies = []
        for k in sent:
            try:
                replies.append(self.workers[k].receive())
            except EnvWorkerError as error:
                self._failed.add(k)
                failure = failure or error
        if failure is not None:
            raise failure
        return replies

    def _split(self, values: np.ndarray) -> list[np.ndarray]:
        return np.split(np.asarray(values), self._starts[1:-1])

    def _observation(self, parts: list[dict[str, Any]], prefix: str = "", rows: slice = slice(None)) -> Observation:
        return Observation(
            state=np.concatenate([p[prefix + "state"] for p in parts]),
            images={
                name: np.concatenate([p[prefix + "images"][name] for p in parts])
                for name in parts[0][prefix + "images"]
            },
            instruction=list(self.instructions[rows]),
        )

    def reset(self, seeds: Sequence[int] | None = None, env_idx: Sequence[int] | None = None) -> Observation:
        env_idx = np.arange(self.num_envs) if env_idx is None else np.asarray(env_idx, dtype=np.int64)
        seeds_arr = None if seeds is None else np.asarray(seeds, dtype=np.int64)
        if seeds_arr is not None and seeds_arr.shape != env_idx.shape:
            raise ValueError(f"got {seeds_arr.size} seeds for {env_idx.size} envs")
        starts = self._starts
        args = []
        for k in range(len(self.workers)):
            mine = (env_idx >= starts[k]) & (env_idx < starts[k + 1])
            args.append(
                {
                    "local_idx": (env_idx[mine] - starts[k]).tolist(),
                    "seeds": None if seeds_arr is None else seeds_arr[mine].tolist(),
                }
            )
        return self._observation(self._all("reset", args))

    def rewind(self) -> Observation:
        return self._observation(self._all("rewind"))

    def drain(self) -> None:
        """Read and drop the replies of stage steps still in flight, so the next request to
        each worker gets its own reply (after a failure that interrupted a pipelined rollout)."""
        for k in sorted(self._awaiting - self._failed):
            try:
                self.workers[k].receive()
            except EnvWorkerError:
                self._failed.add(k)
        self._awaiting.clear()

    def recover(self) -> Observation:
        """Replace every worker that failed with a fresh one (its envs start new
        episodes; the others carry on) and return the full batch of observations."""
        self.drain()
        for k in sorted(self._failed):
            self.workers[k].close()
            self.workers[k] = self._make_worker(self._splits[k])
            self.workers[k].wait_ready()
            self.workers[k].send("reset")
            self.workers[k].receive()
            self._failed.discard(k)
        return self._observation(self._all("observe"))

    def step(self, actions: np.ndarray) -> StepResult:
        actions = np.asarray(actions, dtype=np.float32)
        if actions.ndim != 3 or actions.shape[0] != self.num_envs or actions.shape[2] != self.spec.action_dim:
            raise ValueError(
                f"expected an action chunk of shape ({self.num_envs}, C, {self.spec.action_dim}), got {actions.shape}"
            )
        return self._result(self._all("step", [{"chunk": chunk} for chunk in self._split(actions)]))

    def _result(self, parts: list[dict[str, Any]], rows: slice = slice(None)) -> StepResult:
        cat = lambda key: np.concatenate([p[key] for p in parts])  # noqa: E731
        return StepResult(
            observation=self._observation(parts, rows=rows),
            reward=cat("reward"),
            terminated=cat("terminated"),
            truncated=cat("truncated"),
            success=cat("success"),
            executed_steps=cat("executed_steps"),
            executed_action=cat("executed_action"),
            final_observation=self._observation(parts, prefix="final_", rows=rows),
            episodes=[
                EpisodeStats(int(e[0]), str(e[1]), float(e[2]), int(e[3]), bool(e[4]))
                for p in parts
                for e in p["episodes"]
            ],
        )

    # ---- stages: groups of workers stepped independently, so that inference for one stage
    # ---- overlaps simulation in the others (pipelined rollout)
    def group_stages(self, count: int) -> None:
        """Split the workers into `count` stages of contiguous workers (at most one per worker).
        Until this is called, each worker is a stage."""
        groups = np.array_split(np.arange(len(self.workers)), max(1, min(count, len(self.workers))))
        self._stages = [group.tolist() for group in groups]

    @property
    def num_stages(self) -> int:
        return len(self._stages)

    def _worker_rows(self, worker: int) -> slice:
        return slice(int(self._starts[worker]), int(self._starts[worker + 1]))

    def stage_rows(self, stage: int) -> slice:
        workers = self._stages[stage]
        return slice(int(self._starts[workers[0]]), int(self._starts[workers[-1] + 1]))

    def send_stage_step(self, stage: int, actions: np.ndarray) -> None:
        actions = np.asarray(actions, dtype=np.float32)
        first = self._starts[self._stages[stage][0]]
        for k in self._stages[stage]:
            try:
                chunk = actions[self._starts[k] - first : self._starts[k + 1] - first]
                self.workers[k].send("step", chunk=chunk)
            except EnvWorkerError:
                self._failed.add(k)
                raise
            self._awaiting.add(k)

    def receive_stage_step(self, stage: int) -> StepResult:
        parts = []
        for k in self._stages[stage]:  # a failure leaves the rest awaited: `drain` reads them
            self._awaiting.discard(k)
            try:
                parts.append(self.workers[k].receive())
            except EnvWorkerError:
                self._failed.add(k)
                raise
        return self._result(parts, rows=self.stage_rows(stage))

    def render(self, env_idx: int = 0) -> np.ndarray:
        k = int(np.searchsorted(self._starts, env_idx, side="right") - 1)
        self.workers[k].send("render", local_idx=int(env_idx - self._starts[k]))
        return self.workers[k].receive()

    def expert_actions(self) -> np.ndarray:
        return np.concatenate(self._all("expert_actions"))

    def resume_state(self) -> dict[str, Any] | None:
        """Per env, independent of how envs are spread over workers; None where a worker's
        envs cannot be restored mid-episode (a batched scene: a resumed run starts fresh
        episodes)."""
        parts = self._all("resume_state")
        if any(part is None for part in parts):
            return None
        return {
            "episode": np.concatenate([p["episode"] for p in parts]),
            "seed": np.concatenate([p["seed"] for p in parts]),
            "actions": [a for p in parts for a in p["actions"]],
            "observation_state": np.concatenate([p["observation_state"] for p in parts]),
        }

    def restore(self, state: dict[str, Any] | None) -> Observation:
        if state is None:
            return self.reset()
        if len(state["seed"]) != self.num_envs:
            raise ValueError(f"the saved env state has {len(state['seed'])} envs, this env has {self.num_envs}")
        per_worker = []
        for k in range(len(self.workers)):
            rows = self._worker_rows(k)
            per_worker.append(
                {
                    "saved": {
                        "episode": np.asarray(state["episode"])[rows],
                        "seed": np.asarray(state["seed"])[rows],
                        "actions": list(state["actions"][rows]),
                        "observation_state": np.asarray(state["observation_state"])[rows],
                    }
                }
            )
        observation = self._observation(self._all("restore", per_worker))
        if not np.array_equal(np.asarray(observation.state), np.asarray(state["observation_state"])):
            raise CheckpointError(
                "replaying the episodes in progress at the checkpoint did not reproduce their observations: this "
                "simulator's physics depends on its history (e.g. ManiSkill grasping tasks), so they cannot be "
                "continued exactly. Resume with env_resume=fresh to start new episodes instead"
            )
        return observation

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        self.workers = []
        if self._on_close is not None:
            self._on_close()
            self._on_close = None
