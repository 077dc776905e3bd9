"""WSRL against naive offline-to-online fine-tuning, from pretraining worth keeping
(ManiSkill PushCube-v1, state, CPU; the learner and networks of hil.py).

hil.py's first comparison pretrained on 20 demos for 2,000 Cal-QL steps, a policy that almost
never succeeded, so there was little for WSRL's warm-up to keep. Here:

  tune      on seed 1, the tuning seed: each pretraining variant (demos x Cal-QL steps)
            pretrains, then its frozen policy collects WSRL's warm-up while the periodic
            evaluation (16 fixed episodes of seed 1's evaluation stream) measures it. PRETRAIN
            names the variant chosen from that table: the cheapest whose pretrained policy
            succeeds at least MIN_PRETRAINED of the time.
  heldout   the arms (wsrl, naive, and wsrl-anchored: wsrl with the hand-over the collapse
            study found) from that pretraining on training seeds 101-103 (never used for
            tuning), ENV_STEPS each: S0 (the frozen pretrained policy during the warm-up,
            16 fixed episodes of the run's own seed), the dip (the lowest periodic success in the
            first DIP_WINDOW env steps of online learning, where naive fine-tuning is known
            to unlearn), env steps to 90%, and each final policy on 100 episodes of the
            held-out evaluation seed, greedy and sampled.
  report    rebuild results/wsrl.{json,md,png} from the committed per-run records in
            results/runs/wsrl_tuning/ and results/runs/wsrl_heldout/.
  collapse  why wsrl and naive fall to 0 once online learning starts: on the tuning seed,
            wsrl as reported, with other SAC temperatures, with the BC term kept for the
            actor online (online_bc), pretrained without BC, without the entropy in the TD
            target, with a critic warm-up after the hand-over, and with the BC term kept
            and the temperature restarted low together, through the warm-up and
            DIP_WINDOW env steps of online learning, with the actor's entropy and the
            temperature beside success (results/wsrl_collapse.{json,md,png})

    python benchmarks/wsrl.py tune
    python benchmarks/wsrl.py heldout --parallel 2
    python benchmarks/wsrl.py report
    python benchmarks/wsrl.py collapse --parallel 2
    python benchmarks/wsrl.py collapse --variants "critic warm-up"   # one variant (or several)

The expert and its recorded demos are hil.py's (harness/pushcube_sac.py: a PPO run of the
main job, served by `embodied serve`, driving `embodied robot robot=sim` while it records)."""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from harness.handover import ANCHORED, WARMUP, WSRL, calql_pretraining
from harness.heldout import HELDOUT_EPISODES, HELDOUT_SEED, evaluate_heldout
from harness.pushcube_sac import GOAL, RECIPE, ensure_expert, record_demos
from harness.reports import save_with_summary, write_report
from harness.runs import RESULTS, RUNS, annotate, has_heldout, learner_curve, load_records, record_path, train
from harness.stats import first_reaching, held_from, interval95, mode_name, seed_cells

VARIANTS = {  # name: (expert demos, Cal-QL pretraining steps)
    "d20-p2k": (20, 2_000),  # hil.py's
    "d20-p10k": (20, 10_000),
    "d50-p10k": (50, 10_000),
}
# WSRL's claim is that its warm-up keeps what pretraining learned; a policy that succeeds a
# quarter of the time leaves little to keep, so the chosen one succeeds about half the time
MIN_PRETRAINED = 0.5
PRETRAIN: str | None = "d20-p10k"  # chosen from the tuning table (see the report): 0.69 on seed 1
CRITIC_WARMUP = f"algo.critic_warmup_steps={WARMUP}"  # the critics learn alone first, as long as the warm-up
ARMS = {
    "wsrl": WSRL,
    "naive": ["algo.retain_offline=false"],
    "wsrl-anchored": [*WSRL, *ANCHORED],  # the other arms' pretraining settings
    # the collapse study's last variant on seed 1 (the dip 0.56 against 0.69 pretrained)
    "wsrl-anchored-critic-warmup": [*WSRL, *ANCHORED, CRITIC_WARMUP],
    # the yardstick WSRL must reach at equal env steps: RLPD from scratch on the same demos (hil.py's
    # recipe: no pretraining, the demos kept in every batch), at the same commit as the other arms
    "rlpd": [],
}
FROM_SCRATCH = ("rlpd",)  # arms without pretraining: no S0, no hand-over
WARMUP_ARMS = tuple(arm for arm, overrides in ARMS.items() if f"algo.warmup_steps={WARMUP}" in overrides)
SEEDS = (101, 102, 103)
ENV_STEPS = 20_000  # per run, as hil.py
DIP_WINDOW = 5_000  # env steps of online learning in which the dip is looked for
TUNING, HELDOUT = "wsrl_tuning", "wsrl_heldout"  # under RUNS (run directories) and RESULTS / "runs"


