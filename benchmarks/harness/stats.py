"""The figures the reports compute from curves and seeds: when a curve reaches or holds a goal,
and intervals and table cells over seeds."""

from __future__ import annotations

import numpy as np


def first_reaching(curve: list[dict], metric: str, threshold: float) -> int | None:
    return next((p["env_steps"] for p in curve if p.get(metric, -np.inf) >= threshold), None)


def held_from(curve: list[dict], threshold: float) -> int | None:
    """The first evaluation from which success never fell below `threshold` again."""
    held = None
    for point in curve:
        if point["eval/success_rate"] < threshold:
            held = None
        elif held is None:
            held = point["env_steps"]
    return held


def interval95(values: list[float], bounds: tuple[float, float] = (0.0, 1.0)) -> list[float]:
    """Student's t interval of the mean over seeds (n = 3: t = 4.303), cut to what the measure
    can be (a success rate [0, 1], a return its bounds): three seeds' spread can reach past it."""
    from scipy import stats

    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return [float("nan"), float("nan")]
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return [float(max(values.mean() - half, bounds[0])), float(min(values.mean() + half, bounds[1]))]


def mode_name(mode: str) -> str:
    return "greedy" if mode == "deterministic" else "sampled"


def seed_cells(values: list[float], bounds: tuple[float, float] = (0.0, 1.0)) -> str:
    """Table cells over seeds: per seed | mean | min | max | 95% interval of the mean."""
    low, high = interval95(values, bounds)
    spread = f"[{low:.3f}, {high:.3f}]" if len(values) > 1 else "- (one seed)"
    return (
        f"{', '.join(f'{v:.2f}' for v in values)} | {np.mean(values):.3f} | {min(values):.2f} | "
        f"{max(values):.2f} | {spread}"
    )
