"""What the benchmarks share around their charts: a bar per configuration, and writing a
figure beside its JSON summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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


def save_with_summary(fig: Any, results: Path, name: str, summary: dict[str, Any]) -> None:
    """<results>/<name>.png and <results>/<name>.json."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(results / f"{name}.png", dpi=110)
    plt.close(fig)
    (results / f"{name}.json").write_text(json.dumps(summary, indent=2))