def demos(count: int) -> Path:
    return RUNS / f"hil-demos-{count}"


def pretraining(variant: str) -> list[str]:
    count, steps = VARIANTS[variant]
    return [f"algo.dataset={demos(count)}", *calql_pretraining(steps)]


def arm_data(arm: str) -> list[str]:
    """The chosen pretraining's demos, and its Cal-QL pretraining unless the arm starts from scratch."""
    if arm in FROM_SCRATCH:
        return [f"algo.dataset={demos(VARIANTS[PRETRAIN][0])}"]
    return pretraining(PRETRAIN)


def settings(seed: int, extra: list[str]) -> list[str]:
    """hil.py's settings with the run's seed; a key in `extra` replaces hil.py's value."""
    replaced = {"seed", *(o.split("=", 1)[0] for o in extra)}
    return [*(o for o in RECIPE if o.split("=", 1)[0] not in replaced), f"seed={seed}", *extra]


def prepare(variants: list[str]) -> None:
    ensure_expert()
    for count in sorted({VARIANTS[v][0] for v in variants}):
        record_demos(count, demos(count))


def tune() -> None:
    """Each variant's pretrained policy, measured during the warm-up on seed 1."""
    prepare(list(VARIANTS))
    for variant in VARIANTS:
        name = f"{TUNING}/{variant}"
        if record_path(name).is_file() and "variant" in json.loads(record_path(name).read_text()):
            continue
        overrides = settings(1, [*pretraining(variant), *ARMS["wsrl"]])
        train(name, overrides, WARMUP)
        record = json.loads(record_path(name).read_text())
        record_path(name).write_text(json.dumps({**record, "variant": variant, "overrides": overrides}))


def pretrained_success(record: dict) -> float:
    """The frozen pretrained policy: the periodic evaluations of the warm-up (the same 16
    episodes each time, so they agree; their mean is that one measurement)."""
    values = [p["eval/success_rate"] for p in record["curve"] if "eval/success_rate" in p and p["env_steps"] <= WARMUP]
    return float(np.mean(values))


def heldout(parallel: int, seeds: tuple[int, ...] = SEEDS, arms: tuple[str, ...] = tuple(ARMS)) -> None:
    if PRETRAIN is None:
        raise SystemExit("no pretraining chosen yet: run `wsrl.py tune` and set PRETRAIN from its table")
    prepare([PRETRAIN])

    def one(arm: str, seed: int) -> None:
        name = f"{HELDOUT}/{arm}-s{seed}"
        if has_heldout(name):
            return
        overrides = settings(seed, [*arm_data(arm), *ARMS[arm]])
        train(name, overrides, ENV_STEPS)
        evaluate_heldout(name, arm=arm, seed=seed, pretraining=PRETRAIN, overrides=overrides)

    with ThreadPoolExecutor(parallel) as pool:
        for job in [pool.submit(one, arm, seed) for seed in seeds for arm in arms]:
            job.result()


