"""`embodied eval suite=<name>[,<name>...]`: every task of one or more suites, `trials`
trials each, by the standard protocol, resumable.

    embodied eval checkpoint=runs/x suite=[libero_spatial,libero_goal] trials=50 env.num_workers=4
    embodied eval policy=pi05 policy.pretrained=/models/pi05_libero suite=[libero_spatial,libero_spatial_swap]

Trial k of a task is reset with seed k: for LIBERO that is the task's standard init state k
(see `embodied.sim.libero`), so every harness that follows the protocol evaluates the same scenes. Each
task's trials run in waves across the env's parallel envs. Every finished trial is appended
to `<output>/episodes.jsonl` (flushed to disk) before the next wave: a killed evaluation
started again with the same arguments continues where it stopped and never counts a trial
twice. The report has per-task and per-suite success with 95% Wilson intervals."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from embodied.build import build_env
from embodied.core.env import BatchedEnv
from embodied.core.errors import ConfigError
from embodied.core.policy import Policy
from embodied.core.types import EpisodeStats
from embodied.eval.episodes import eval_generator, write_report, write_videos
from embodied.runs.loading import policy_source
from embodied.sim.libero import SUITE_TASK_COUNTS

MANISKILL_SUITE = ["PushCube-v1", "PickCube-v1", "StackCube-v1", "PegInsertionSide-v1"]


def _libero_tasks(suite: str) -> Callable[[Any], list[tuple[str, Any]]]:
    def tasks(base: Any) -> list[tuple[str, Any]]:
        return [
            (f"{suite}/{t}", dataclasses.replace(base, suite=suite, task_ids=[t]))
            for t in range(SUITE_TASK_COUNTS[suite])
        ]

    return tasks


def _maniskill_tasks(base: Any) -> list[tuple[str, Any]]:
    return [(f"maniskill/{task}", dataclasses.replace(base, task=task)) for task in MANISKILL_SUITE]


# suite name -> (env name, the per-task env configs derived from a base config of that env)
SUITES: dict[str, tuple[str, Callable[[Any], list[tuple[str, Any]]]]] = {
    **{suite: ("libero", _libero_tasks(suite)) for suite in SUITE_TASK_COUNTS},  # with LIBERO-PRO's
    "maniskill": ("maniskill", _maniskill_tasks),
}


def suite_tasks(
    suites: list[str], config_env: Any, trained_env: Any, task_ids: list[int] | None
) -> list[tuple[str, str, Any]]:
    """(suite, task label, env config) for every task to evaluate. The base env config is
    `env=` from the command line, else the training env if it is the suite's kind of env,
    else that env's defaults."""
    from embodied.core.registry import ENVS, unknown_name_message

    tasks = []
    for suite in suites:
        if suite not in SUITES:
            raise ConfigError(unknown_name_message("evaluation suite", suite, sorted(SUITES)))
        env_name, expand = SUITES[suite]
        base = (
            next((c for c in (config_env, trained_env) if c is not None and c.name == env_name), None)
            or ENVS.get(env_name).schema()
        )
        chosen = expand(base)
        if task_ids is not None:
            bad = [t for t in task_ids if not 0 <= t < len(chosen)]
            if bad:
                raise ConfigError(f"task_ids {bad} are not in {suite} (tasks 0-{len(chosen) - 1})")
            chosen = [chosen[t] for t in task_ids]
        tasks += [(suite, label, env_cfg) for label, env_cfg in chosen]
    return tasks


