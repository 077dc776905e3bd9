"""`embodied eval`: a run's policy, or a published model as it is, on an env or on whole
suites."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embodied.build import build_env
from embodied.core.errors import ConfigError
from embodied.eval.episodes import run_episodes, write_report, write_videos
from embodied.eval.suites import evaluate_suite
from embodied.runs.loading import policy_source


def evaluate_checkpoint(config: Any) -> Path:
    """`embodied eval`: load a checkpoint (or `policy.pretrained`), run episodes on the
    training env (or `config.env`), write report.json / report.md (and videos) and return the
    output dir."""
    if config.suite:
        return evaluate_suite(config)
    source = policy_source(config.checkpoint, config.policy)
    env_cfg = config.env or source.trained_env
    if env_cfg is None:
        raise ConfigError("a published model has no training env here: give env=<env config> or suite=<suites>")
    label = getattr(env_cfg, "task", None) or getattr(env_cfg, "suite", env_cfg.name)
    env = build_env(env_cfg, seed=config.seed, stream=1)
    instructions = dict(zip(env.tasks, env.instructions))
    try:
        loaded = source.load(env.spec, f"env '{label}'")
        results, videos = run_episodes(
            env,
            loaded.policy,
            config.episodes,
            config.seed,
            config.deterministic,
            config.video_episodes,
            config.progress_bar,
        )
    finally:
        env.close()
    output = Path(config.output) if config.output else source.default_output / label
    write_report(
        output,
        results,
        {
            "checkpoint": source.name,
            "env": env_cfg.name,
            "policy_version": source.state.get("learner", {}).get("policy_version"),
            "env_steps": source.state.get("env_steps"),
            "deterministic": config.deterministic,
            "seed": config.seed,
            "instructions": instructions,
        },
    )
    if videos:
        write_videos(output / "videos", videos)
    return output