def report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tuning = {r["variant"]: r for r in load_records(TUNING) if "variant" in r}
    runs = [r for r in load_records(HELDOUT) if "heldout" in r]
    summary: dict = {
        "task": "PushCube-v1",
        "goal": GOAL,
        "min_pretrained": MIN_PRETRAINED,
        "pretraining": PRETRAIN,
        "tuning": {
            v: {"pretrained_success": pretrained_success(r), "wall_time_s": r["wall_time_s"]} for v, r in tuning.items()
        },
        "arms": {},
    }
    tuning_rows = [
        f"| {f'**{v}** (chosen)' if v == PRETRAIN else v} | {VARIANTS[v][0]} | {VARIANTS[v][1]:,} | "
        f"{summary['tuning'][v]['pretrained_success']:.2f} | {summary['tuning'][v]['wall_time_s'] / 60:.0f} min |"
        for v in VARIANTS
        if v in tuning
    ]
    rows, heldout_rows = [], []
    fig, ax = plt.subplots(figsize=(7, 4))
    colours = {
        "wsrl": "tab:blue",
        "naive": "tab:orange",
        "wsrl-anchored": "tab:green",
        "wsrl-anchored-critic-warmup": "tab:red",
        "rlpd": "tab:grey",
    }
    # the frozen pretrained policy, as each warming-up arm's run measured it (the same pretraining)
    s0 = {(r["arm"], r["seed"]): pretrained_success(r) for r in runs if r["arm"] in WARMUP_ARMS}
    for arm in ARMS:
        members = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
        if not members:
            continue
        start = WARMUP if arm in WARMUP_ARMS else 0  # where online learning starts
        measured_by = arm if arm in WARMUP_ARMS else "wsrl"
        scratch = arm in FROM_SCRATCH
        entry: dict = {
            "seeds": [r["seed"] for r in members],
            "s0": [None if scratch else s0.get((measured_by, r["seed"])) for r in members],
        }
        curves = [[p for p in r["curve"] if "eval/success_rate" in p] for r in members]
        # the actor's first online update: after the critics' own warm-up where the arm has one, so
        # an evaluation of the still-frozen actor does not count as online
        actor_start = start + (WARMUP if CRITIC_WARMUP in ARMS[arm] else 0)
        online = [[p["eval/success_rate"] for p in c if p["env_steps"] > actor_start] for c in curves]
        entry["first_online"] = [None if scratch else values[0] for values in online]
        # the hand-over goal: the first online evaluation at >= 0.8x the pretrained success
        entry["first_online_over_s0"] = [
            None if first is None or not s0_ else first / s0_ for first, s0_ in zip(entry["first_online"], entry["s0"])
        ]
        entry["dip"] = [
            None if scratch else min(p["eval/success_rate"] for p in c if start < p["env_steps"] <= start + DIP_WINDOW)
            for c in curves
        ]
        entry["env_steps_to_goal"] = [first_reaching(c, "eval/success_rate", GOAL) for c in curves]
        entry["held_from"] = [held_from(c, GOAL) for c in curves]
        entry["final_periodic_success"] = [c[-1]["eval/success_rate"] for c in curves]
        for mode in ("deterministic", "sampled"):
            values = [r["heldout"][mode]["success_rate"] for r in members]
            entry[mode] = {"per_seed": values, "mean": float(np.mean(values)), "interval95": interval95(values)}
            met = "-" if mode == "sampled" else ("yes" if np.mean(values) >= GOAL else "**no**")
            seeds = ", ".join(map(str, entry["seeds"]))
            heldout_rows.append(f"| {arm} | {seeds} | {mode_name(mode)} | {seed_cells(values)} | {met} |")
        summary["arms"][arm] = entry
        listed = lambda values, fmt="{:.2f}": ", ".join("-" if v is None else fmt.format(v) for v in values)  # noqa: E731
        rows.append(
            f"| {arm} | {', '.join(map(str, entry['seeds']))} | {listed(entry['s0'])} | "
            f"{listed(entry['first_online'])} ({listed(entry['first_online_over_s0'], '{:.2f}x')}) | "
            f"{listed(entry['dip'])} | "
            f"{', '.join(f'{s:,}' if s else f'not within {ENV_STEPS:,}' for s in entry['env_steps_to_goal'])} | "
            f"{listed(entry['final_periodic_success'])} |"
        )
        for record, curve in zip(members, curves):
            ax.plot(
                [p["env_steps"] for p in curve],
                [p["eval/success_rate"] for p in curve],
                color=colours[arm],
                alpha=0.8,
                label=f"{arm} (seeds {', '.join(map(str, entry['seeds']))})" if record is members[0] else None,
            )
    ax.axvline(WARMUP, color="tab:blue", linestyle=":", linewidth=1, label="warm-up ends")
    ax.axhline(GOAL, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("env steps (pretraining not counted)")
    ax.set_ylabel("periodic eval success (16 episodes)")
    ax.set_title(f"PushCube-v1: WSRL and naive after Cal-QL pretraining ({PRETRAIN})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    commits = sorted({r["provenance"]["commit"] for r in [*tuning.values(), *runs]})
    machine = next((r["provenance"]["machine"] for r in [*tuning.values(), *runs]), None)
    summary.update({"commits": commits, "machine": machine})
    save_with_summary(fig, RESULTS, "wsrl", summary)
    count, steps = VARIANTS[PRETRAIN] if PRETRAIN else (0, 0)
    lines = [
        "# WSRL against naive offline-to-online, from pretraining worth keeping (PushCube-v1)",
        "",
        f"Commits {', '.join(commits)}; {machine}; `python benchmarks/wsrl.py tune`, "
        "`python benchmarks/wsrl.py heldout --parallel 2`.",
        "",
        "## Tuning (seed 1): the pretrained policy per pretraining variant",
        "",
        "Success of the frozen pretrained policy during its warm-up: the periodic evaluation, 16 fixed episodes from "
        f"seed 1's evaluation stream. Chosen: the cheapest variant at >= {MIN_PRETRAINED:.0%}.",
        "",
        "| variant | demos | Cal-QL steps | pretrained success | wall time (pretraining + warm-up) |",
        "| --- | ---: | ---: | ---: | ---: |",
        *tuning_rows,
        "",
        f"## Reported (seeds {', '.join(map(str, SEEDS))}, never used for tuning)",
        "",
        f"Every arm but {', '.join(FROM_SCRATCH)} pretrains on {count} demos for {steps:,} Cal-QL steps, then learns "
        f"online without the offline data for {ENV_STEPS:,} env steps; {', '.join(FROM_SCRATCH)} is RLPD from "
        f"scratch on the same {count} demos for the same env steps (hil.py's recipe: no pretraining, the demos in "
        f"every batch), the yardstick WSRL's final policy must reach. {', '.join(WARMUP_ARMS)} first let the frozen "
        "policy collect "
        f"{WARMUP:,} of them, and wsrl-anchored keeps the BC term for the actor on the demos and restarts the "
        "temperature at 0.01 when online learning starts (wsrl-anchored-critic-warmup as well, its critics learning "
        f"alone for the first {WARMUP:,} online steps). The expert and its demos are made anew on each machine "
        "(the commits tell the runs apart), so arms run at different commits compare only roughly. S0: the "
        "warm-up's evaluation (16 fixed episodes of the run's seed; naive's is wsrl's, the same pretraining). The "
        "first online evaluation: the first periodic evaluation after the actor's first online update, which "
        "wsrl-anchored-critic-warmup holds back until its critics' warm-up ends (goal: >= 0.8x S0). "
        f"Dip: the lowest periodic success in the first {DIP_WINDOW:,} env steps of online learning.",
        "",
        "| arm | seeds | S0 | first online evaluation (/ S0) | dip | env steps to 90% | final periodic success |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"Final policies on {HELDOUT_EPISODES} episodes of the held-out evaluation seed {HELDOUT_SEED} (interval: "
        "Student's t over the seeds, cut to [0, 1]; goal 90% greedy):",
        "",
        "| arm | seeds | mode | per seed | mean | min | max | 95% interval of the mean | goal met |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | --- | --- |",
        *heldout_rows,
        "",
        "![periodic evaluations](wsrl.png)",
    ]
    write_report(RESULTS, "wsrl", lines)


ACTION_DIM = 8  # PushCube-v1 under pd_joint_delta_pos: the uniform policy's entropy is 8 ln 2 nats
COLLAPSE_VARIANTS = {
    "as reported": [],
    "init_temperature=0.05": ["algo.init_temperature=0.05"],
    # pretraining sets the temperature whatever it starts from: this one holds it still
    "temperature fixed at 0.01": ["algo.init_temperature=0.01", "algo.temperature_lr=0"],
    # pretraining as reported; online learning starts from a low temperature, which then learns
    "online_temperature=0.01": ["algo.online_temperature=0.01"],
    # the BC anchor stays for the actor after the hand-over; the critics' batches are online only
    "online_bc": ["algo.online_bc=true"],
    # WSRL's, SERL's and HIL-SERL's code all leave the entropy out of the TD target
    "no entropy backup": ["algo.backup_entropy=false"],
    # pretraining as WSRL's paper does it: Cal-QL without a BC term, so nothing vanishes at the hand-over
    "pretrained without BC": ["algo.bc_weight=0"],
    # the critics alone learn for the first 2,000 online steps: whether the actor collapses by
    # following critics that just lost their conservative term and their offline rows
    "critic warm-up": [CRITIC_WARMUP],
    # the same, with the temperature restarted low at the hand-over (the other cause found)
    "critic warm-up, online_temperature=0.01": [CRITIC_WARMUP, "algo.online_temperature=0.01"],
    # SERL's temperature (1e-2 at the start, learned; no entropy in the target) from pretraining on,
    # as the PickCube state study chose it: whether a sampled policy that stays near its mode
    # hands over without the collapse (the reported hand-over finds it near uniform)
    "SERL temperature": ["algo.init_temperature=0.01", "algo.backup_entropy=false"],
    # the same with the BC anchor kept for the actor after the hand-over
    "SERL temperature, online_bc": ["algo.init_temperature=0.01", "algo.backup_entropy=false", "algo.online_bc=true"],
    # both causes the variants above point at, together: the BC anchor kept for the actor and
    # the temperature restarted low, so entropy cannot pull the policy off the demos' actions
    "online_bc, online_temperature=0.01": ANCHORED,
    # the same with a milder conservative term: Cal-QL at alpha 5 pushes the critics' values of
    # actions away from the data far down, a steep landscape for an actor leaving the data
    "online_bc, online_temperature=0.01, calql_alpha=1": [*ANCHORED, "algo.calql_alpha=1"],
    # the anchored hand-over with the critics learning alone first: whether the dip that remains
    # one evaluation after the hand-over is the actor following critics still recalibrating
    "online_bc, online_temperature=0.01, critic warm-up": [*ANCHORED, CRITIC_WARMUP],
}


def collapse_name(variant: str) -> str:
    return f"{TUNING}/collapse-{variant.replace(', ', '-').replace(' ', '-').replace('=', '-')}"


def collapse(parallel: int, variants: list[str] | None = None) -> None:
    """WSRL on seed 1 through the dip window, as reported and with the other variants (or only
    `variants`) not recorded yet, `parallel` runs at a time; the records keep the actor's entropy
    and the temperature of the whole run."""
    prepare([PRETRAIN])
    chosen = [v for v in (variants or COLLAPSE_VARIANTS) if not collapse_recorded(v)]
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(collapse_run, chosen))


def collapse_recorded(variant: str) -> bool:
    path = record_path(collapse_name(variant))
    return path.is_file() and "collapse_variant" in json.loads(path.read_text())


def collapse_run(variant: str) -> None:
    """One variant's run through the dip window, and its record with the learner's metrics."""
    name, extra = collapse_name(variant), COLLAPSE_VARIANTS[variant]
    overrides = settings(1, [*pretraining(PRETRAIN), *ARMS["wsrl"], *extra])
    train(name, overrides, WARMUP + DIP_WINDOW)
    annotate(name, collapse_variant=variant, overrides=overrides, learner=learner_curve(name, 100))


def collapse_report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = {r["collapse_variant"]: r for r in load_records(TUNING) if "collapse_variant" in r}
    if not records:
        print("no collapse runs collected")
        return
    bound = ACTION_DIM * float(np.log(2))
    summary: dict = {"task": "PushCube-v1", "seed": 1, "uniform_entropy": bound, "variants": {}}
    rows = []
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    for variant, record in records.items():
        evals = [p for p in record["curve"] if "eval/success_rate" in p]
        online = [p for p in record["learner"] if p["env_steps"] > WARMUP]
        dip = min(p["eval/success_rate"] for p in evals if WARMUP < p["env_steps"] <= WARMUP + DIP_WINDOW)
        entry = {
            "pretrained_success": pretrained_success(record),
            "dip": dip,
            "temperature_at_handover": online[0]["temperature"],
            "entropy_first_1000": float(np.mean([p["entropy"] for p in online if p["env_steps"] <= WARMUP + 1000])),
            "entropy_max": max(p["entropy"] for p in online),
            "final": evals[-1]["eval/success_rate"],
        }
        summary["variants"][variant] = entry
        rows.append(
            f"| {variant} | {entry['pretrained_success']:.2f} | {entry['temperature_at_handover']:.3f} | "
            f"{entry['entropy_first_1000']:.2f} | {entry['entropy_max']:.2f} | {dip:.2f} | {entry['final']:.2f} |"
        )
        axes[0].plot(
            [p["env_steps"] for p in evals], [p["eval/success_rate"] for p in evals], marker="o", label=variant
        )
        axes[1].plot(
            [p["env_steps"] for p in record["learner"]], [p["entropy"] for p in record["learner"]], label=variant
        )
        axes[2].plot(
            [p["env_steps"] for p in record["learner"]], [p["temperature"] for p in record["learner"]], label=variant
        )
    axes[1].axhline(bound, color="grey", linestyle="--", linewidth=1, label="uniform policy (8 ln 2)")
    for ax, label in zip(axes, ("periodic eval success (16 episodes)", "actor entropy (nats)", "SAC temperature")):
        ax.axvline(WARMUP, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("env steps (warm-up ends at the dotted line)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[2].set_yscale("log")
    provenances = [r["provenance"] for r in records.values()]
    summary.update({"commits": sorted({p["commit"] for p in provenances}), "machine": provenances[0]["machine"]})
    save_with_summary(fig, RESULTS, "wsrl_collapse", summary)
    lines = [
        "# Why WSRL and naive fine-tuning collapse once online learning starts, and what holds them "
        "(PushCube-v1, seed 1)",
        "",
        f"Commits {', '.join(summary['commits'])}; {summary['machine']}; "
        "`python benchmarks/wsrl.py collapse --parallel 2`.",
        "",
        f"WSRL from the chosen pretraining ({PRETRAIN}) on the tuning seed, through its {WARMUP:,}-step warm-up and "
        f"{DIP_WINDOW:,} env steps of online learning. Entropy: the actor's, -log pi of its samples (nats), whose "
        f"largest possible value on [-1, 1]^{ACTION_DIM} is the uniform policy's, {bound:.2f}. Dip: the lowest "
        "periodic success after the warm-up; final: the last periodic success, at the end of that window. "
        "A diagnosis on the tuning seed, not a reported result.",
        "",
        "| variant | pretrained success | temperature at the hand-over | entropy, first 1,000 online steps | "
        "entropy, max | dip | final |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        "![success, entropy and temperature](wsrl_collapse.png)",
    ]
    write_report(RESULTS, "wsrl_collapse", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("tune", "heldout", "report", "collapse"))
    parser.add_argument("--parallel", type=int, default=2, help="heldout or collapse runs at a time")
    parser.add_argument("--seeds", type=int, nargs="*", default=SEEDS, help="heldout: these of the seeds only")
    parser.add_argument("--arms", nargs="*", choices=list(ARMS), default=list(ARMS), help="heldout: these arms only")
    parser.add_argument(
        "--variants", nargs="*", choices=list(COLLAPSE_VARIANTS), help="collapse: these variants only (default: all)"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HOME", str(RUNS / "hf-cache"))
    if args.command == "tune":
        tune()
    elif args.command == "heldout":
        heldout(args.parallel, tuple(args.seeds), tuple(args.arms))
    elif args.command == "collapse":
        collapse(args.parallel, args.variants)
        collapse_report()
        return
    report()


if __name__ == "__main__":
    main()
