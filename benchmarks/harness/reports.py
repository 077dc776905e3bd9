"""What the reports share: where a result comes from (commit, machine, command), a bar per
configuration, a figure beside its JSON summary, and the Markdown summary itself."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def provenance(script: str) -> dict[str, str]:
    """The commit (marked `+changes` when the code differs from it), the machine and the exact
    command of a result, for its JSON and the first lines of its Markdown."""
    here = Path(__file__).resolve().parent
    git = lambda *args: subprocess.run(["git", *args], capture_output=True, text=True, cwd=here).stdout.strip()  # noqa: E731
    # results written earlier in the same campaign, and prose, are not changes to what ran
    unrun = (":(top,exclude)benchmarks/results", ":(top,exclude)docs", ":(top,exclude)*.md")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", *unrun))
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except ImportError:
        gpu = "no GPU"
    return {
        "commit": git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else ""),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {gpu}",
        "command": " ".join([f"python benchmarks/{script}", *sys.argv[1:]]),
    }


def provenance_line(record: dict[str, Any]) -> str:
    return f"Commit {record['commit']}; {record['machine']}; `{record['command']}`."


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


def write_report(results: Path, name: str, lines: list[str]) -> None:
    """<results>/<name>.md from its lines, printed as well."""
    (results / f"{name}.md").write_text("\n".join(lines) + "\n")
    print((results / f"{name}.md").read_text())
