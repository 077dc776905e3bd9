"""hil.py's studies on held-out seeds: arms trained on fresh seeds (the first plain RLPD, the
others with an operator), each final policy evaluated held out, and the report that compares
the arms' env steps to the goal with plain RLPD's and gives their held-out success. hil.py
declares the studies (tasks, arms, seeds, budgets); this is how each is run and reported."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.commands import sft_or_resume
from harness.heldout import HELDOUT_EPISODES, HELDOUT_SEED, evaluate_heldout
from harness.pushcube_sac import GOAL, ensure_expert
from harness.reports import save_with_summary, write_report
from harness.runs import RESULTS, has_heldout, load_records, train
from harness.stats import first_reaching, held_from, interval95, mode_name, seed_cells

SPEEDUP_GOAL = 2.0  # interventions cut the env steps to 90% at least this much


@dataclass(frozen=True)
class Study:
    """Arms on the held-out seeds: the first arm is plain RLPD, the others are compared with it."""

    name: str  # results/<name>.{json,md,png}; records in results/runs/<name>/, runs in RUNS/<name>/
    task: str
    common: list[str]
    arms: dict[str, list[str]]
    steps: int  # env steps per run
    eval_every: int  # env steps between periodic evaluations
    recipe: str  # how the settings came about, for the report
    resume_with: tuple[str, ...] = ()  # added when an interrupted run continues (runs.train)
    # (where, the env overrides) of the scripted expert's demos it records; none: the PPO expert's
    scripted_demos: tuple[Path, list[str]] | None = None
    # (run folder, gradient steps, settings) of an SFT run on those demos that the arms start
    # from, as harness.commands.sft_or_resume takes them
    sft: tuple[Path, int, list[str]] | None = None

    def run_name(self, arm: str, seed: int) -> str:
        return f"{self.name}/{arm.removeprefix('hil-')}-s{seed}"

    def prepare(self) -> None:
        """What every arm needs before it trains: the demos (or the expert), then the SFT run."""
        if self.scripted_demos:
            record_scripted_demos(*self.scripted_demos)
        else:
            ensure_expert()
        if self.sft:
            sft_or_resume(*self.sft)


def record_scripted_demos(root: Path, env: list[str], episodes: int = 20) -> None:
    """The scripted expert's episodes, with camera frames where `env` renders them (`embodied demos`)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "embodied.cli",
            "demos",
            *env,
            f"episodes={episodes}",
            f"dataset={root}",
            "progress_bar=false",
        ],
        check=True,
    )


def heldout(study: Study, parallel: int, seeds: tuple[int, ...], arms: tuple[str, ...] = ()) -> None:
    """Train what is missing, evaluate each final policy held out, annotate its record (`arms`:
    these of the study's arms only, as hil.py's command line checked them; none: all)."""

    def one(arm: str, seed: int) -> None:
        name = study.run_name(arm, seed)
        if has_heldout(name):
            return
        overrides = [*(o for o in study.common if not o.startswith("seed=")), f"seed={seed}", *study.arms[arm]]
        train(name, overrides, study.steps, study.resume_with)
        evaluate_heldout(name, arm=arm, seed=seed, overrides=overrides)

    study.prepare()
    with ThreadPoolExecutor(parallel) as pool:
        jobs = [pool.submit(one, arm, seed) for seed in seeds for arm in arms or study.arms]
        for job in jobs:
            job.result()


def speedups(reached: dict[int, int | None], budget: dict[int, int], arm_reached: dict[int, int | None]) -> list:
    """Per seed: (ratio, exact). Where plain RLPD missed the goal its budget stands in, so the
    ratio is a lower bound; where the arm missed it, or plain RLPD has not run that seed yet,
    there is no ratio."""
    out = []
    for seed, steps in arm_reached.items():
        if steps is None or seed not in reached:
            out.append((None, False))
        elif reached[seed] is None:
            out.append((budget[seed] / steps, False))
        else:
            out.append((reached[seed] / steps, True))
    return out


