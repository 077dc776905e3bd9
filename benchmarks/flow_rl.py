"""Flow-matching and diffusion policies on ManiSkill PickCube-v1 (state + instruction, CPU):
SFT on a few scripted-expert demos gives success S0; PPO from those weights gives S1.

  demos        scripted expert (`embodied demos`), end-effector delta control
  sft          `embodied sft`, one run per policy (flow matching; diffusion's epsilon loss)
               -> S0 (deterministic, 100 episodes)
  flow-sde     `embodied train init=<flow sft>` PPO, one stochastic denoising step per chunk
  flow-noise   the same with the learned noise head (every step stochastic)
  dppo         `embodied train init=<diffusion sft>` PPO with one ratio per denoising step
               (DPPO: floored std, gamma_denoise, the last 5 of 10 steps fine-tuned)

Goal (the issue's): RL lifts success by >= 30 points, or to >= 90%, within one CPU-hour.
Every step is a normal command a user would type; the runs land in benchmarks/runs/.

    python benchmarks/flow_rl.py                      # everything, one run at a time
    python benchmarks/flow_rl.py --steps 100000       # a shorter RL budget per arm
    python benchmarks/flow_rl.py report               # rebuild the summary from the runs
    python benchmarks/flow_rl.py heldout              # Flow-SDE and DPPO on 3 fresh seeds, held out
    python benchmarks/flow_rl.py heldout report       # rebuild that summary from the committed runs
    python benchmarks/flow_rl.py heldout reevaluate   # evaluate the kept runs' policies held out again

`heldout` checks the recipe above without changing it: the same demos and SFT, then RL on
seeds 101-103 (never used to choose the recipe, which was settled on seed 1), and every
policy, the SFT ones included, evaluated greedy and sampled on 100 episodes of an evaluation
seed no run or tuning has drawn from (harness.heldout.HELDOUT_SEED). Per-run results go to
results/runs/flow_rl_heldout/, from which `heldout report` rebuilds results/flow_rl_heldout.*."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from harness.commands import embodied
from harness.flow_recipe import (
    DEMO_EPISODES,
    DEMOS,
    ENV,
    FLOW_SDE_SAMPLER,
    POLICIES,
    RL,
    SFT_STEPS,
    demos_and_sft,
    sft_dir,
)
from harness.heldout import HELDOUT_EPISODES, HELDOUT_SEED, heldout_results
from harness.reports import provenance, save_with_summary, write_report
from harness.runs import RESULTS, RUNS, resumable
from harness.sft_rl import cli, dataset_episodes, eval_curve, plot_curve
from harness.stats import interval95

ARMS = {
    "flow-sde": ("flow", FLOW_SDE_SAMPLER),
    "flow-noise": ("flow", ["policy.sampler=flow_noise"]),
    "dppo": ("diffusion", ["algo.ratio=term", "algo.denoise_discount=0.99", "policy.finetune_steps=5"]),
}
EVAL_EPISODES = 100
CPU_HOUR_S = 3600.0


def final_success(run_dir: Path) -> float | None:
    """The deterministic success of the run's last checkpoint over EVAL_EPISODES episodes."""
    report = run_dir / "eval" / "final" / "report.json"
    if not report.is_file() and (run_dir / "checkpoints" / "latest").is_file():
        embodied(
            "eval",
            f"checkpoint={run_dir}",
            f"episodes={EVAL_EPISODES}",
            "progress_bar=false",
            f"output={report.parent}",
        )
    return json.loads(report.read_text())["overall"]["success_rate"] if report.is_file() else None


def run(demos: int, sft_steps: int, steps: int, arms: list[str]) -> None:
    demos_and_sft(demos, sft_steps, sorted({ARMS[name][0] for name in arms}))
    for name in arms:
        policy, overrides = ARMS[name]
        rl(RUNS / name, policy, [*RL, *overrides], steps)


def rl(run_dir: Path, policy: str, overrides: list[str], steps: int) -> None:
    """PPO from the policy's SFT weights (continues an interrupted run)."""
    if resumable(run_dir):
        embodied(
            "train",
            f"resume={run_dir}",
            "env_resume=fresh",  # PickCube's grasping physics depends on its history: new episodes
            f"total_env_steps={steps}",
            "eval_episodes=0",
            "logger.progress_bar=false",
        )
    else:
        embodied(
            "train",
            *ENV,
            *POLICIES[policy],
            *overrides,
            f"init={sft_dir(policy)}",
            f"run_dir={run_dir}",
            f"total_env_steps={steps}",
            "eval_episodes=0",
            "logger.progress_bar=false",
        )


