"""What the SFT-then-RL studies (`flow_rl.py`, `multitask_vla.py`) share: a run's periodic
evaluations as a curve, and its plot; the size of a demo dataset; and their command line."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.runs import RUNS
from harness.stats import first_reaching


@dataclass
class Curve:
    points: list[tuple[int, float | None, float]]  # (env steps, elapsed s, periodic eval success)
    env_steps: int
    wall_time_s: float | None
    env_steps_to_90: int | None

    def as_json(self) -> list[dict]:
        return [{"env_steps": n, "elapsed_s": t, "eval/success_rate": s} for n, t, s in self.points]


def eval_curve(run_dir: Path) -> Curve | None:
    """The periodic evaluations of a training run against env steps and its training time."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    evals = [row for row in rows if "eval/success_rate" in row]
    elapsed = {row["env_steps"]: row["train/elapsed_s"] for row in rows if "train/elapsed_s" in row}
    return Curve(
        points=[(row["env_steps"], elapsed.get(row["env_steps"]), row["eval/success_rate"]) for row in evals],
        env_steps=rows[-1]["env_steps"] if rows else 0,
        wall_time_s=max(elapsed.values(), default=None),
        env_steps_to_90=first_reaching(evals, "eval/success_rate", 0.9),
    )


def dataset_episodes(root: Path) -> int | None:
    info = root / "meta" / "info.json"
    return json.loads(info.read_text())["total_episodes"] if info.is_file() else None


def cli(
    doc: str,
    arms: list[str],
    run: Callable[[int, int, int | None, list[str]], None],
    report: Callable[[], None],
    demos: int,
    sft_steps: int,
    steps: int | None,
) -> None:
    """The study's command line: `run` (then report) or `report`. `steps` None: each arm's own
    total_env_steps, unless --steps is given."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="run", choices=("run", "report"))
    parser.add_argument("--demos", type=int, default=demos, help="scripted-expert episodes")
    parser.add_argument("--sft-steps", type=int, default=sft_steps)
    parser.add_argument(
        "--steps",
        type=int,
        default=steps,
        help="RL env steps per arm" + ("" if steps else " (default: each arm's own)"),
    )
    parser.add_argument("--only", nargs="*", default=arms, choices=arms)
    args = parser.parse_args()
    os.environ.setdefault("HF_HOME", str(RUNS / "hf-cache"))
    if args.command == "run":
        run(args.demos, args.sft_steps, args.steps, args.only)
    report()


def plot_curve(by_steps, by_time, curve: Curve, label: str, **style) -> None:
    """One run's periodic evaluations against env steps (left) and training minutes (right);
    `style`: matplotlib line keywords, e.g. a colour shared by runs of one arm."""
    (line,) = by_steps.plot([n for n, _, _ in curve.points], [s for _, _, s in curve.points], label=label, **style)
    timed = [(t, s) for _, t, s in curve.points if t is not None]
    by_time.plot(
        [t / 60 for t, _ in timed],
        [s for _, s in timed],
        label=label,
        **{**style, "color": line.get_color(), "linestyle": line.get_linestyle()},
    )
