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

import numpy as np

from harness.heldout import HELDOUT_EPISODES, HELDOUT_SEED, evaluate_heldout
from harness.runs import RESULTS, RUNS, collect, load, train
from harness.stats import first_reaching, interval95, mode_name, seed_cells

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