def report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {name: eval_curve(RUNS / name) for name in ARMS}
    if not any(curves.values()):  # run directories are not kept in the repository: a clone has none
        raise SystemExit(f"no flow_rl.py runs in {RUNS}: nothing to report; results/flow_rl.* left as they are")
    s0s = {policy: final_success(sft_dir(policy)) for policy in POLICIES}
    summary: dict = {
        "task": "PickCube-v1",
        "control_mode": "pd_ee_delta_pos",
        "sft_success": s0s,
        "eval_episodes": EVAL_EPISODES,
        "demos": dataset_episodes(DEMOS),
        "arms": {},
    }
    fig, (by_steps, by_time) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    rows = []
    for name, (policy, overrides) in ARMS.items():
        s0, curve = s0s[policy], curves[name]
        if curve is None:
            continue
        s1 = final_success(RUNS / name)
        within_hour = [s for _, t, s in curve.points if t is not None and t <= CPU_HOUR_S]
        met = s0 is not None and s1 is not None and (s1 - s0 >= 0.30 or s1 >= 0.9)
        summary["arms"][name] = {
            "policy": policy,
            "sft_success": s0,
            "final_success": s1,
            "lift_points": None if s0 is None or s1 is None else 100 * (s1 - s0),
            "env_steps": curve.env_steps,
            "wall_time_s": curve.wall_time_s,
            "best_periodic_success_within_1h": max(within_hour) if within_hour else None,
            "env_steps_to_90": curve.env_steps_to_90,
            "goal_met": met,
            "overrides": [*POLICIES[policy], *RL, *overrides],
            "curve": curve.as_json(),
        }
        plot_curve(by_steps, by_time, curve, name)
        rows.append(
            f"| {name} | {policy} | {s0:.2f} | {s1:.2f} | {100 * (s1 - s0):+.0f} | {curve.env_steps:,} | "
            f"{(curve.wall_time_s or 0) / 60:.0f} min | {'yes' if met else 'no'} |"
        )
    for ax, label in ((by_steps, "env steps"), (by_time, "wall time (min, 2 CPU cores)")):
        for (policy, s0), style in zip(s0s.items(), ("--", ":")):
            if s0 is not None:
                ax.axhline(s0, color="grey", linestyle=style, linewidth=1, label=f"{policy} SFT (S0)")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    by_steps.set_ylabel("eval success (32 fixed episodes)")
    by_steps.legend(fontsize=8)
    fig.suptitle("PickCube-v1 (state, CPU): SFT on scripted demos, then PPO on flow and diffusion policies")
    save_with_summary(fig, RESULTS, "flow_rl", summary)
    lines = [
        "# Flow-matching and diffusion policies: SFT, then RL (PickCube-v1)",
        "",
        f"{summary['demos']} scripted-expert demos (`embodied demos`), SFT with each policy's own loss, then PPO from "
        f"the SFT weights (`embodied train init=`). S0 and S1: deterministic success over {EVAL_EPISODES} episodes; "
        "the curves: 32 fixed episodes every 5 iterations (4,000 env steps). 2-core CPU machine, one run at a time.",
        "",
        "| RL arm | policy | S0 (SFT) | S1 | lift (points) | env steps | wall time | goal met |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        *rows,
        "",
        "Goal: RL lifts success by >= 30 points or to >= 90% within one CPU-hour.",
        "",
        "![curves](flow_rl.png)",
    ]
    write_report(RESULTS, "flow_rl", lines)


# ---- held out: the recipe above on fresh seeds, evaluated on episodes nothing was tuned on ----
HELDOUT_ARMS = ("flow-sde", "dppo")
HELDOUT_SEEDS = (101, 102, 103)
HELDOUT_STEPS = 100_000  # the RL budget the reported figures used
HELDOUT_RUNS = RESULTS / "runs" / "flow_rl_heldout"
MODES = ("deterministic", "sampled")


def heldout(demos: int, sft_steps: int) -> None:
    """Train what is missing, evaluate it held out, and keep each run's results (compact JSON)."""
    policies = sorted({ARMS[arm][0] for arm in HELDOUT_ARMS})
    demos_and_sft(demos, sft_steps, policies)
    HELDOUT_RUNS.mkdir(parents=True, exist_ok=True)
    for policy in policies:
        record = {"kind": "sft", "policy": policy, "heldout": heldout_results(sft_dir(policy))[0]}
        record.update(provenance("flow_rl.py"))
        (HELDOUT_RUNS / f"{policy}-sft.json").write_text(json.dumps(record))
    for arm in HELDOUT_ARMS:
        policy, overrides = ARMS[arm]
        for seed in HELDOUT_SEEDS:
            name = f"{arm}-s{seed}"
            run_dir = RUNS / "flow-heldout" / name
            settings = [*(o for o in RL if not o.startswith("seed=")), f"seed={seed}", *overrides]
            rl(run_dir, policy, settings, HELDOUT_STEPS)
            curve = eval_curve(run_dir)
            record = {
                "kind": "rl",
                "arm": arm,
                "policy": policy,
                "seed": seed,
                "overrides": [*POLICIES[policy], *settings],
                "heldout": heldout_results(run_dir)[0],
                "env_steps": curve.env_steps,
                "wall_time_s": curve.wall_time_s,
                "curve": curve.as_json(),
                **provenance("flow_rl.py"),
            }
            (HELDOUT_RUNS / f"{name}.json").write_text(json.dumps(record))


