"""The one chart the speed benchmarks share: a bar per configuration."""

from __future__ import annotations

from pathlib import Path


def bar_chart(path: Path, values: dict[str, float], ylabel: str, title: str, xlabel: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.5, 1.4 * len(values)), 3.2))
    ax.bar(list(values), list(values.values()), color="tab:blue")
    if len(values) > 3:  # long labels side by side would overlap
        ax.tick_params(axis="x", labelrotation=15, labelsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
