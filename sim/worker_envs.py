"""The single envs one worker steps, in one process: executes action chunks, auto-resets, keeps
per-episode bookkeeping. Results are plain dicts of numpy arrays so that a worker can answer
from another process through `embodied.core.codec`."""

from __future__ import annotations

import traceback
from typing import Any, Callable, Sequence

import numpy as np

from embodied.core.env import SingleEnv, SingleObservation, episode_seed
from embodied.core.errors import EnvWorkerError


class WorkerEnvs:
    def __init__(self, make_env: Callable[[int], SingleEnv], env_ids: Sequence[int], base_seed: int, stream: int = 0):
        self.env_ids = list(env_ids)
        self.envs = [make_env(env_id) for env_id in self.env_ids]
        self.base_seed = base_seed
        self.stream = stream
        spec = self.envs[0].spec
        self.low = np.asarray(spec.action_low, dtype=np.float32)
        self.high = np.asarray(spec.action_high, dtype=np.float32)
        n = len(self.envs)
        self.episode = np.full(n, -1, dtype=np.int64)
        self.seed = np.zeros(n, dtype=np.int64)
        self.actions: list[list[np.ndarray]] = [[] for _ in range(n)]
        self.episode_return = np.zeros(n, dtype=np.float64)
        self.episode_success = np.zeros(n, dtype=bool)
        self.observations: list[SingleObservation | None] = [None] * n

    def describe(self) -> dict[str, Any]:
        return {
            "spec": self.envs[0].spec.to_dict(),
            "tasks": [env.task for env in self.envs],
            "instructions": [env.instruction for env in self.envs],
        }

    def _start_episode(self, i: int, seed: int | None) -> None:
        self.episode[i] += 1
        if seed is None:
            seed = episode_seed(self.base_seed, self.env_ids[i], int(self.episode[i]), self.stream)
        self.seed[i] = seed
        self.actions[i] = []
        self.episode_return[i] = 0.0
        self.episode_success[i] = False
        self.observations[i] = self.envs[i].reset(int(seed))

    def reset(self, local_idx: Sequence[int] | None = None, seeds: Sequence[int] | None = None) -> dict[str, Any]:
        local_idx = range(len(self.envs)) if local_idx is None else local_idx
        for k, i in enumerate(local_idx):
            self._start_episode(int(i), None if seeds is None else int(seeds[k]))
        return self._batch(self.observations)

    def observe(self) -> dict[str, Any]:
        return self._batch(self.observations)

    def rewind(self) -> dict[str, Any]:
        self.episode[:] = -1
        return self.reset()

    def step(self, chunk: np.ndarray) -> dict[str, Any]:
        n, chunk_size, action_dim = chunk.shape
        reward = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        success = np.zeros(n, dtype=bool)
        executed_steps = np.zeros(n, dtype=np.int64)
        executed_action = np.zeros((n, chunk_size, action_dim), dtype=np.float32)
        final: list[SingleObservation | None] = [None] * n
        episodes = []
        for i, env in enumerate(self.envs):
            for j in range(chunk_size):
                action = np.clip(chunk[i, j], self.low, self.high).astype(np.float32)
                result = env.step(action)
                self.actions[i].append(action)
                executed_action[i, j] = action
                executed_steps[i] += 1
                reward[i] += result.reward
                self.episode_return[i] += result.reward
                success[i] |= result.success
                self.observations[i] = result.observation
                if result.terminated or result.truncated:
                    terminated[i], truncated[i] = result.terminated, result.truncated
                    break
            self.episode_success[i] |= success[i]
            if terminated[i] or truncated[i]:
                final[i] = self.observations[i]
                episodes.append(
                    [
                        self.env_ids[i],
                        env.task,
                        float(self.episode_return[i]),
                        len(self.actions[i]),
                        bool(self.episode_success[i]),
                    ]
                )
                self._start_episode(i, None)
        blank = self.observations[0]
        final_batch = self._batch([f if f is not None else blank for f in final])
        return step_reply(
            self._batch(self.observations),
            final_batch,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=success,
            executed_steps=executed_steps,
            executed_action=executed_action,
            episodes=episodes,
        )

    def render(self, local_idx: int) -> np.ndarray:
        return self.envs[local_idx].render()

    def expert_actions(self) -> np.ndarray:
        return np.stack([env.expert_action() for env in self.envs]).astype(np.float32)

    def resume_state(self) -> dict[str, Any]:
        """Each env's episode as (seed, actions since reset): replaying them on a
        deterministic simulator restores the exact state without simulator-specific code."""
        action_dim = self.low.shape[0]
        return {
            "episode": self.episode.copy(),
            "seed": self.seed.copy(),
            "actions": [np.asarray(a, dtype=np.float32).reshape(-1, action_dim) for a in self.actions],
            "observation_state": self._batch(self.observations)["state"],
        }

    def restore(self, saved: dict[str, Any]) -> dict[str, Any]:
        for i, env in enumerate(self.envs):
            self.episode[i] = int(saved["episode"][i]) - 1
            self._start_episode(i, int(saved["seed"][i]))
            for action in saved["actions"][i]:
                result = env.step(np.asarray(action, dtype=np.float32))
                self.actions[i].append(np.asarray(action, dtype=np.float32))
                self.episode_return[i] += result.reward
                self.episode_success[i] |= result.success
                self.observations[i] = result.observation
        return self._batch(self.observations)  # the caller compares it with the saved observations

    def close(self) -> None:
        for env in self.envs:
            env.close()

    @staticmethod
    def _batch(observations: list[SingleObservation | None]) -> dict[str, Any]:
        return {
            "state": np.stack([o.state for o in observations]).astype(np.float32),
            "images": {name: np.stack([o.images[name] for o in observations]) for name in observations[0].images},
        }


def step_reply(observation: dict[str, Any], final: dict[str, Any], **results: Any) -> dict[str, Any]:
    """A worker's answer to `step`, as `VectorizedEnv` reads it: the batch's observations after
    the chunk, each env's final one (`state`, `images`; the observation kept for bootstrapping
    where its episode ended), and `results`: reward, terminated, truncated, success,
    executed_steps, executed_action, and the finished episodes as [env id, task, return,
    length, success]."""
    return {**observation, **results, "final_state": final["state"], "final_images": final["images"]}


COMMANDS = frozenset(
    {"describe", "observe", "reset", "rewind", "step", "render", "expert_actions", "resume_state", "restore"}
)


def run_command(envs: WorkerEnvs, request: Any) -> dict[str, Any]:
    """Execute one `{command, args}` request from a worker's channel: `{ok: result}` or
    `{error: text}`; only the envs' public commands can be called."""
    command = request.get("command") if isinstance(request, dict) else None
    if command not in COMMANDS:
        return {"error": f"unknown command {command!r}; known: {', '.join(sorted(COMMANDS))}"}
    try:
        return {"ok": getattr(envs, command)(**request.get("args", {}))}
    except Exception:
        return {"error": traceback.format_exc()}


def unwrap_reply(reply: dict[str, Any], worker: str) -> Any:
    """The result inside a `run_command` reply, or the worker's error raised here."""
    if "error" in reply:
        raise EnvWorkerError(f"{worker} failed:\n{reply['error']}")
    return reply["ok"]
