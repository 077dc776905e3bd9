"""Evaluation episodes and their report: success rate with a 95% Wilson interval, return and
length per task; JSON + Markdown; optional videos of the first episodes."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from embodied.core.env import BatchedEnv
from embodied.core.policy import Policy
from embodied.core.types import EpisodeStats


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """Score interval for a binomial proportion; sensible at 0% and 100%, unlike mean +- 2 sd."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z**2 / trials
    centre = (p + z**2 / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z**2 / (4 * trials**2)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class TaskResult:
    task: str
    episodes: int
    successes: int
    success_rate: float
    success_ci95: tuple[float, float]
    mean_return: float
    mean_length: float


def summarize(task: str, episodes: list[EpisodeStats]) -> TaskResult:
    successes = sum(e.success for e in episodes)
    n = len(episodes)
    return TaskResult(
        task=task,
        episodes=n,
        successes=successes,
        success_rate=successes / n if n else 0.0,
        success_ci95=wilson_interval(successes, n),
        mean_return=float(np.mean([e.episode_return for e in episodes])) if n else 0.0,
        mean_length=float(np.mean([e.length for e in episodes])) if n else 0.0,
    )


def eval_generator(policy: Policy, seed: int) -> torch.Generator:
    """The evaluation's own random stream. A policy's "deterministic" mode may still draw
    (a flow or diffusion policy's initial noise), and drawing from torch's global stream would
    make two evaluations of one checkpoint on one seed disagree."""
    return torch.Generator(device=policy.device).manual_seed(seed)


@torch.no_grad()
def run_episodes(
    env: BatchedEnv,
    policy: Policy,
    episodes: int,
    seed: int,
    deterministic: bool = True,
    video_episodes: int = 0,
    progress: bool = True,
) -> tuple[list[EpisodeStats], list[list[np.ndarray]]]:
    """Run the env's fixed evaluation set (it is rewound first) until `episodes` ended, the
    policy drawing from a stream seeded with `seed`: the same checkpoint, env and seed give the
    same episodes.

    Each env gets a fixed share of the episodes, fixed in advance, so that envs whose
    episodes end sooner do not bias the sample toward short (often failing) episodes."""
    quota = np.full(env.num_envs, episodes // env.num_envs)
    quota[: episodes % env.num_envs] += 1
    finished = np.zeros(env.num_envs, dtype=np.int64)
    results: list[EpisodeStats] = []
    videos: list[list[np.ndarray]] = []
    frames: list[np.ndarray] = []
    record = video_episodes > 0
    observation = env.rewind()
    if record:
        frames.append(env.render(0))
    device = policy.device
    generator = eval_generator(policy, seed)
    bar = tqdm(total=episodes, desc="eval", unit="ep", disable=not progress)
    while (finished < quota).any():
        chunk = policy.act(observation.to_torch(device), deterministic=deterministic, generator=generator)
        result = env.step(chunk.actions.cpu().numpy())
        observation = result.observation
        for episode in result.episodes:
            if finished[episode.env_id] < quota[episode.env_id]:
                finished[episode.env_id] += 1
                results.append(episode)
                bar.update(1)
        if record:
            if result.done[0]:
                videos.append(frames)
                frames = []
                record = len(videos) < video_episodes
            if record:
                frames.append(env.render(0))
    bar.close()
    return results, videos


def write_report(
    output: Path, results: list[EpisodeStats], meta: dict[str, Any], groups: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    """report.json and report.md: per task, per group of tasks (e.g. a suite) and overall."""
    output.mkdir(parents=True, exist_ok=True)
    tasks = sorted({e.task for e in results})
    per_task = [summarize(task, [e for e in results if e.task == task]) for task in tasks]
    per_group = [summarize(name, [e for e in results if e.task in members]) for name, members in (groups or {}).items()]
    overall = summarize("all", results)
    report = {
        **meta,
        "overall": asdict(overall),
        "tasks": [asdict(t) for t in per_task],
        "groups": [asdict(g) for g in per_group],
        "episodes": [asdict(e) for e in results],
    }
    (output / "report.json").write_text(json.dumps(report, indent=2))
    lines = [
        f"# Evaluation: {meta.get('checkpoint', '')}",
        "",
        f"policy_version {meta.get('policy_version')}, env steps trained {meta.get('env_steps')}, "
        f"{'deterministic' if meta.get('deterministic') else 'sampled'} actions, seed {meta.get('seed')}",
        "",
        "| task | episodes | success | 95% CI | mean return | mean length | instruction |",
        "| --- | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    instructions = meta.get("instructions", {})
    several_groups = len(per_group) > 1
    for t in per_task + (per_group if several_groups else []) + ([overall] if len(per_task) > 1 else []):
        low, high = t.success_ci95
        lines.append(
            f"| {t.task} | {t.episodes} | {t.success_rate:.1%} | [{low:.1%}, {high:.1%}] "
            f"| {t.mean_return:.2f} | {t.mean_length:.1f} | {instructions.get(t.task, '')} |"
        )
    (output / "report.md").write_text("\n".join(lines) + "\n")
    return report


def write_videos(
    output: Path, videos: list[list[np.ndarray]], fps: int = 20, names: list[str] | None = None
) -> list[Path]:
    import imageio.v2 as imageio

    output.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, frames in enumerate(videos):
        path = output / f"{names[i] if names else f'episode_{i:03d}'}.mp4"
        imageio.mimwrite(path, frames, fps=fps, macro_block_size=1)
        paths.append(path)
    return paths
