"""Demonstrations from a scripted expert (`embodied.sim.experts`) in a ManiSkill env, written as a
LeRobotDataset v3 through the robot client's recorder (`embodied.robots.recording`): every frame is
the operator's (intervention set, no policy action), as in `embodied collect`.

The dataset grows to `episodes` successful episodes. `meta/demos.json` keeps the next
episode's seed, so running the command again continues where it stopped and never
repeats an initial state. With several tasks (`env.tasks`), the episode with seed k runs
tasks[k mod n] with that task's expert and instruction, states padded as the env pads them."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from tqdm import tqdm

from embodied.core.errors import ConfigError

SIDECAR = Path("meta") / "demos.json"


@dataclass
class DemosConfig:
    env: Any = None
    dataset: Optional[str] = None  # the dataset's folder; a dataset already there gets more episodes
    episodes: int = 50  # successful episodes the dataset should hold
    max_attempts: Optional[int] = None  # episodes tried at most (default: 2 x episodes)
    action_noise: float = 0.0  # Gaussian noise on the expert's motion (diversity for SFT; 0.1 is plenty)
    keep_failures: bool = False  # also keep episodes the expert failed
    seed: int = 0  # episode k of a new dataset is reset with seed + k
    repo_id: str = "local/demos"
    use_videos: bool = False  # camera frames as images (what learners here read) or video
    python: Optional[str] = None  # the dataset writer's interpreter (default: .venv-dataset, see README)
    finalize_every: int = 25  # saved episodes per finalize: reopening reloads the whole dataset
    progress_bar: bool = True


@dataclass
class DemosResult:
    episodes: int  # in the dataset now
    added: int
    attempts: int
    successes: int


def generate_demos(config: DemosConfig) -> DemosResult:
    _check(config)
    tasks, envs, experts = _envs_and_experts(config)
    try:
        recorder = _recorder(config, envs[0])
        try:
            result = _record_until_full(config, tasks, envs, experts, recorder, have=recorder.open())
        finally:
            recorder.close()
    finally:
        for env in envs:
            env.close()
    if result.episodes < config.episodes:
        raise ConfigError(
            f"the expert succeeded in {result.successes} of {result.attempts} attempts; the dataset holds "
            f"{result.episodes} of {config.episodes} episodes (raise max_attempts, lower action_noise or "
            "keep_failures=true)"
        )
    return result


def _check(config: DemosConfig) -> None:
    from embodied.sim.latency import LatencyConfig

    if not config.dataset:
        raise ConfigError("demos need dataset=<dataset folder>")
    if config.episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {config.episodes}")
    if config.env.name != "maniskill":
        raise ConfigError(f"the scripted experts drive ManiSkill envs, not env '{config.env.name}'")
    if LatencyConfig.from_value(config.env.latency).active:
        raise ConfigError(
            "env.latency: a scripted expert acts on the simulator's state now, so its actions would be "
            "recorded against delayed observations; record demos without it (train with it)"
        )


def _envs_and_experts(config: DemosConfig) -> tuple[list[str], list[Any], list[Any]]:
    """One single env and one expert per task (`env.tasks`, else `env.task`)."""
    from embodied.sim.experts import make_expert
    from embodied.sim.maniskill import task_of, with_state_padding
    from embodied.sim.maniskill_common import ManiSkillConfig
    from embodied.sim.worker import single_env_factory

    env_config = with_state_padding(ManiSkillConfig(**asdict(config.env)))
    tasks = env_config.tasks or [env_config.task]
    # the experts first: a task or control they do not know is refused before any env is built
    experts = [make_expert(task, env_config.control_mode, config.action_noise, config.seed) for task in tasks]
    make_env = single_env_factory(asdict(env_config))
    envs: list[Any] = []
    try:
        for task in tasks:
            envs.append(make_env(next(i for i in range(env_config.num_envs) if task_of(env_config, i) == task)))
    except BaseException:
        for env in envs:  # the ones built before the failure
            env.close()
        raise
    return tasks, envs, experts


def _recorder(config: DemosConfig, env: Any) -> Any:
    from embodied.robots.recording import DatasetRecorder, RecordingConfig

    return DatasetRecorder(
        RecordingConfig(
            dataset=config.dataset,
            repo_id=config.repo_id,
            use_videos=config.use_videos,
            partial="discard",
            python=config.python,
            finalize_every=config.finalize_every,
        ),
        env.spec,
        fps=env.spec.control_hz,
        instruction=env.instruction,
    )


def _record_until_full(
    config: DemosConfig, tasks: list[str], envs: list[Any], experts: list[Any], recorder: Any, have: int
) -> DemosResult:
    """Episodes until the dataset holds `config.episodes` (or the attempts run out), the next
    seed saved with every kept episode."""
    sidecar = Path(config.dataset).expanduser() / SIDECAR
    seed = json.loads(sidecar.read_text())["next_seed"] if sidecar.is_file() else config.seed + have
    max_attempts = config.max_attempts or 2 * config.episodes
    start, attempts, successes = have, 0, 0
    bar = tqdm(
        total=config.episodes,
        initial=have,
        unit="episode",
        desc="demos",
        disable=not config.progress_bar,
        dynamic_ncols=True,
    )
    while have < config.episodes and attempts < max_attempts:
        env, expert = envs[seed % len(envs)], experts[seed % len(envs)]
        recorder.instruction = env.instruction
        success, terminated = run_episode(env, expert, recorder, seed)
        attempts, seed = attempts + 1, seed + 1
        successes += success
        keep = success or config.keep_failures
        recorder.end_episode(success, keep=keep, terminated=terminated)
        if keep:
            have += 1
            bar.update(1)
            sidecar_record = {
                "next_seed": seed,
                "tasks": tasks,
                "control_mode": config.env.control_mode,
                "action_noise": config.action_noise,
            }
            _write_atomically(sidecar, json.dumps(sidecar_record))
        bar.set_postfix(success=f"{successes}/{attempts}")
    bar.close()
    return DemosResult(episodes=have, added=have - start, attempts=attempts, successes=successes)


def run_episode(env: Any, expert: Any, recorder: Any, seed: int) -> tuple[bool, bool]:
    """One episode to the env's time limit, every frame recorded. Returns whether it succeeded at
    any step (the env's success convention) and whether the env terminated it (rather than its
    time limit: with `ignore_terminations` a success does not end the episode)."""
    observation = env.reset(seed)
    expert.reset()
    success = False
    for _ in range(env.spec.max_episode_steps or 1000):
        action = expert.act(env.env.unwrapped)
        step = env.step(action)
        recorder.add(observation.state, observation.images, action, None, intervention=True, reward=step.reward)
        success |= step.success
        observation = step.observation
        if step.terminated or step.truncated:
            return success, step.terminated
    return success, False


def _write_atomically(path: Path, text: str) -> None:
    staging = path.with_suffix(".tmp")
    staging.write_text(text)
    os.replace(staging, path)
