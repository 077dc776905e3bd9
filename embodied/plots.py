"""`embodied plot <run dir> [<run dir> ...] [output=<png>]`: learning curves of one or several
runs in one PNG, read from each run's metrics.jsonl.

A training run gives success and return of its training episodes and, where it evaluated
during training, the deterministic evaluation's success, all against env steps; an SFT run
gives its training and validation losses against gradient steps. Runs of both kinds may be
plotted together; each panel shows the runs that have its metric."""

from __future__ import annotations

import json
from pathlib import Path

from embodied.core.errors import ConfigError

# (metric, title, x axis): the panels, in order; a panel no run has a metric for is left out.
PANELS = [
    ("rollout/success_rate", "training success (last 100 episodes)", "env_steps"),
    ("eval/success_rate", "evaluation success (deterministic)", "env_steps"),
    ("rollout/episode_return", "training episode return", "env_steps"),
    ("sft/loss", "SFT loss", "iteration"),
    ("sft/val_loss", "SFT validation loss", "iteration"),
]


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no metrics.jsonl: is it a run directory (embodied train or sft)?")
    lines, rows = path.read_text().splitlines(), []
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):  # only a last line cut short by a kill is expected
                raise ConfigError(f"{path}:{number} is not a JSON line") from None
    return rows


def curves(runs: dict[str, list[dict]]) -> list[tuple[str, str, str, dict[str, tuple[list, list]]]]:
    """(metric, title, x axis, {run: (xs, ys)}) for every panel some run has data for."""
    panels = []
    for metric, title, axis in PANELS:
        lines = {}
        for name, rows in runs.items():
            points = [(row[axis], row[metric]) for row in rows if metric in row and axis in row]
            if points:
                lines[name] = ([x for x, _ in points], [y for _, y in points])
        if lines:
            panels.append((metric, title, axis, lines))
    return panels


def plot_runs(run_dirs: list[Path], output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not run_dirs:
        raise ConfigError("plot needs at least one run directory: embodied plot runs/<run> [runs/<other> ...]")
    names = [d.name for d in run_dirs]
    if len(set(names)) < len(names):  # same folder names under different parents: say which
        names = [str(d) for d in run_dirs]
    panels = curves({name: read_metrics(d) for name, d in zip(names, run_dirs)})
    if not panels:
        raise ConfigError(f"no curves to plot: none of {', '.join(names)} has logged a metric yet")
    figure, axes = plt.subplots(len(panels), 1, figsize=(8, 3 * len(panels)), squeeze=False)
    for ax, (metric, title, axis, lines) in zip(axes[:, 0], panels):
        for name, (xs, ys) in lines.items():
            ax.plot(xs, ys, label=name, marker="o" if len(xs) < 20 else None)
        ax.set_title(title)
        ax.set_xlabel("env steps" if axis == "env_steps" else "gradient steps")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if metric.endswith("success_rate"):
            ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110)
    plt.close(figure)
    return output