def reevaluate() -> None:
    """Every kept run's final policy evaluated held out again, its training untouched: after a
    change to how policies are evaluated, the figures follow it without retraining."""
    for path in sorted(HELDOUT_RUNS.glob("*.json")):
        record = json.loads(path.read_text())
        run_dir = sft_dir(record["policy"]) if record["kind"] == "sft" else RUNS / "flow-heldout" / path.stem
        record["heldout"] = heldout_results(run_dir)[0]
        path.write_text(json.dumps(record))


def heldout_report() -> None:
    """results/flow_rl_heldout.{json,md,png}, rebuilt from results/runs/flow_rl_heldout/."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {path.stem: json.loads(path.read_text()) for path in sorted(HELDOUT_RUNS.glob("*.json"))}
    rate = lambda record, mode: record["heldout"][mode]["success_rate"]  # noqa: E731
    summary: dict = {"heldout_seed": HELDOUT_SEED, "heldout_episodes": HELDOUT_EPISODES, "arms": {}}
    rows = []
    fig, axes = plt.subplots(1, len(HELDOUT_ARMS), figsize=(5 * len(HELDOUT_ARMS), 3.6), sharey=True)
    for ax, arm in zip(axes, HELDOUT_ARMS):
        members = [r for r in runs.values() if r.get("arm") == arm]
        sft = runs.get(f"{ARMS[arm][0]}-sft")
        if not members or sft is None:
            continue
        entry: dict = {"seeds": [r["seed"] for r in members], "runs": [f"{arm}-s{r['seed']}" for r in members]}
        for mode in MODES:
            s0, s1 = rate(sft, mode), [rate(r, mode) for r in members]
            low, high = interval95(s1)
            lift = 100 * (float(np.mean(s1)) - s0)
            met = lift >= 30 or float(np.mean(s1)) >= 0.9
            entry[mode] = {"s0": s0, "s1": s1, "mean": float(np.mean(s1)), "interval95": [low, high], "lift": lift}
            entry[mode]["goal_met"] = met
            rows.append(
                f"| {arm} | {'greedy' if mode == 'deterministic' else 'sampled'} | {s0:.2f} | "
                f"{', '.join(f'{v:.2f}' for v in s1)} | {np.mean(s1):.3f} | {min(s1):.2f} | {max(s1):.2f} | "
                f"[{low:.3f}, {high:.3f}] | {lift:+.0f} | {'yes' if met else '**no**'} |"
            )
        summary["arms"][arm] = entry
        for record in members:
            points = record["curve"]
            ax.plot(
                [p["env_steps"] for p in points],
                [p["eval/success_rate"] for p in points],
                label=f"seed {record['seed']}",
            )
        ax.axhline(rate(sft, "deterministic"), color="grey", linestyle="--", linewidth=1, label="SFT (S0, held out)")
        ax.set_title(arm)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("periodic eval success (32 episodes)")
    fig.suptitle("PickCube-v1: SFT then RL on fresh seeds (the periodic evals; the table's figures are held out)")
    commits = sorted({r["commit"] for r in runs.values()})
    evaluated = sorted({r["heldout"].get("commit", r["commit"]) for r in runs.values()})
    summary.update({"commits": commits, "evaluated_at": evaluated})
    summary["machine"] = next(iter(runs.values()))["machine"] if runs else None
    save_with_summary(fig, RESULTS, "flow_rl_heldout", summary)
    lines = [
        "# Flow-SDE and DPPO on fresh seeds, held out (PickCube-v1)",
        "",
        f"Trained at commits {', '.join(commits)}; evaluated held out at {', '.join(evaluated)}; "
        f"{summary['machine']}; `python benchmarks/flow_rl.py heldout`.",
        "",
        "The recipe of [flow_rl.md](flow_rl.md), unchanged (its settings were chosen on seed 1): the same 50 demos "
        f"and SFT, then {HELDOUT_STEPS:,} env steps of RL on seeds {', '.join(map(str, HELDOUT_SEEDS))}. S0 (the SFT "
        f"policy) and S1 (each final policy): success on {HELDOUT_EPISODES} episodes of evaluation seed "
        f"{HELDOUT_SEED}, which no run or tuning has drawn from. The interval is Student's t over the seeds, cut to "
        "[0, 1]. Goal: RL lifts the mean by >= 30 points or to >= 90%.",
        "",
        "| arm | mode | S0 (SFT) | S1 per seed | mean | min | max | 95% interval of the mean | lift | goal met |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | --- | ---: | --- |",
        *rows,
        "",
        "![periodic evaluations](flow_rl_heldout.png)",
    ]
    write_report(RESULTS, "flow_rl_heldout", lines)


def main() -> None:
    if sys.argv[1:2] == ["heldout"]:
        os.environ.setdefault("HF_HOME", str(RUNS / "hf-cache"))
        if sys.argv[2:3] == ["reevaluate"]:
            reevaluate()
        elif sys.argv[2:3] != ["report"]:
            heldout(demos=DEMO_EPISODES, sft_steps=SFT_STEPS)
        heldout_report()
        return
    cli(__doc__, list(ARMS), run, report, demos=DEMO_EPISODES, sft_steps=SFT_STEPS, steps=200_000)


if __name__ == "__main__":
    main()
