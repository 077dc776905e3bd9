"""`embodied eval`: a run's policy on its training env (or another), or on whole suites."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embodied.build import build_env
from embodied.checkpoint import resolve_checkpoint, run_dir_of
from embodied.config import checkpoint_config
from embodied.core.errors import ConfigError
from embodied.eval_episodes import run_episodes, write_report, write_videos
from embodied.eval_suite import evaluate_suite
from embodied.policy_loading import load_run_policy


def evaluate_checkpoint(config: Any) -> Path:
    """`embodied eval`: load a checkpoint, run episodes on the training env (or
    `config.env`), write report.json / report.md (and videos) and return the output dir."""
    if config.suite:
        return evaluate_suite(config)
    if not config.checkpoint:
        raise ConfigError("eval needs checkpoint=<run dir or checkpoint dir>")
    checkpoint = resolve_checkpoint(config.checkpoint)
    trained = checkpoint_config(checkpoint)
    env_cfg = config.env or trained.env
    label = getattr(env_cfg, "task", None) or getattr(env_cfg, "suite", env_cfg.name)
    env = build_env(env_cfg, seed=config.seed, stream=1)
    instructions = dict(zip(env.tasks, env.instructions))
    try:
        loaded = load_run_policy(checkpoint, spec=env.spec, label=f"env '{label}'")
        results, videos = run_episodes(
            env, loaded.policy, config.episodes, config.deterministic, config.video_episodes, config.progress_bar
        )
    finally:
        env.close()
    output = Path(config.output) if config.output else run_dir_of(checkpoint) / "eval" / label
    write_report(
        output,
        results,
        {
            "checkpoint": str(checkpoint),
            "env": env_cfg.name,
            "policy_version": loaded.state.get("learner", {}).get("policy_version"),
            "env_steps": loaded.state.get("env_steps"),
            "deterministic": config.deterministic,
            "seed": config.seed,
            "instructions": instructions,
        },
    )
    if videos:
        write_videos(output / "videos", videos)
    return output