class TrialLog:
    """Finished trials in `<output>/episodes.jsonl`, one JSON line each, flushed and synced
    before the next wave starts. `meta` must match what an earlier, interrupted run wrote."""

    def __init__(self, output: Path, meta: dict[str, Any]):
        output.mkdir(parents=True, exist_ok=True)
        self.path = output / "episodes.jsonl"
        meta_path = output / "eval_config.json"
        if meta_path.is_file() and self.path.is_file():
            previous = json.loads(meta_path.read_text())
            if previous != meta:
                changed = sorted(k for k in set(previous) | set(meta) if previous.get(k) != meta.get(k))
                raise ConfigError(
                    f"{output} holds an evaluation with other settings ({', '.join(changed)}); "
                    f"pass another output= or remove it"
                )
        meta_path.write_text(json.dumps(meta, indent=2))
        self.records: list[dict[str, Any]] = []
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                try:
                    self.records.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut short by a kill: that trial runs again
                    break
            self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))

    def done(self, task: str) -> set[int]:
        return {r["trial"] for r in self.records if r["task"] == task}

    def add(self, records: list[dict[str, Any]]) -> None:
        with open(self.path, "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records += records


@torch.no_grad()
def run_trials(
    env: BatchedEnv,
    policy: Policy,
    trials: list[int],
    seed: int,
    deterministic: bool,
    video_trials: set[int],
    on_wave: Callable[[dict[int, EpisodeStats]], None],
) -> dict[int, list[np.ndarray]]:
    """Run `trials` (reset seeds) in waves of `env.num_envs`; the first episode each env
    finishes in a wave is its trial's result, handed to `on_wave` when the wave is over.
    The policy draws from a stream of the wave's own, seeded with `seed` and the wave's first
    trial. Returns the frames of the trials in `video_trials`."""
    videos: dict[int, list[np.ndarray]] = {}
    for start in range(0, len(trials), env.num_envs):
        wave = trials[start : start + env.num_envs]
        generator = eval_generator(policy, int(np.random.SeedSequence([seed, wave[0]]).generate_state(1)[0]))
        seeds = wave + [wave[-1]] * (env.num_envs - len(wave))  # spare envs repeat a trial, unrecorded
        observation = env.reset(seeds=seeds)
        pending = set(range(len(wave)))
        frames = {i: [env.render(i)] for i, trial in enumerate(wave) if trial in video_trials}
        results: dict[int, EpisodeStats] = {}
        while pending:
            chunk = policy.act(observation.to_torch(policy.device), deterministic=deterministic, generator=generator)
            result = env.step(chunk.actions.cpu().numpy())
            observation = result.observation
            for episode in result.episodes:
                if episode.env_id in pending:
                    pending.discard(episode.env_id)
                    results[wave[episode.env_id]] = episode
            for i in list(frames):
                if i in pending:
                    frames[i].append(env.render(i))
                else:  # its episode ended; what the env shows now is the next one
                    videos[wave[i]] = frames.pop(i)
        on_wave(results)
    return videos


def evaluate_suite(config: Any) -> Path:
    source = policy_source(config.checkpoint, config.policy)
    names = [config.suite] if isinstance(config.suite, str) else list(config.suite)
    suites = [s.strip() for name in names for s in str(name).split(",") if s.strip()]
    tasks = suite_tasks(suites, config.env, source.trained_env, config.task_ids)
    output = Path(config.output) if config.output else source.default_output / "+".join(suites)
    log = TrialLog(output, _evaluation_meta(config, source.name, suites, tasks))
    bar = tqdm(
        total=len(tasks) * config.trials,
        initial=sum(len(log.done(label)) for _, label, _ in tasks),
        desc="eval",
        unit="trial",
        disable=not config.progress_bar,
    )
    policies = PolicyPerSpec(source)
    for suite, label, env_cfg in tasks:
        remaining = [k for k in range(config.trials) if k not in log.done(label)]
        if remaining:
            _evaluate_task(config, suite, label, env_cfg, remaining, policies, log, bar.update, output)
    bar.close()
    _write_suite_report(config, source, suites, tasks, log, output)
    return output


def _evaluation_meta(config: Any, checkpoint: str, suites: list[str], tasks: list[tuple[str, str, Any]]) -> dict:
    """What an interrupted evaluation must have been started with to be continued."""
    meta = {
        "checkpoint": checkpoint,
        "suites": suites,
        "trials": config.trials,
        "task_ids": config.task_ids,
        "deterministic": config.deterministic,
        "env": [dataclasses.asdict(e) for _, _, e in tasks[:1]],
    }
    if config.policy is not None:  # a published model: its settings (inputs, statistics) are the evaluation's
        meta["policy"] = dataclasses.asdict(config.policy)
    return meta


class PolicyPerSpec:
    """The evaluated policy, loaded again only when the env spec changes: the tasks of a
    suite share one spec, so it loads once per suite kind."""

    def __init__(self, source: Any):
        self.source = source
        self.spec: Any = None
        self.policy: Policy | None = None

    def for_env(self, env: BatchedEnv, label: str) -> Policy:
        if self.policy is None or env.spec != self.spec:
            self.policy, self.spec = self.source.load(env.spec, label).policy, env.spec
        return self.policy


def _evaluate_task(
    config: Any,
    suite: str,
    label: str,
    env_cfg: Any,
    remaining: list[int],
    policies: PolicyPerSpec,
    log: TrialLog,
    advance: Callable[[int], Any],
    output: Path,
) -> None:
    """The `remaining` trials of one task, each logged as its wave ends; videos of the first
    `video_episodes` trials."""
    env = build_env(
        dataclasses.replace(env_cfg, num_envs=min(env_cfg.num_envs, len(remaining))), seed=config.seed, stream=1
    )
    try:
        policy = policies.for_env(env, label)
        instruction = env.instructions[0]

        def record(results: dict[int, EpisodeStats]) -> None:
            log.add(
                [
                    {
                        "suite": suite,
                        "task": label,
                        "instruction": instruction,
                        "trial": trial,
                        "seed": trial,
                        "success": bool(e.success),
                        "episode_return": float(e.episode_return),
                        "length": int(e.length),
                    }
                    for trial, e in sorted(results.items())
                ]
            )
            advance(len(results))

        videos = run_trials(
            env, policy, remaining, config.seed, config.deterministic, set(range(config.video_episodes)), record
        )
    finally:
        env.close()
    if videos:
        write_videos(
            output / "videos" / label.replace("/", "_"),
            list(videos.values()),
            names=[f"trial_{trial:03d}" for trial in videos],
        )


def _write_suite_report(
    config: Any, source: Any, suites: list[str], tasks: list[tuple[str, str, Any]], log: TrialLog, output: Path
) -> None:
    """report.json/.md over every trial logged, this run's and an interrupted one's."""
    episodes = [
        EpisodeStats(
            env_id=r["trial"],
            task=r["task"],
            episode_return=r["episode_return"],
            length=r["length"],
            success=r["success"],
        )
        for r in log.records
    ]
    groups = {s: [label for suite, label, _ in tasks if suite == s] for s in suites}
    write_report(
        output,
        episodes,
        groups=groups,
        meta={
            "checkpoint": source.name,
            "suites": suites,
            "trials": config.trials,
            "policy_version": source.state.get("learner", {}).get("policy_version"),
            "env_steps": source.state.get("env_steps"),
            "deterministic": config.deterministic,
            "seed": "k for trial k",
            "instructions": {r["task"]: r["instruction"] for r in log.records},
        },
    )
