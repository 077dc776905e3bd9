"""DSRL against Flow-SDE PPO from the same SFT flow, on ManiSkill PickCube-v1 (state, CPU).

Both arms start from flow_rl.py's SFT flow (held-out S0 0.60 greedy, at the top of the 40-60% band):

  dsrl      the flow stays frozen; a small SAC actor chooses each chunk's initial noise and
            the flow's ODE maps it to the actions (algo=dsrl, policy.latent_actor=true)
  flow-sde  PPO fine-tunes the flow itself: flow_rl.py's recipe, unchanged

Both arms are judged the same way: checkpoints every GRID env steps, each evaluated greedy
on HELDOUT_EPISODES episodes of the held-out evaluation seed (harness.heldout.HELDOUT_SEED), which no
run or tuning draws from. The lift is the success over S0 at each checkpoint. Steps to the lift
are the env steps of the first checkpoint at S0 plus Flow-SDE's final mean lift. The goal is
that DSRL reaches that lift in fewer env steps than Flow-SDE. The final policies are also
evaluated sampled.

DSRL's settings are chosen on seed 1 (the tuning set) from its periodic evaluations (its own
seed's episodes); the reported runs use seeds 101-103.

    python benchmarks/dsrl.py tune                  # DSRL variants on seed 1
    python benchmarks/dsrl.py heldout --parallel 2  # both arms on seeds 101-103, chosen settings
    python benchmarks/dsrl.py report                # results/dsrl.{json,md,png} from the records
    python benchmarks/dsrl.py reevaluate            # the finished runs evaluated held out again

Per-run records (curve, checkpoint evaluations, held-out results, provenance) go to
results/runs/dsrl/; `report` rebuilds the summary from them."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from harness.flow_recipe import (
    DEMO_EPISODES,
    DSRL_LEARNER,
    ENV,
    FLOW_SDE_SAMPLER,
    POLICIES,
    RL,
    SFT_STEPS,
    demos_and_sft,
    sft_dir,
)
from harness.heldout import HELDOUT_EPISODES, HELDOUT_SEED, evaluate_heldout, heldout_eval
from harness.reports import save_with_summary, write_report
from harness.runs import RESULTS, RUNS, has_heldout, load_records, record_path, train
from harness.stats import first_reaching, mode_name, seed_cells

FOLDER = "dsrl"  # under RUNS (run directories) and RESULTS / "runs" (records)
SEEDS = (101, 102, 103)
ENV_STEPS = 100_000  # Flow-SDE's budget in flow_rl.py
GRID = 20_000  # env steps between the checkpoints evaluated held out
# PickCube's grasping physics depends on its history: an interrupted run continues with new episodes
RESUME_WITH = ("env_resume=fresh",)
DSRL_ENVS = 4  # envs per iteration: a DSRL iteration is DSRL_ENVS env steps
FLOW_SDE_STEPS_PER_ITERATION = 800  # ppo_maniskill's rollout of PickCube's envs
# Sized for a CPU core per run, as hil.py's SAC runs (DSRL's paper uses 256-wide networks).
DSRL = [
    *ENV,
    f"env.num_envs={DSRL_ENVS}",
    "env.num_workers=0",
    *POLICIES["flow"],
    *DSRL_LEARNER,
    f"eval_every={5_000 // DSRL_ENVS}",
    "periodic_eval_episodes=32",
    f"checkpoint_every={GRID // DSRL_ENVS}",
    "keep_checkpoints=100",
    "runtime.torch_threads=1",
    f"init={sft_dir('flow')}",
]
FLOW_SDE = [
    *ENV,
    *POLICIES["flow"],
    *(o for o in RL if not o.startswith(("seed=", "checkpoint_every="))),
    *FLOW_SDE_SAMPLER,
    f"checkpoint_every={GRID // FLOW_SDE_STEPS_PER_ITERATION}",
    "keep_checkpoints=100",
    f"init={sft_dir('flow')}",
]
TUNE_STEPS = 40_000
VARIANTS = {  # DSRL settings tried on seed 1
    "gamma0.99": [],
    "gamma0.9": ["algo.gamma=0.9"],
}
CHOSEN: str | None = "gamma0.9"  # from the tuning table: 0.98 against gamma 0.99's 0.92 on seed 1
# S0 comes from flow_rl.py's held-out records, read by their folder (a study never imports another)
FLOW_RL_RECORDS = RESULTS / "runs" / "flow_rl_heldout"


def steps_per_iteration(arm: str) -> int:
    return DSRL_ENVS if arm == "dsrl" else FLOW_SDE_STEPS_PER_ITERATION


def arm_settings(arm: str, seed: int) -> list[str]:
    if arm == "dsrl":
        if CHOSEN is None:
            raise SystemExit("no DSRL settings chosen yet: run `dsrl.py tune` and set CHOSEN from its table")
        return [*DSRL, *VARIANTS[CHOSEN], f"seed={seed}"]
    return [*FLOW_SDE, f"seed={seed}"]


def tuning_score(record: dict) -> float:
    """The mean of the last three periodic evaluations (32 episodes each, the run's own seed)."""
    values = [p["eval/success_rate"] for p in record["curve"] if "eval/success_rate" in p]
    return float(np.mean(values[-3:]))


def tune() -> None:
    demos_and_sft(DEMO_EPISODES, SFT_STEPS, ["flow"])
    for variant, extra in VARIANTS.items():
        name = f"{FOLDER}/tune-{variant}"
        if record_path(name).is_file() and "variant" in json.loads(record_path(name).read_text()):
            continue
        overrides = [*DSRL, *extra, "seed=1"]
        train(name, overrides, TUNE_STEPS)
        record = json.loads(record_path(name).read_text())
        record_path(name).write_text(json.dumps({**record, "variant": variant, "overrides": overrides}))


def checkpoint_success(checkpoint: Path) -> float:
    """Greedy success of one checkpoint on the held-out episodes (kept beside it)."""
    output = checkpoint.parents[1] / "eval" / f"heldout-{checkpoint.name}"
    if (output / "report.json").is_file():
        return json.loads((output / "report.json").read_text())["overall"]["success_rate"]
    return heldout_eval(checkpoint, output, deterministic=True)[0]["success_rate"]


def grid_successes(arm: str, run_dir: Path) -> dict[str, float]:
    """{env steps: held-out greedy success} of the run's checkpoints on the GRID."""
    per_iteration = steps_per_iteration(arm)
    found = {}
    for checkpoint in sorted((run_dir / "checkpoints").glob("iter_*")):
        env_steps = int(checkpoint.name.removeprefix("iter_")) * per_iteration
        if env_steps % GRID == 0:
            found[str(env_steps)] = checkpoint_success(checkpoint)
    return found


def heldout(parallel: int, seeds: tuple[int, ...]) -> None:
    demos_and_sft(DEMO_EPISODES, SFT_STEPS, ["flow"])

    def one(arm: str, seed: int) -> None:
        name = f"{FOLDER}/{arm}-s{seed}"
        if has_heldout(name):
            return
        overrides = arm_settings(arm, seed)
        train(name, overrides, ENV_STEPS, RESUME_WITH)
        grid = grid_successes(arm, RUNS / name)
        evaluate_heldout(name, arm=arm, seed=seed, overrides=overrides, grid=grid, variant=CHOSEN)

    with ThreadPoolExecutor(parallel) as pool:
        for job in [pool.submit(one, arm, seed) for seed in seeds for arm in ("dsrl", "flow-sde")]:
            job.result()


def reevaluate() -> None:
    """The finished runs' checkpoints and final policies evaluated held out again, their
    training untouched: after a change to how policies are evaluated, the figures follow it."""
    for record in load_records(FOLDER):
        if "heldout" in record:
            run_dir = RUNS / record["name"]
            shutil.rmtree(run_dir / "eval", ignore_errors=True)
            evaluate_heldout(record["name"], grid=grid_successes(record["arm"], run_dir))


def sft_success() -> dict[str, float]:
    """S0: the SFT flow on the held-out episodes, as flow_rl.py measured it."""
    record = json.loads((FLOW_RL_RECORDS / "flow-sft.json").read_text())
    return {mode: record["heldout"][mode]["success_rate"] for mode in ("deterministic", "sampled")}


def grid_curve(record: dict) -> list[dict]:
    """The run's checkpoint evaluations as curve points, its final one included."""
    points = {int(k): v for k, v in record["grid"].items()}
    points[ENV_STEPS] = record["heldout"]["deterministic"]["success_rate"]
    return [{"env_steps": s, "heldout/success_rate": points[s]} for s in sorted(points)]


def report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = load_records(FOLDER)
    tuning = {r["variant"]: r for r in records if r["name"].split("/")[-1].startswith("tune-") and "variant" in r}
    runs = [r for r in records if "heldout" in r and "arm" in r]
    s0 = sft_success()
    summary: dict = {"task": "PickCube-v1", "s0": s0, "chosen": CHOSEN, "tuning": {}, "arms": {}}
    tuning_rows = []
    for variant in VARIANTS:
        if variant in tuning:
            score = tuning_score(tuning[variant])
            summary["tuning"][variant] = {"score": score, "wall_time_s": tuning[variant]["wall_time_s"]}
            label = f"**{variant}** (chosen)" if variant == CHOSEN else variant
            tuning_rows.append(f"| {label} | {score:.2f} | {tuning[variant]['wall_time_s'] / 60:.0f} min |")
    flow_sde = [r for r in runs if r["arm"] == "flow-sde"]
    target_lift = (
        float(np.mean([r["heldout"]["deterministic"]["success_rate"] for r in flow_sde])) - s0["deterministic"]
        if flow_sde
        else None
    )
    summary["target_lift"] = target_lift
    rows, reach_rows = [], []
    fig, ax = plt.subplots(figsize=(7, 4))
    colours = {"dsrl": "tab:blue", "flow-sde": "tab:orange"}
    for arm in ("dsrl", "flow-sde"):
        members = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
        if not members:
            continue
        seeds = ", ".join(str(r["seed"]) for r in members)
        entry: dict = {"seeds": [r["seed"] for r in members], "wall_time_s": [r["wall_time_s"] for r in members]}
        for mode in ("deterministic", "sampled"):
            values = [r["heldout"][mode]["success_rate"] for r in members]
            lift = float(np.mean(values)) - s0[mode]
            entry[mode] = {"per_seed": values, "mean": float(np.mean(values)), "lift": lift}
            rows.append(
                f"| {arm} | {seeds} | {mode_name(mode)} | {s0[mode]:.2f} | {seed_cells(values)} | {lift:+.2f} |"
            )
        curves = [grid_curve(r) for r in members]
        if target_lift is not None:
            threshold = s0["deterministic"] + target_lift
            entry["env_steps_to_lift"] = [first_reaching(c, "heldout/success_rate", threshold - 1e-9) for c in curves]
            reached = ", ".join(f"{s:,}" if s else f"not within {ENV_STEPS:,}" for s in entry["env_steps_to_lift"])
            minutes = ", ".join(f"{w / 60:.0f}" for w in entry["wall_time_s"])
            reach_rows.append(f"| {arm} | {seeds} | {reached} | {minutes} |")
        summary["arms"][arm] = entry
        for record, curve in zip(members, curves):
            ax.plot(
                [0, *(p["env_steps"] for p in curve)],
                [s0["deterministic"], *(p["heldout/success_rate"] for p in curve)],
                color=colours[arm],
                marker="o",
                alpha=0.8,
                label=f"{arm} (seeds {seeds})" if record is members[0] else None,
            )
    ax.axhline(s0["deterministic"], color="grey", linestyle=":", linewidth=1, label="S0 (SFT)")
    if target_lift is not None:
        ax.axhline(
            s0["deterministic"] + target_lift, color="grey", linestyle="--", linewidth=1, label="Flow-SDE's lift"
        )
    ax.set_xlabel("env steps")
    ax.set_ylabel(f"held-out greedy success ({HELDOUT_EPISODES} episodes)")
    ax.set_title("PickCube-v1: DSRL vs Flow-SDE PPO from the same SFT flow")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    provenances = [r["provenance"] for r in [*tuning.values(), *runs]]
    commits = sorted({p["commit"] for p in provenances})
    evaluated = sorted({r["heldout"].get("commit", r["provenance"]["commit"]) for r in runs if "heldout" in r})
    machine = next((p["machine"] for p in provenances), None)
    summary.update({"commits": commits, "evaluated_at": evaluated, "machine": machine})
    save_with_summary(fig, RESULTS, "dsrl", summary)
    verdict = "not measured yet"
    if target_lift is not None and {"dsrl", "flow-sde"} <= set(summary["arms"]):
        mean_steps = {
            arm: float(np.mean([s or ENV_STEPS + GRID for s in summary["arms"][arm]["env_steps_to_lift"]]))
            for arm in ("dsrl", "flow-sde")
        }
        met = mean_steps["dsrl"] < mean_steps["flow-sde"]
        verdict = (
            f"{'met' if met else '**not met**'}: DSRL {mean_steps['dsrl']:,.0f} against Flow-SDE "
            f"{mean_steps['flow-sde']:,.0f} env steps on the mean (a run that never reached the lift counts as "
            f"{ENV_STEPS + GRID:,}, so a mean with one is a lower bound)"
        )
    lines = [
        "# DSRL against Flow-SDE PPO from the same SFT flow (PickCube-v1)",
        "",
        f"Trained at commits {', '.join(commits)}; evaluated held out at {', '.join(evaluated)}; {machine}; "
        "`python benchmarks/dsrl.py tune`, `python benchmarks/dsrl.py heldout --parallel 2`.",
        "",
        "Both arms start from flow_rl.py's SFT flow. DSRL keeps it frozen and learns the initial noise of each chunk; "
        "Flow-SDE PPO fine-tunes the flow (flow_rl.py's recipe). Every "
        f"{GRID:,} env steps a checkpoint is evaluated greedy on {HELDOUT_EPISODES} episodes of the held-out "
        f"evaluation seed {HELDOUT_SEED}, as S0 was.",
        "",
        "## Tuning (seed 1): DSRL's settings",
        "",
        f"Mean of the last three periodic evaluations (32 episodes of seed 1's stream) after {TUNE_STEPS:,} env steps.",
        "",
        "| variant | score | wall time |",
        "| --- | ---: | ---: |",
        *tuning_rows,
        "",
        f"## Reported (seeds {', '.join(map(str, SEEDS))}, never used for tuning)",
        "",
        "Final policies after "
        f"{ENV_STEPS:,} env steps, held out (interval: Student's t over the seeds, cut to [0, 1]):",
        "",
        "| arm | seeds | mode | S0 | per seed | mean | min | max | 95% interval of the mean | lift |",
        "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | --- | ---: |",
        *rows,
        "",
        "Env steps to Flow-SDE's final greedy lift"
        + (f" ({target_lift:+.2f}, i.e. {s0['deterministic'] + target_lift:.2f})" if target_lift is not None else "")
        + f", from the checkpoints every {GRID:,} env steps:",
        "",
        "| arm | seeds | env steps to the lift | wall time per run (min) |",
        "| --- | --- | --- | --- |",
        *reach_rows,
        "",
        f"Goal (DSRL reaches the lift in fewer env steps): {verdict}.",
        "",
        "![held-out success of the checkpoints](dsrl.png)",
    ]
    write_report(RESULTS, "dsrl", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("tune", "heldout", "reevaluate", "report"))
    parser.add_argument("--parallel", type=int, default=2, help="heldout runs at a time")
    parser.add_argument("--seeds", type=int, nargs="*", default=SEEDS, help="heldout: these of the seeds only")
    args = parser.parse_args()
    os.environ.setdefault("HF_HOME", str(RUNS / "hf-cache"))
    if args.command == "tune":
        tune()
    elif args.command == "heldout":
        heldout(args.parallel, tuple(args.seeds))
    elif args.command == "reevaluate":
        reevaluate()
    report()


if __name__ == "__main__":
    main()
