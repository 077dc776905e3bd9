"""Tuning a study's settings on seed 1: its tuning arms (each the study's plain arm with
overrides added) trained on the tuning seed, whose periodic evaluations choose settings while
the held-out seeds stay unseen, and the report that compares them."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from harness.intervention_study import Study, record_scripted_demos
from harness.pushcube_sac import GOAL
from harness.reports import save_with_summary, write_report
from harness.runs import RESULTS, annotate, learner_curve, load_records, record_path, train
from harness.stats import first_reaching

TUNING_SEED = 1


def tuning_folder(study: Study) -> str:
    return f"{study.name}_tuning"


def tuning_run(study: Study, arm: str) -> str:
    return f"{tuning_folder(study)}/{arm}-s{TUNING_SEED}"


def tune(
    study: Study,
    arms: dict[str, list[str]],
    parallel: int,
    only: list[str] | None = None,
    demos: dict[Path, tuple[list[str], int]] | None = None,
    runtime: list[str] | None = None,
) -> None:
    """The study's tuning `arms` on seed 1 (`only`: these), each record with its learner's
    entropy and temperature; `demos`: demo sets some arms read beside the study's own (folder:
    env overrides and episodes), recorded where an arm to run names them; `runtime`: overrides
    that run each arm in another runtime, recorded with the arm's own."""
    plain = study.arms[next(iter(study.arms))]

    def one(arm: str) -> None:
        name = tuning_run(study, arm)
        extra = [*arms[arm], *(runtime or [])]
        overrides = [*(o for o in study.common if not o.startswith("seed=")), f"seed={TUNING_SEED}", *plain, *extra]
        train(name, overrides, study.steps, study.resume_with)
        annotate(name, arm=arm, seed=TUNING_SEED, overrides=overrides, extra=extra, learner=learner_curve(name, 500))

    study.prepare()
    missing = [arm for arm in only or arms if not record_path(tuning_run(study, arm)).is_file()]
    for root, (env, episodes) in (demos or {}).items():
        if any(f"algo.dataset={root}" in arms[arm] for arm in missing):
            record_scripted_demos(root, env, episodes)
    with ThreadPoolExecutor(parallel) as pool:
        for job in [pool.submit(one, arm) for arm in missing]:
            job.result()


def tune_report(study: Study, key: str) -> None:
    """results/<study>_tuning.{json,md,png}, rebuilt from results/runs/<study>_tuning/; `key`:
    the study's name on hil.py's command line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = {r["arm"]: r for r in load_records(tuning_folder(study))}
    if not records:
        print(f"no {tuning_folder(study)} runs collected")
        return
    summary: dict = {"task": study.task, "seed": TUNING_SEED, "goal": GOAL, "arms": {}}
    rows = []
    fig, (success, entropy) = plt.subplots(1, 2, figsize=(11, 3.6))
    for arm, record in records.items():
        curve = [p for p in record["curve"] if "eval/success_rate" in p]
        values = [p["eval/success_rate"] for p in curve]
        entry = {
            "extra": record["extra"],
            "env_steps_to_goal": first_reaching(curve, "eval/success_rate", GOAL),
            "best_periodic_success": max(values),
            "final_periodic_success": values[-1],
            "mean_last_5": float(np.mean(values[-5:])),
            "final_temperature": record["learner"][-1]["temperature"],
            "operator_share": record["intervened_mean"],  # of all env steps, the operator's
            "wall_time_s": record["wall_time_s"],
        }
        summary["arms"][arm] = entry
        reached = entry["env_steps_to_goal"]
        # a run stopped by hand before its budget (its record says where): its last evaluation is its final
        stopped = f" (stopped at {record['stopped_at']:,})" if "stopped_at" in record else ""
        rows.append(
            f"| {arm} | {checkout_free(' '.join(record['extra'])) or '-'} | "
            f"{f'{reached:,}' if reached else 'not within ' + format(curve[-1]['env_steps'], ',') + stopped} | "
            f"{entry['best_periodic_success']:.2f} | {entry['final_periodic_success']:.2f} | "
            f"{entry['mean_last_5']:.2f} | {entry['final_temperature']:.3g} | {entry['operator_share']:.0%} | "
            f"{entry['wall_time_s'] / 60:.0f} min |"
        )
        success.plot([p["env_steps"] for p in curve], values, label=arm)
        entropy.plot([p["env_steps"] for p in record["learner"]], [p["entropy"] for p in record["learner"]], label=arm)
    success.axhline(GOAL, color="grey", linestyle="--", linewidth=1)
    success.set(xlabel="env steps", ylabel="periodic eval success (16 episodes)", title=f"{study.task}, seed 1")
    entropy.set(xlabel="env steps", ylabel="policy entropy (nats)", title="the actor's entropy")
    for ax in (success, entropy):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    commits = sorted({r["provenance"]["commit"] for r in records.values()})
    summary.update({"commits": commits, "machine": next(iter(records.values()))["provenance"]["machine"]})
    name = tuning_folder(study)
    save_with_summary(fig, RESULTS, name, summary)
    lines = [
        f"# Tuning {study.task} (seed {TUNING_SEED})",
        "",
        f"Commits {', '.join(commits)}; {summary['machine']}; `python benchmarks/hil.py tune {key}`.",
        "",
        f"{study.recipe}. Each arm adds its overrides to the study's plain arm and trains on seed "
        f"{TUNING_SEED}, the tuning seed: these figures chose settings, so they are not held-out results. "
        f"Periodic evaluations: 16 episodes of the run's own seed every {study.eval_every:,} env steps.",
        "",
        "| arm | overrides | env steps to 90% | best | final | mean of last 5 | final temperature | "
        "steps the operator drove | wall time |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        *rows,
        "",
        f"![tuning runs]({name}.png)",
    ]
    write_report(RESULTS, name, lines)


def checkout_free(text: str) -> str:
    """`text` with the run folders' absolute paths (which name the checkout the run came from)
    cut to benchmarks/runs/..."""
    return re.sub(r"/\S*?/benchmarks/runs/", "benchmarks/runs/", text)
