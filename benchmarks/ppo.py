"""PPO learning benchmarks. Each run is a normal `embodied train` run; this script starts them,
collects their metrics.jsonl into benchmarks/results/runs/<name>.json, and writes a JSON +
Markdown summary and a PNG plot per suite.

    python benchmarks/ppo.py mujoco      # InvertedPendulum-v4 x3 seeds, Hopper-v4 x1, 1M steps each
    python benchmarks/ppo.py maniskill   # PushCube-v1 and PickCube-v1, state obs, CPU
    python benchmarks/ppo.py runtimes    # the default PushCube run under runtime=local and runtime=procs
    python benchmarks/ppo.py report      # rebuild summaries and plots from the collected runs
    python benchmarks/ppo.py collect     # re-read the run directories, then report
    python benchmarks/ppo.py mujoco --only hopper-s1 --steps 200000   # one run, shorter
    python benchmarks/ppo.py heldout     # the main job (PushCube) on 3 fresh seeds, held-out evaluation
    python benchmarks/ppo.py heldout_pickcube # PickCube (state, 1M env steps) the same way
    python benchmarks/ppo.py heldout_mujoco   # InvertedPendulum the same way

`heldout` reports what the others cannot: its training seeds (101-103) were never used to
choose the recipe (configs/algo/ppo_maniskill.yaml was tuned on seed 1), and each final policy
is evaluated on 100 episodes drawn from an evaluation seed (HELDOUT_SEED) that no run, tuning
or periodic evaluation has used, greedy and sampled, with the mean, min, max and a 95% interval
over the seeds, against the goal of 90% greedy success.

    python benchmarks/ppo.py heldout_hopper   # Hopper the same way

The reference figures are CleanRL's PPO (`ppo_continuous_action.py`, Gymnasium v4 tasks, 1M
env steps, 3 seeds), from its benchmark page (REFERENCE_SOURCE): per seed the mean return of
the last 100 training episodes, then the mean +- sample std over seeds. That is the measure
`rollout/episode_return` gives here, so the two compare directly."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from plots import provenance  # sibling module: the scripts run as `python benchmarks/<name>.py`

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
RUNS = ROOT / "runs"  # full run directories (ignored by git)
REFERENCE_SOURCE = (
    "CleanRL PPO (ppo_continuous_action.py, Gymnasium v4, 1M env steps, 3 seeds): "
    "github.com/vwxyzjn/cleanrl, docs/benchmark/ppo_continuous_action.md at commit 35896b1"
)
METRIC_NOTES = {
    "rollout/episode_return": "mean over the last 100 training episodes, stochastic policy",
    "eval/success_rate": "deterministic policy on 16 fixed evaluation episodes, run every 10 iterations",
}

SUITES = {
    "mujoco": {
        "metric": "rollout/episode_return",
        "runs": {
            **{f"invertedpendulum-s{s}": ["experiment=mujoco_invertedpendulum", f"seed={s}"] for s in (1, 2, 3)},
            "hopper-s1": ["experiment=mujoco_hopper", "seed=1"],
        },
        "steps": 1_000_000,
        "reference": {"invertedpendulum": (963, 22), "hopper": (2383, 272)},
    },
    "maniskill": {
        "metric": "eval/success_rate",  # deterministic policy, 16 fixed episodes every 10 iterations
        "runs": {
            "pushcube-s1": ["env=maniskill_pushcube", "seed=1"],
            "pickcube-s1": ["env=maniskill_pickcube", "seed=1"],
        },
        "steps": 2_000_000,
        "goal": {"pushcube": 0.9},
    },
    "heldout": {  # the main job (configs/train.yaml as is) on seeds never used for tuning
        "metric": "eval/success_rate",
        "runs": {f"pushcube-heldout-s{s}": [f"seed={s}"] for s in (101, 102, 103)},
        "steps": 200_000,
        "goal": {"pushcube-heldout": 0.9},
        "heldout": {"measure": "success_rate", "bounds": (0.0, 1.0), "goal": 0.9},
    },
    "heldout_pickcube": {  # PickCube as `maniskill` runs it (its defaults, tuned on seed 1), on fresh seeds
        "metric": "eval/success_rate",
        "runs": {f"pickcube-heldout-s{s}": ["env=maniskill_pickcube", f"seed={s}"] for s in (101, 102, 103)},
        "steps": 1_000_000,
        "goal": {"pickcube-heldout": 0.9},
        "heldout": {"measure": "success_rate", "bounds": (0.0, 1.0), "goal": 0.9},
        "resume_with": ("env_resume=fresh",),  # grasping physics depends on its history: new episodes
    },
    "heldout_mujoco": {  # InvertedPendulum as `mujoco` runs it, on seeds never used for tuning
        "metric": "rollout/episode_return",
        "runs": {
            f"invertedpendulum-heldout-s{s}": ["experiment=mujoco_invertedpendulum", f"seed={s}"]
            for s in (101, 102, 103)
        },
        "steps": 1_000_000,
        "reference": {"invertedpendulum-heldout": (963, 22)},
        # the reference band's lower edge; the episode return is bounded by its 1000 steps
        "heldout": {"measure": "mean_return", "bounds": (0.0, 1000.0), "goal": 941},
    },
    "heldout_hopper": {  # Hopper as `mujoco` runs it, on seeds never used for tuning
        "metric": "rollout/episode_return",
        "runs": {f"hopper-heldout-s{s}": ["experiment=mujoco_hopper", f"seed={s}"] for s in (101, 102, 103)},
        "steps": 1_000_000,
        "reference": {"hopper-heldout": (2383, 272)},
        # the reference band's lower edge; a Hopper return has no fixed ceiling
        "heldout": {"measure": "mean_return", "bounds": (0.0, float("inf")), "goal": 2111},
    },
    "runtimes": {  # the main job (configs/train.yaml as is), with each runtime
        "metric": "eval/success_rate",
        "runs": {
            "pushcube-local-s1": ["runtime=local", "seed=1"],
            "pushcube-procs-s1": ["runtime=procs", "seed=1"],
        },
        "steps": 200_000,
        "goal": {"pushcube-local": 0.9, "pushcube-procs": 0.9},
    },
}


def resumable(run_dir: Path) -> bool:
    """Whether an earlier run in `run_dir` can be continued. One killed before its first
    checkpoint left nothing to continue, and `embodied train` refuses a folder that holds a
    run: the folder is removed, so the run starts over."""
    if (run_dir / "checkpoints" / "latest").is_file():
        return True
    if run_dir.exists():
        print(f"no checkpoint in {run_dir}: starting that run over", flush=True)
        shutil.rmtree(run_dir)
    return False


def train(name: str, overrides: list[str], steps: int, resume_with: tuple[str, ...] = ()) -> None:
    """Train run `name`, or continue it from its last checkpoint with `resume_with` added (e.g.
    `env_resume=fresh` where the simulator cannot replay the episodes in progress)."""
    run_dir = RUNS / name
    fresh = not resumable(run_dir)
    command = [
        sys.executable,
        "-m",
        "embodied.cli",
        "train",
        *overrides,
        f"run_dir={run_dir}",
        f"total_env_steps={steps}",
        "eval_episodes=0",
        "logger.progress_bar=false",
    ]
    if not fresh:  # continue an interrupted benchmark run
        command = [
            sys.executable,
            "-m",
            "embodied.cli",
            "train",
            f"resume={run_dir}",
            *resume_with,
            f"total_env_steps={steps}",
            "eval_episodes=0",
            "logger.progress_bar=false",
        ]
    print(f"[{name}] {' '.join(command[3:])}", flush=True)
    where = provenance(Path(sys.argv[0]).name)  # the code that trains, not what is checked out when it ends
    subprocess.run(command, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    collect(name, fresh=fresh, where=where)


HELDOUT_SEED, HELDOUT_EPISODES = 900_001, 100  # an evaluation stream no run or tuning has drawn from


def heldout_eval(checkpoint: Path, output: Path, deterministic: bool) -> tuple[dict, str]:
    """A policy (a run's latest checkpoint, or a checkpoint) on the held-out episodes: the
    report's overall figures, and the command."""
    command = [
        sys.executable,
        "-m",
        "embodied.cli",
        "eval",
        f"checkpoint={checkpoint}",
        f"episodes={HELDOUT_EPISODES}",
        f"seed={HELDOUT_SEED}",
        f"deterministic={str(deterministic).lower()}",
        f"output={output}",
        "progress_bar=false",
    ]
    print(f"[{checkpoint.name}] {' '.join(command[3:])}", flush=True)
    subprocess.run(command, check=True)
    return json.loads((output / "report.json").read_text())["overall"], " ".join(command[3:])


def heldout_results(run_dir: Path) -> tuple[dict, str]:
    """A run's final policy on the held-out episodes, greedy and sampled, with the commit that
    evaluated it (the run may have been trained at an earlier one), and the command."""
    results: dict = {"commit": provenance(Path(sys.argv[0]).name)["commit"]}
    for mode in ("deterministic", "sampled"):
        overall, command = heldout_eval(run_dir, run_dir / "eval" / f"heldout-{mode}", mode == "deterministic")
        kept = ("episodes", "successes", "success_rate", "success_ci95", "mean_return")
        results[mode] = {k: overall[k] for k in kept}
    return results, command


def record_path(name: str) -> Path:
    """Where a run's record (compact JSON, committed) lives: results/runs/<name>.json."""
    return RESULTS / "runs" / f"{name}.json"


def load_records(folder: str) -> list[dict]:
    """Every record under results/runs/<folder>/, by name."""
    return [json.loads(p.read_text()) for p in sorted((RESULTS / "runs" / folder).glob("*.json"))]


def evaluate_heldout(name: str, **fields: object) -> None:
    """The run's held-out results, and any other `fields`, into its per-run JSON."""
    results, command = heldout_results(RUNS / name)
    annotate(name, **fields, heldout={"seed": HELDOUT_SEED, "command": command, **results})


def learner_curve(name: str, every: int) -> list[dict]:
    """The actor's entropy and temperature every `every` env steps of a run, from its metrics."""
    metrics = [json.loads(line) for line in (RUNS / name / "metrics.jsonl").read_text().splitlines()]
    return [
        {"env_steps": m["env_steps"], "entropy": m["train/entropy"], "temperature": m["train/temperature"]}
        for m in metrics
        if "train/entropy" in m and m["env_steps"] % every == 0
    ]


def annotate(name: str, **fields: object) -> None:
    """Add `fields` to a run's committed record."""
    record = json.loads(record_path(name).read_text())
    record.update(fields)
    record_path(name).write_text(json.dumps(record))


def write_report(name: str, lines: list[str]) -> None:
    """results/<name>.md, printed as well."""
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print((RESULTS / f"{name}.md").read_text())


def has_heldout(name: str) -> bool:
    """Whether the run's per-run JSON holds its held-out evaluation (its work is done)."""
    path = record_path(name)
    return path.is_file() and "heldout" in json.loads(path.read_text())


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


def heldout_lines(summary: dict, suite: dict) -> list[str]:
    """The held-out table: per mode, the mean, min, max and 95% interval over seeds."""
    measure, bounds = suite["heldout"]["measure"], suite["heldout"]["bounds"]
    lines = [
        "",
        f"## Held-out evaluation ({HELDOUT_EPISODES} episodes from evaluation seed {HELDOUT_SEED}, final policies)",
        "",
        f"`{measure}` of each final policy; the interval is Student's t over the seeds, cut to {list(bounds)}.",
        "",
        "| task | mode | per seed | mean | min | max | 95% interval of the mean | goal | met |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for task, entry in summary["tasks"].items():
        for mode, values in entry.get("heldout", {}).items():
            goal = suite["heldout"]["goal"] if mode == "deterministic" else None
            met = "-" if goal is None else ("yes" if np.mean(values) >= goal else "**no**")
            lines.append(
                f"| {task} | {mode_name(mode)} | {seed_cells(values, bounds)} | "
                f"{goal if goal is not None else '-'} | {met} |"
            )
    return lines


TRAINING_POINTS = 200  # training-log points a run record keeps for its plot; every evaluation is kept
CURVE_KEYS = (
    "env_steps",
    "rollout/episode_return",
    "rollout/success_rate",
    "eval/success_rate",
    "eval/episode_return",
    "train/env_steps_per_s",
    "replay/intervened",  # share of the collected steps an operator drove (HIL runs)
)


def compact(lines: list[dict]) -> dict:
    """A run's log as a record keeps it: every evaluation, the last line and about
    TRAINING_POINTS training lines for the plot, and the statistics of the whole log that the
    reports need (an off-policy run logs every few env steps, thousands of lines)."""
    curve = [{k: line[k] for k in CURVE_KEYS if k in line} for line in lines]
    stride = max(1, len(curve) // TRAINING_POINTS)
    kept = [
        p
        for i, p in enumerate(curve)
        if i % stride == 0 or i == len(curve) - 1 or any(k.startswith("eval/") for k in p)
    ]
    rates = [p["train/env_steps_per_s"] for p in curve if "train/env_steps_per_s" in p]
    shares = [p["replay/intervened"] for p in curve if "replay/intervened" in p]
    return {
        "curve": kept,
        "env_steps_per_s_median": float(np.median(rates)) if rates else None,
        "intervened_mean": float(np.mean(shares)) if shares else 0.0,  # the operator's share, mean over the log
    }


def collect(name: str, fresh: bool = False, where: dict | None = None) -> None:
    """Curve and wall time of a finished run: the trainer's own clock, which a resume carries
    on (else from its config file to its last checkpoint, which a resume rewrites). `fresh`: the
    run was trained from its first step just now, so an earlier record of the same name (another
    training of it) says nothing about where it ran or how it did held out. `where`: the
    provenance taken when the training started (default: now)."""
    run_dir = RUNS / name
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    elapsed = [line["train/elapsed_s"] for line in lines if "train/elapsed_s" in line]
    wall = (
        elapsed[-1]
        if elapsed
        else (run_dir / "checkpoints" / "latest").stat().st_mtime - (run_dir / "config.yaml").stat().st_mtime
    )
    out = record_path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    earlier = json.loads(out.read_text()) if out.exists() and not fresh else {}
    record = {"name": name, "wall_time_s": wall, **compact(lines)}
    # re-collected: keep where the run ran, its held-out evaluation and what scripts added
    # (arm, seed, overrides, ...); the script that ran, as hil.py and others train through this one
    where = earlier.get("provenance") or where or provenance(Path(sys.argv[0]).name)
    out.write_text(json.dumps({**earlier, **record, "provenance": where}))


def load(name: str) -> dict | None:
    path = record_path(name)
    return json.loads(path.read_text()) if path.exists() else None


def first_reaching(curve: list[dict], metric: str, threshold: float) -> int | None:
    return next((p["env_steps"] for p in curve if p.get(metric, -np.inf) >= threshold), None)


def report(suite_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suite = SUITES[suite_name]
    metric = suite["metric"]
    runs = {name: load(name) for name in suite["runs"]}
    runs = {name: run for name, run in runs.items() if run}
    if not runs:
        print(f"no collected runs for {suite_name}")
        return
    tasks = sorted({name.rsplit("-s", 1)[0] for name in runs})
    summary = {"suite": suite_name, "metric": metric, "tasks": {}}
    rows = []
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        members = {n: r for n, r in runs.items() if n.rsplit("-s", 1)[0] == task}
        finals, steps, speeds, walls, reach = [], [], [], [], []
        for name, run in sorted(members.items()):
            curve = [p for p in run["curve"] if metric in p]
            x = [p["env_steps"] for p in curve]
            y = [p[metric] for p in curve]
            ax.plot(x, y, label=name)
            finals.append(y[-1])
            steps.append(x[-1])
            speeds.append(run["env_steps_per_s_median"])
            walls.append(run.get("wall_time_s"))
            if "goal" in suite:
                reach.append(first_reaching(curve, metric, suite.get("goal", {}).get(task, 0.9)))
        entry = {
            "runs": sorted(members),
            "final": finals,
            "final_mean": float(np.mean(finals)),
            "final_std": float(np.std(finals)),
            "env_steps": steps,
            "median_env_steps_per_s": speeds,
            "wall_time_s": walls,
        }
        reference = suite.get("reference", {}).get(task)
        if reference:
            entry["reference"] = {"mean": reference[0], "std": reference[1], "source": REFERENCE_SOURCE}
            ax.axhspan(
                reference[0] - reference[1],
                reference[0] + reference[1],
                color="grey",
                alpha=0.2,
                label="reference PPO (1M)",
            )
        if reach:
            entry["env_steps_to_goal"] = reach
        heldout = [run["heldout"] for _, run in sorted(members.items()) if "heldout" in run]
        if heldout:
            measure, bounds = suite["heldout"]["measure"], suite["heldout"]["bounds"]
            entry["heldout"] = {mode: [h[mode][measure] for h in heldout] for mode in ("deterministic", "sampled")}
            entry["heldout_interval95"] = {mode: interval95(v, bounds) for mode, v in entry["heldout"].items()}
        summary["tasks"][task] = entry
        ax.set_title(task)
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1e6:g}M" if x >= 1e6 else f"{x / 1e3:g}k")
        ax.set_xlabel("env steps")
        ax.set_ylabel(metric.split("/")[-1].replace("_", " "))
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        ref_text = f"{reference[0]} ± {reference[1]}" if reference else "-"
        wall_text = ", ".join(f"{w / 60:.0f} min" if w else "?" for w in walls)
        reach_text = ", ".join(f"{r:,}" if r else "not reached" for r in reach) if reach else "-"
        rows.append(
            f"| {task} | {len(finals)} | {', '.join(f'{s:,}' for s in steps)} | "
            f"{np.mean(finals):.2f} ± {np.std(finals):.2f} | {ref_text} | {reach_text} | "
            f"{np.median(speeds):.0f} | {wall_text} |"
        )
    fig.tight_layout()
    fig.savefig(RESULTS / f"ppo_{suite_name}.png", dpi=110)
    (RESULTS / f"ppo_{suite_name}.json").write_text(json.dumps(summary, indent=2))
    header = [
        f"# PPO benchmark: {suite_name}",
        "",
        f"Final value = `{metric}` at the end of the run ({METRIC_NOTES[metric]}). "
        "Measured on a 2-core CPU machine, runs sharing it with other work, "
        "so steps/s and wall time are indicative only.",
        "",
        *sorted(
            {
                f"Runs at commit {r['provenance']['commit']} on {r['provenance']['machine']}: "
                f"`{r['provenance']['command']}`."
                for r in runs.values()
                if "provenance" in r
            }
        ),
        *(["", f"Reference: {REFERENCE_SOURCE}."] if "reference" in suite else []),
        "",
        "| task | seeds | env steps | final (mean ± std) | reference | steps to goal | median steps/s | wall time |",
        "| --- | ---: | --- | --- | --- | --- | ---: | --- |",
    ]
    rows += heldout_lines(summary, suite) if any("heldout" in e for e in summary["tasks"].values()) else []
    (RESULTS / f"ppo_{suite_name}.md").write_text("\n".join(header + rows) + f"\n\n![curves](ppo_{suite_name}.png)\n")
    print((RESULTS / f"ppo_{suite_name}.md").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=[*SUITES, "report", "collect"])
    parser.add_argument("--only", nargs="*", help="run names to run (default: all of the suite)")
    parser.add_argument("--steps", type=int, help="env steps per run (default: the suite's)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args()
    if args.suite in ("report", "collect"):
        if args.suite == "collect":  # re-read every finished run directory
            for suite in SUITES.values():
                for name in suite["runs"]:
                    if (RUNS / name / "checkpoints" / "latest").is_file():
                        collect(name)
        for name in SUITES:
            report(name)
        return
    suite = SUITES[args.suite]
    for name, overrides in suite["runs"].items():
        if args.only and name not in args.only:
            continue
        train(name, overrides + args.overrides, args.steps or suite["steps"], suite.get("resume_with", ()))
        if "heldout" in suite:
            evaluate_heldout(name)
    report(args.suite)


if __name__ == "__main__":
    main()