def heldout_report(study: Study, key: str) -> None:
    """results/<study>.{json,md,png}, rebuilt from results/runs/<study>/; `key`: the study's
    command (`hil.py <key>`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in load_records(study.name) if "heldout" in r]
    if not records:
        print(f"no {study.name} runs collected")
        return
    arms = list(study.arms)
    plain = arms[0]
    summary: dict = {
        "task": study.task,
        "goal": GOAL,
        "speedup_goal": SPEEDUP_GOAL,
        "heldout_seed": HELDOUT_SEED,
        "heldout_episodes": HELDOUT_EPISODES,
        "arms": {},
    }
    reached: dict[str, dict[int, int | None]] = {}
    budget: dict[str, dict[int, int]] = {}
    rows, heldout_rows = [], []
    fig, axes = plt.subplots(1, len(arms), figsize=(5 * len(arms), 3.6), sharey=True)
    for ax, arm in zip(axes, arms):
        members = sorted((r for r in records if r["arm"] == arm), key=lambda r: r["seed"])
        if not members:
            continue
        curves = {r["seed"]: [p for p in r["curve"] if "eval/success_rate" in p] for r in members}
        reached[arm] = {seed: first_reaching(c, "eval/success_rate", GOAL) for seed, c in curves.items()}
        budget[arm] = {r["seed"]: r["curve"][-1]["env_steps"] for r in members}
        shares = [r["intervened_mean"] for r in members]
        entry: dict = {
            "seeds": list(curves),
            "env_steps_to_goal": list(reached[arm].values()),
            "held_from": [held_from(c, GOAL) for c in curves.values()],
            "final_periodic_success": [c[-1]["eval/success_rate"] for c in curves.values()],
            "intervention_share": shares,
            "wall_time_s": [r["wall_time_s"] for r in members],
        }
        for mode in ("deterministic", "sampled"):
            values = [r["heldout"][mode]["success_rate"] for r in members]
            entry[mode] = {"per_seed": values, "mean": float(np.mean(values)), "interval95": interval95(values)}
            met = "-" if mode == "sampled" else ("yes" if np.mean(values) >= GOAL else "**no**")
            heldout_rows.append(f"| {arm.removeprefix('hil-')} | {mode_name(mode)} | {seed_cells(values)} | {met} |")
        summary["arms"][arm] = entry
        steps_text = ", ".join(
            f"{s:,}" if s else f"not within {budget[arm][seed]:,}" for seed, s in reached[arm].items()
        )
        rows.append(
            f"| {arm.removeprefix('hil-')} | {steps_text} | "
            f"{', '.join(f'{v:.2f}' for v in entry['final_periodic_success'])} | "
            f"{', '.join(f'{v:.0%}' for v in shares)} | "
            f"{', '.join(f'{w / 60:.0f}' for w in entry['wall_time_s'])} min |"
        )
        for seed, curve in curves.items():
            ax.plot([p["env_steps"] for p in curve], [p["eval/success_rate"] for p in curve], label=f"seed {seed}")
        ax.axhline(GOAL, color="grey", linestyle="--", linewidth=1)
        ax.set_title(arm.removeprefix("hil-"))
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("periodic eval success (16 episodes)")
    fig.suptitle(f"{study.task}, interventions on fresh seeds (periodic evals; held-out figures in the table)")
    ratio_rows = []
    for arm in arms[1:]:
        if arm not in reached or plain not in reached:
            continue
        per_seed = speedups(reached[plain], budget[plain], reached[arm])
        values = [r for r, _ in per_seed if r is not None]
        exact = all(e for _, e in per_seed)
        mean = float(np.mean(values)) if len(values) == len(per_seed) else None
        summary["arms"][arm]["speedup_over_rlpd"] = {
            "per_seed": [r for r, _ in per_seed],
            "exact": [e for _, e in per_seed],
            "mean": mean,
            "goal_met": mean is not None and mean >= SPEEDUP_GOAL,
        }
        text = ", ".join("-" if r is None else f"{'' if e else '>= '}{r:.1f}x" for r, e in per_seed)
        mean_text = "-" if mean is None else f"{'' if exact else '>= '}{mean:.1f}x"
        verdict = "yes" if mean is not None and mean >= SPEEDUP_GOAL else "**no**"
        ratio_rows.append(
            f"| {plain.removeprefix('hil-')} -> {arm.removeprefix('hil-')} | {text} | {mean_text} | {verdict} |"
        )
    commits = sorted({r["provenance"]["commit"] for r in records})
    summary.update({"commits": commits, "machine": records[0]["provenance"]["machine"]})
    save_with_summary(fig, RESULTS, study.name, summary)
    seeds = ", ".join(map(str, sorted({r["seed"] for r in records})))
    lines = [
        f"# Human-in-the-loop on fresh seeds, held out ({study.task})",
        "",
        f"Commits {', '.join(commits)}; {summary['machine']}; `python benchmarks/hil.py {key}`.",
        "",
        f"{study.recipe}, on training seeds {seeds}. "
        "Steps to 90%: the first periodic evaluation (16 episodes drawn from the run's own seed, every "
        f"{study.eval_every:,} env steps) with >= 90% success; those episodes were never used to choose the "
        "settings. The final policies are "
        f"also evaluated on {HELDOUT_EPISODES} episodes of evaluation seed {HELDOUT_SEED}, which no run or tuning has "
        "drawn from. Intervals are Student's t over the seeds, cut to [0, 1].",
        "",
        "| arm | env steps to 90% (per seed) | final periodic success | steps the operator drove | wall time |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"## Interventions against RLPD without an operator (goal: >= {SPEEDUP_GOAL:g}x fewer env steps to 90%, "
        "mean over seeds)",
        "",
        "`>=` marks a lower bound: RLPD without an operator did not reach 90% within its budget, which stands in "
        "for its steps.",
        "",
        "| comparison | per seed | mean | goal met |",
        "| --- | --- | ---: | --- |",
        *ratio_rows,
        "",
        f"## Final policies, held out ({HELDOUT_EPISODES} episodes of seed {HELDOUT_SEED}; goal 90% greedy)",
        "",
        "| arm | mode | per seed | mean | min | max | 95% interval of the mean | goal met |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | --- |",
        *heldout_rows,
        "",
        f"![periodic evaluations]({study.name}.png)",
    ]
    write_report(RESULTS, study.name, lines)
