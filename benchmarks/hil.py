"""Human-in-the-loop benchmark on ManiSkill PushCube-v1 (state, CPU): env steps until the
deterministic policy succeeds in >= 90% of 16 fixed evaluation episodes.

  rlpd            SAC with RLPD's recipe from scratch, no offline data
  rlpd-oracle     the same with a scripted operator (a trained PPO expert) taking over
                  where the policy drifts until it agrees again; intervened steps count as
                  demonstrations
  rlpd-corrections  the same operator correcting at most 5 steps at a time, as a person who
                  corrects and lets go (HIL-SERL style): the policy keeps acting too

Every arm has ConRFT's behaviour-cloning term on the offline rows (`algo.bc_weight=1`): the
actor's mode regresses onto demo and correction actions. Without offline data (rlpd) it does
nothing.
  wsrl            Cal-QL pretraining on recorded expert demos, a warm-up of the frozen
                  pretrained policy, then online RLPD without the offline data
  naive           the same pretraining, then online learning at once without the offline
                  data (what WSRL's warm-up is there to fix)

The expert is a PPO run of the main job (`benchmarks/runs/pushcube-s1`, trained here first
if missing). Demos are recorded the way a user would: the expert served by `embodied serve`
drives the simulated robot through `embodied robot ... record.dataset=...`.

    python benchmarks/hil.py                  # everything, two runs at a time
    python benchmarks/hil.py --steps 20000    # a shorter budget per run
    python benchmarks/hil.py report           # rebuild the summary from collected runs
    python benchmarks/hil.py heldout          # rlpd, rlpd-oracle, rlpd-corrections on 3 fresh seeds
    python benchmarks/hil.py heldout report   # rebuild that summary from the committed runs
    python benchmarks/hil.py pixels           # from 64 px RGB on PickCube: RLPD with 20 demos, without
                                              # and with the scripted expert correcting (3 fresh seeds)
    python benchmarks/hil.py pixels report    # rebuild that summary from the committed runs
    python benchmarks/hil.py pickcube-state   # the pixel study's arms from privileged state (a check)
    python benchmarks/hil.py pickcube-state-serl  # the same with SERL's temperature, as tuning chose it
    python benchmarks/hil.py pickcube-state-serl --seeds 102 --arms state-serl-rlpd  # one run of it
    python benchmarks/hil.py tune pickcube-state  # settings tried on tuning seed 1 (TUNING_ARMS)
    python benchmarks/hil.py tune pickcube-state rlpd-serl-target-entropy  # one arm (or several)
    python benchmarks/hil.py tune pixels-serl views-stall-corrections  # HIL-SERL's views from pixels
    python benchmarks/hil.py tune pixels-dsrl  # DSRL over the built-in VLA SFT'd on the pixel demos
    python benchmarks/hil.py tune pixels-serl shifts-stall-corrections --procs  # actor and learner apart
    python benchmarks/hil.py speed            # a pixel arm's env steps/s, runtime=local against procs
    python benchmarks/hil.py speed report     # rebuild that summary from its JSON

`heldout` checks the intervention figures without changing the recipe (chosen on seed 1):
the three arms on training seeds 101-103. Their periodic evaluations draw episodes from the
run's own seed, so none of those episodes was looked at while choosing the settings; each
final policy is also evaluated on 100 episodes of the held-out evaluation seed, greedy and
sampled. Per-run records (curve, intervention share, held-out success, provenance) go to
results/runs/hil_heldout/, from which `heldout report` rebuilds results/hil_heldout.*."""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from harness import runtime_speed
from harness.flow_recipe import DSRL_LEARNER
from harness.handover import ANCHORED, ONLINE_TEMPERATURE, WSRL, calql_pretraining
from harness.intervention_study import Study, heldout, heldout_report
from harness.pushcube_sac import DEMOS, EXPERT, GOAL, RECIPE, ensure_expert, record_demos
from harness.reports import save_with_summary, write_report
from harness.runs import RESULTS, RUNS, load, train
from harness.stats import first_reaching, held_from
from harness.tuning import tune, tune_report

PRETRAIN = [f"algo.dataset={DEMOS}", *calql_pretraining(2_000)]
ARMS = {
    "hil-rlpd": [],
    "hil-rlpd-oracle": [
        f"operator.policy={EXPERT}",
        "operator.threshold=1.0",
        "operator.patience=3",
        "operator.release=10",
    ],
    "hil-rlpd-corrections": [
        f"operator.policy={EXPERT}",
        "operator.threshold=1.0",
        "operator.patience=5",
        "operator.max_takeover=5",
    ],
    "hil-wsrl": [*PRETRAIN, *WSRL],
    "hil-naive": [*PRETRAIN, "algo.retain_offline=false"],
}


def run_arms(names: list[str], steps: int, parallel: int) -> None:
    def one(name: str) -> None:
        started = time.time()
        train(name, [*RECIPE, *ARMS[name]], steps)
        print(f"[{name}] finished in {(time.time() - started) / 60:.0f} min", flush=True)

    with ThreadPoolExecutor(parallel) as pool:
        for future in [pool.submit(one, name) for name in names]:
            future.result()


def intervention_rate(name: str) -> float | None:
    """Share of collected steps the operator drove, from the run's own metrics."""
    path = RUNS / name / "metrics.jsonl"
    if not path.is_file():
        return None
    rates = [json.loads(line).get("replay/intervened") for line in path.read_text().splitlines()]
    rates = [r for r in rates if r is not None]
    return sum(rates) / len(rates) if rates else None


def report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {name: load(name) for name in ARMS}
    runs = {name: run for name, run in runs.items() if run}
    if not runs:  # a clone has no run records: the committed summary stays as it is
        raise SystemExit(
            f"no hil.py runs collected in {RESULTS / 'runs'}: nothing to report; results/hil.* left as they are"
        )
    summary: dict = {"task": "PushCube-v1", "goal": GOAL, "metric": "eval/success_rate", "runs": {}}
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    rows = []
    for name, run in runs.items():
        curve = [p for p in run["curve"] if "eval/success_rate" in p]
        reached = first_reaching(curve, "eval/success_rate", GOAL)
        held = held_from(curve, GOAL)
        final = curve[-1]["eval/success_rate"] if curve else None
        budget = run["curve"][-1]["env_steps"] if run["curve"] else 0
        rate = intervention_rate(name)
        summary["runs"][name] = {
            "env_steps_to_goal": reached,
            "held_from": held,
            "final_success": final,
            "env_steps": budget,
            "intervention_rate": rate,
            "wall_time_s": run.get("wall_time_s"),
            "overrides": ARMS[name],
        }
        ax.plot(
            [p["env_steps"] for p in curve], [p["eval/success_rate"] for p in curve], label=name.removeprefix("hil-")
        )
        rows.append(
            f"| {name.removeprefix('hil-')} | {f'{reached:,}' if reached else f'not within {budget:,}'} | "
            f"{f'{held:,}' if held else '-'} | {final:.2f} | {'-' if rate is None else f'{rate:.0%}'} | "
            f"{run.get('wall_time_s', 0) / 60:.0f} min |"
        )

    def ratio(slow: str, fast: str) -> str:
        """How many times fewer env steps `fast` needed to reach the goal than `slow`."""
        a, b = summary["runs"].get(slow), summary["runs"].get(fast)
        if not a or not b:
            return "n/a"
        reached_a, reached_b = a["env_steps_to_goal"], b["env_steps_to_goal"]
        if reached_a and reached_b:
            return f"{reached_a / reached_b:.1f}x"
        if reached_b:
            return f"> {a['env_steps'] / reached_b:.1f}x ({slow} did not reach the goal)"
        if reached_a:
            return f"< {reached_a / b['env_steps']:.1f}x ({fast} did not reach the goal; {slow} did at {reached_a:,})"
        return "neither reached the goal"

    summary["oracle_speedup"] = ratio("hil-rlpd", "hil-rlpd-oracle")
    summary["corrections_speedup"] = ratio("hil-rlpd", "hil-rlpd-corrections")
    summary["wsrl_speedup_over_naive"] = ratio("hil-naive", "hil-wsrl")
    ax.axhline(GOAL, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval success rate")
    ax.set_title("PushCube-v1 (state, CPU): RLPD / WSRL")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_with_summary(fig, RESULTS, "hil", summary)
    lines = [
        "# Human-in-the-loop benchmark: PushCube-v1",
        "",
        "Env steps until the deterministic policy succeeds in >= 90% of 16 fixed evaluation episodes "
        "(evaluated every 1,000 env steps). One seed per arm; 2-core CPU machine, two runs at a time. "
        "Every arm has ConRFT's behaviour-cloning term on demo and correction rows (`algo.bc_weight=1`); "
        "rlpd has no such rows, so for it the term never applies.",
        "",
        "| arm | env steps to 90% | at >= 90% from then on | final success | steps the operator drove | wall time |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        f"Interventions: rlpd -> rlpd-oracle {summary['oracle_speedup']}, rlpd -> rlpd-corrections "
        f"{summary['corrections_speedup']}. "
        f"WSRL over naive offline-to-online: {summary['wsrl_speedup_over_naive']}.",
        "",
        "![curves](hil.png)",
    ]
    write_report(RESULTS, "hil", lines)


# ---- held out: the intervention arms on fresh seeds, final policies on unseen episodes ----
HELDOUT_SEEDS = (101, 102, 103)

# From pixels (PickCube-v1, 64 px RGB; the real robot's case): 20 scripted demos in both arms,
# and in one of them the scripted expert, which reads privileged state, corrects at most 5
# steps at a time. Otherwise hil.py's recipe, unchanged: nothing was tuned on this task.
PIXEL_DEMOS = RUNS / "pixel-demos-20"
PICKCUBE = ["env=maniskill_pickcube", "env.control_mode=pd_ee_delta_pos"]
PIXEL_ENV = [*PICKCUBE, "env.obs_mode=rgb", "env.image_size=64"]
PIXEL_EVERY = 2_500  # env steps between periodic evaluations and checkpoints
# hil.py's recipe on PickCube, whatever the observations
PICKCUBE_RECIPE = [
    *(o for o in RECIPE if not o.startswith(("env=", "eval_every=", "checkpoint_every="))),
    f"eval_every={PIXEL_EVERY // 4}",
    f"checkpoint_every={PIXEL_EVERY // 4}",
]
PIXEL_COMMON = [*PIXEL_ENV, *PICKCUBE_RECIPE, f"algo.dataset={PIXEL_DEMOS}"]
PIXEL_ARMS = {
    "pixels-rlpd": [],
    "pixels-rlpd-corrections": [
        "operator.policy=scripted",
        "operator.threshold=1.0",
        "operator.patience=5",
        "operator.max_takeover=5",
    ],
}
# The same two arms from privileged state (20 state demos): whether the recipe learns PickCube
# at all, apart from the pixel path.
STATE_DEMOS = RUNS / "pickcube-state-demos-20"
MANY_STATE_DEMOS = RUNS / "pickcube-state-demos-200"
# the same 20 episodes' states and actions, rewarded as ManiSkill's sparse reward mode does (1 on success)
SPARSE = ["env.reward_mode=sparse"]
SPARSE_STATE_DEMOS = RUNS / "pickcube-state-demos-20-sparse"
STATE_COMMON = [*PICKCUBE, *PICKCUBE_RECIPE, f"algo.dataset={STATE_DEMOS}"]
# SERL and HIL-SERL's temperature: starts at 1e-2 (learned), no entropy term in the target
SERL_TEMPERATURE = ["algo.init_temperature=0.01", "algo.backup_entropy=false"]
# the scripted expert stepping in once an episode makes no progress for 10 steps, for 10 steps
STALL_CORRECTIONS = [
    "operator.policy=scripted",
    "operator.trigger=stall",
    "operator.patience=10",
    "operator.max_takeover=10",
]
# Cal-QL pretraining on the demos before online learning (wsrl.py's chosen 10k steps), the
# temperature restarted low at the hand-over
CALQL_PRETRAINING = [*calql_pretraining(10_000), ONLINE_TEMPERATURE]
# the stall operator's arm from that pretraining, handed over as wsrl.py's wsrl-anchored arm:
# 2,000 steps of the frozen policy, then the demos kept for the actor's BC term alone
STALL_WSRL_ANCHORED = [*STALL_CORRECTIONS, *calql_pretraining(10_000), *WSRL, *ANCHORED]
# the same operator with twice the critic updates per transition
STALL_CORRECTIONS_UTD4 = [*STALL_CORRECTIONS, "algo.utd_ratio=4"]
# HIL-SERL's views and features: a wrist camera beside the base camera (demos recorded with
# it), the frozen backbone's feature map before pooling read through 8 learned spatial
# embeddings per channel, and random shifts of every frame (4 shifted views cached per frame)
WRIST_PIXEL_DEMOS = RUNS / "pixel-demos-20-wristcam"
WRIST_CAMERA = ["env.robot=panda_wristcam"]
HIL_SERL_VIEWS = [
    *WRIST_CAMERA,
    "policy.image_features=spatial",
    "policy.spatial_embeddings=8",
    "algo.image_augmentation=cached_shifts",
    f"algo.dataset={WRIST_PIXEL_DEMOS}",
]

# The VLA route from the same cameras: the built-in VLA (policy=flow_vla: the same frozen
# EfficientNet-Lite0, a flow-matching action expert) SFT'd on the 20 pixel demos, then frozen while
# DSRL's actor picks each chunk's initial noise; sized as dsrl.py's state runs (gamma 0.9, as
# its tuning chose), 30k env steps as the goal asks
FLOW_VLA_SFT = RUNS / "flow-vla-pixel-sft"
FLOW_VLA = [*PIXEL_ENV, "policy=flow_vla"]
DSRL_PIXEL_COMMON = [
    *FLOW_VLA,
    "env.num_envs=4",
    "env.num_workers=0",
    *DSRL_LEARNER,
    "algo.gamma=0.9",
    f"eval_every={PIXEL_EVERY // 4}",
    "periodic_eval_episodes=16",
    f"checkpoint_every={PIXEL_EVERY // 4}",
    "runtime.torch_threads=1",
    "seed=1",
    f"init={FLOW_VLA_SFT}",
]


PIXELS = Study(
    "hil_pixels",
    "PickCube-v1 from 64 px RGB",
    PIXEL_COMMON,
    PIXEL_ARMS,
    50_000,
    PIXEL_EVERY,
    "hil.py's recipe (chosen on PushCube from state, seed 1; nothing tuned on this task), with 20 scripted "
    "demos in both arms, a frozen EfficientNet-Lite0 per camera, and the scripted expert (privileged state) "
    "as the operator",
    # PickCube's grasping physics depends on its history: an interrupted run continues with new episodes
    resume_with=("env_resume=fresh",),
    scripted_demos=(PIXEL_DEMOS, PIXEL_ENV),
)
PICKCUBE_STATE = Study(
    "hil_pickcube_state",
    "PickCube-v1 from state",
    STATE_COMMON,
    {arm.replace("pixels", "state"): overrides for arm, overrides in PIXEL_ARMS.items()},
    50_000,
    PIXEL_EVERY,
    "The pixel study's recipe and operator from privileged state, with 20 scripted state demos: whether "
    "the recipe learns PickCube at all, apart from the pixel path",
    resume_with=("env_resume=fresh",),
    scripted_demos=(STATE_DEMOS, PICKCUBE),
)
STUDIES = {
    "heldout": Study(
        "hil_heldout",
        "PushCube-v1",
        RECIPE,
        {arm: ARMS[arm] for arm in ("hil-rlpd", "hil-rlpd-oracle", "hil-rlpd-corrections")},
        20_000,
        1_000,
        "The recipe of [hil.md](hil.md), unchanged (its settings were chosen on seed 1)",
    ),
    "pixels": PIXELS,
    "pickcube-state": PICKCUBE_STATE,
    # The same two arms with what tuning on seed 1 chose (`hil.py tune pickcube-state`): SERL's
    # temperature, on demos recorded with `next.terminated`
    "pickcube-state-serl": replace(
        PICKCUBE_STATE,
        name="hil_pickcube_state_serl",
        task="PickCube-v1 from state, SERL's temperature",
        common=[*STATE_COMMON, *SERL_TEMPERATURE],
        arms={
            **{arm.replace("pixels", "state-serl"): overrides for arm, overrides in PIXEL_ARMS.items()},
            "state-serl-rlpd-stall-corrections": STALL_CORRECTIONS,
            # the stall operator with twice the critic updates per transition, as tuning on seed 1
            # chose it (0.88 final, last-five mean 0.85 against 0.81 and 0.71 without)
            "state-serl-rlpd-stall-corrections-utd4": STALL_CORRECTIONS_UTD4,
            # the stall arm from a Cal-QL policy pretrained on the demos, handed over as wsrl.py's
            # wsrl-anchored arm, as tuning on seed 1 chose it (TUNING_ARMS: rlpd-serl-stall-wsrl-anchored)
            "state-serl-stall-wsrl-anchored": STALL_WSRL_ANCHORED,
        },
        recipe="The pickcube-state study's recipe with SERL's temperature (1e-2 at the start, no entropy term in "
        "the target), as tuning on seed 1 chose it, and demos whose time-limited last frames are not terminal; "
        "the third arm's operator steps in when the episode stops making progress (`operator.trigger=stall`, "
        "10 steps without progress, 10 steps of driving), as tuning on seed 1 chose it",
    ),
    # The pixel study with what the state study's tuning chose: SERL's temperature and the stall
    # operator; its tuning arms add HIL-SERL's views and features (TUNING_ARMS["pixels-serl"])
    "pixels-serl": replace(
        PIXELS,
        name="hil_pixels_serl",
        task="PickCube-v1 from 64 px RGB, SERL's temperature",
        common=[*PIXEL_COMMON, *SERL_TEMPERATURE],
        arms={"pixels-serl-rlpd": [], "pixels-serl-rlpd-stall-corrections": STALL_CORRECTIONS},
        recipe="The pixel study's recipe with SERL's temperature (1e-2 at the start, no entropy term in the target) "
        "and, in the second arm, the stall operator, as tuning the state study on seed 1 chose them",
    ),
    "pixels-dsrl": Study(
        "hil_pixels_dsrl",
        "PickCube-v1 from 64 px RGB, DSRL over the built-in VLA",
        DSRL_PIXEL_COMMON,
        {"pixels-dsrl": [], "pixels-dsrl-stall-corrections": STALL_CORRECTIONS},
        30_000,
        PIXEL_EVERY,
        "The built-in VLA (policy=flow_vla) SFT'd for 3,000 steps on the pixel study's 20 demos, frozen; DSRL's "
        "actor picks each chunk's initial noise (dsrl.py's settings: gamma 0.9, 128-wide networks, UTD 2); the "
        "second arm's stall operator's corrections become the noise whose chunk they are",
        resume_with=("env_resume=fresh",),
        scripted_demos=(PIXEL_DEMOS, PIXEL_ENV),
        sft=(FLOW_VLA_SFT, 3_000, [*FLOW_VLA, f"dataset={PIXEL_DEMOS}"]),
    ),
}

# Tuning on seed 1 (its periodic evaluations only; the held-out seed stays unseen): each arm is
# the study's plain arm with these overrides added (harness.tuning).
TUNING_ARMS = {
    "pickcube-state": {
        "rlpd": [],
        # SERL and HIL-SERL's temperature: starts at 1e-2 (learned), no entropy term in the target
        "rlpd-serl-temperature": SERL_TEMPERATURE,
        # HIL-SERL's discount on top of its temperature
        "rlpd-serl-gamma": [*SERL_TEMPERATURE, "algo.gamma=0.97"],
        # HIL-SERL's two critics, and twice the critic updates per transition for the same cost
        "rlpd-serl-utd4": [
            *SERL_TEMPERATURE,
            "algo.gamma=0.97",
            "algo.num_critics=2",
            "algo.utd_ratio=4",
        ],
        # ManiSkill's RLPD regime has many demos (1000): whether 20 are what holds the recipe back
        "rlpd-serl-200-demos": [
            *SERL_TEMPERATURE,
            f"algo.dataset={MANY_STATE_DEMOS}",
        ],
        # SERL's critic-actor ratio (8 in its PickCube runs): the actor steps once per 4 transitions
        "rlpd-serl-actor-every-8": [*SERL_TEMPERATURE, "algo.actor_every=8"],
        # less exploration noise: the sampled policy succeeds in at most a fifth of its training
        # episodes while the greedy one reaches 0.5-0.75 (the default target is -|A|/2 = -2)
        "rlpd-serl-target-entropy": [
            *SERL_TEMPERATURE,
            "algo.target_entropy=-4",
        ],
        # only the critic updates per transition change (ten critics, gamma 0.9): about 1.6x the time
        "rlpd-serl-utd4-ten-critics": [*SERL_TEMPERATURE, "algo.utd_ratio=4"],
        # rlpd-serl-temperature again on demos recorded since 8b5db77 (`next.terminated`): a demo
        # that succeeded and ran on to its time limit no longer ends in a terminal frame
        "rlpd-serl-time-limit-demos": SERL_TEMPERATURE,
        # SERL's temperature with the study's corrections (the scripted expert drives at most 5
        # steps at a time): HIL-SERL's answer to 20 demos, where ManiSkill's RLPD baseline has 1,000
        "rlpd-serl-corrections": [
            *SERL_TEMPERATURE,
            *PIXEL_ARMS["pixels-rlpd-corrections"],
        ],
        # HIL-SERL's grasp critic: the gripper closes or opens by its own Q-values, without
        # exploration noise (the sampled policy drops the cube far more often than the greedy one)
        "rlpd-serl-discrete-gripper": [*SERL_TEMPERATURE, "policy.gripper_commands=[-1.0,1.0]"],
        # the corrections arm without ConRFT's BC term: held out on seed 101 the corrections (18%
        # of steps, ~9k offline rows by the end) kept the actor's BC loss at 0.14 over the second
        # half of the run against the plain arm's 0.03, and its greedy success at 0.09 against
        # 0.62; HIL-SERL itself has no BC term
        "rlpd-serl-no-bc-corrections": [
            *SERL_TEMPERATURE,
            *PIXEL_ARMS["pixels-rlpd-corrections"],
            "algo.bc_weight=0",
        ],
        # HIL-SERL's and ManiSkill's RLPD reward: success alone (1 on every successful step) instead
        # of ManiSkill's normalised dense reward, with demos recorded under it
        "rlpd-serl-sparse-reward": [*SERL_TEMPERATURE, *SPARSE, f"algo.dataset={SPARSE_STATE_DEMOS}"],
        # the drift rule kept the expert driving 37-45% of the steps all run long (no-bc-corrections);
        # this operator steps in only when the episode stops making headway, for 10 steps at a time
        "rlpd-serl-stall-corrections": [*SERL_TEMPERATURE, *STALL_CORRECTIONS],
        # held out the stall operator's policies reach 0.81 greedy but 0.45 sampled, and still
        # climb at 50k: twice the critic updates per transition, or the gripper by its own
        # Q-values (no exploration noise on the grasp), on top of it
        "rlpd-serl-stall-utd4": [*SERL_TEMPERATURE, *STALL_CORRECTIONS_UTD4],
        "rlpd-serl-stall-discrete-gripper": [
            *SERL_TEMPERATURE,
            *STALL_CORRECTIONS,
            "policy.gripper_commands=[-1.0,1.0]",
        ],
        # the stall arm starting from a Cal-QL policy pretrained on the 20 demos (wsrl.py's
        # pretraining: 10k steps, alpha 5), with the temperature restarted at 0.01 where online
        # learning starts, as wsrl.py's collapse study found it must be; RLPD's 50/50 batches go on
        "rlpd-serl-stall-calql": [*SERL_TEMPERATURE, *STALL_CORRECTIONS, *CALQL_PRETRAINING],
        # the same hand-over as wsrl.py's wsrl-anchored arm (0.98 held out on PushCube): 2,000
        # steps of the frozen policy, then the demos kept for the actor's BC term alone
        "rlpd-serl-stall-wsrl-anchored": [*SERL_TEMPERATURE, *STALL_WSRL_ANCHORED],
    },
    "pixels-serl": {
        "rlpd": [],
        "stall-corrections": STALL_CORRECTIONS,
        # random shifts alone (4 shifted views cached per frame), on the base camera's pooled
        # features: stall-corrections fit the demos as closely as the state arms did (BC loss
        # 0.14-0.16 against 0.18-0.21) yet its greedy policy hardly ever succeeded, the mark of an
        # actor that memorises 20 demos' frames, which HIL-SERL's random crops are there to prevent
        "shifts-stall-corrections": ["algo.image_augmentation=cached_shifts", *STALL_CORRECTIONS],
        # HIL-SERL's wrist camera, spatial embeddings and random shifts, without and with the operator
        "views": HIL_SERL_VIEWS,
        "views-stall-corrections": [*HIL_SERL_VIEWS, *STALL_CORRECTIONS],
        # the wrist camera alone (the goal is in the state): about two thirds of the learner's
        # cost of both cameras (benchmarks/sac_learner.py)
        "wrist-view-stall-corrections": [*HIL_SERL_VIEWS, "policy.cameras=[hand_camera]", *STALL_CORRECTIONS],
        # what took the state study to 1.00 on seed 1 (rlpd-serl-stall-wsrl-anchored): the stall
        # operator's arm from a Cal-QL policy pretrained on the demos, handed over as WSRL's anchored
        # arm; on the random shifts' arm and on HIL-SERL's views
        "shifts-wsrl-anchored-stall-corrections": ["algo.image_augmentation=cached_shifts", *STALL_WSRL_ANCHORED],
        "views-wsrl-anchored-stall-corrections": [*HIL_SERL_VIEWS, *STALL_WSRL_ANCHORED],
        # HIL-SERL's actor reads the critics' image encoder with its gradient stopped: the critics'
        # TD loss alone shapes the projection, so the actor's BC and Q terms cannot fit it to the 20
        # demos' frames (here each of actor and critics trains a projection of its own)
        "shifts-critics-projection-wsrl-anchored-stall-corrections": [
            "algo.image_augmentation=cached_shifts",
            "algo.actor_projection=critics",
            *STALL_WSRL_ANCHORED,
        ],
        # the best pixel arm so far (shifts-stall-corrections, 0.25) without ConRFT's BC term, as
        # HIL-SERL trains: the pretrained arm's actor fitted the demos' frames to a BC loss of 0.008
        # and failed off them; here demos and corrections reach the actor through the critics alone
        "shifts-no-bc-stall-corrections": [
            "algo.image_augmentation=cached_shifts",
            *STALL_CORRECTIONS,
            "algo.bc_weight=0",
        ],
        # the same wiring on the best pixel arm so far (shifts-stall-corrections, 0.25): one change
        "shifts-critics-projection-stall-corrections": [
            "algo.image_augmentation=cached_shifts",
            "algo.actor_projection=critics",
            *STALL_CORRECTIONS,
        ],
    },
    "pixels-dsrl": {"dsrl": [], "dsrl-stall-corrections": STALL_CORRECTIONS},
}
# demo sets some tuning arms use beside their study's own: folder -> (env overrides, episodes)
TUNING_DEMOS = {
    MANY_STATE_DEMOS: (PICKCUBE, 200),
    SPARSE_STATE_DEMOS: ([*PICKCUBE, *SPARSE], 20),
    WRIST_PIXEL_DEMOS: ([*PIXEL_ENV, *WRIST_CAMERA], 20),
}


# `speed`: the best pixel arm so far, timed under runtime=local and runtime=procs (harness.runtime_speed)
SPEED_ARM = "shifts-stall-corrections"
SPEED = "hil_speed"
SPEED_SETTING = "PickCube-v1 from 64 px, hil.py tune pixels-serl, 4 envs"


def speed(arms: list[str], steps: int, rounds: int, then: list[str]) -> None:
    if then == ["report"]:
        result = json.loads((RESULTS / f"{SPEED}.json").read_text())
    else:
        arm = arms[0] if arms else SPEED_ARM
        STUDIES["pixels-serl"].prepare()  # the 20 scripted pixel demos, recorded once
        overrides = [*STUDIES["pixels-serl"].common, *TUNING_ARMS["pixels-serl"][arm]]
        result = runtime_speed.measure("hil.py speed", arm, overrides, steps, rounds)
        (RESULTS / f"{SPEED}.json").write_text(json.dumps(result, indent=2))
    runtime_speed.report(result, RESULTS, SPEED, SPEED_SETTING)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="run", choices=("run", "report", "tune", "speed", *STUDIES))
    parser.add_argument(
        "then", nargs="*", help="after a study: report (only rebuild its summary); tune: the study, then report or arms"
    )
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per arm (run)")
    parser.add_argument("--demos", type=int, default=20, help="expert episodes to record")
    parser.add_argument("--only", nargs="*", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="*", default=HELDOUT_SEEDS, help="a study: these seeds only")
    parser.add_argument("--arms", nargs="*", default=[], help="a study: these of its arms only (default: all)")
    parser.add_argument("--speed-steps", type=int, default=1600, help="speed: env steps per timed run")
    parser.add_argument("--rounds", type=int, default=2, help="speed: turns of each runtime")
    parser.add_argument(
        "--procs",
        action="store_true",
        help="tune: actor and learner in two processes (runtime=procs, policy lag 1; 1.2x local in `speed`)",
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HOME", str(RUNS / "hf-cache"))
    if args.command == "speed":
        # the arms on the study's own demos (the wrist-camera arms record theirs in `tune`)
        pixel_arms = TUNING_ARMS["pixels-serl"]
        timed = [arm for arm, extra in pixel_arms.items() if not any(o.startswith("algo.dataset=") for o in extra)]
        if set(args.arms) - set(timed) or len(args.arms) > 1:
            parser.error(f"speed times one arm of: {', '.join(timed)}")
        speed(args.arms, args.speed_steps, args.rounds, args.then)
        return
    if args.command == "tune":
        key, *then = args.then or [""]
        if key not in TUNING_ARMS:
            parser.error(f"tune takes a study with tuning arms: {', '.join(TUNING_ARMS)}")
        unknown = sorted(set(then) - {"report", *TUNING_ARMS[key]})
        if unknown:
            parser.error(f"{key} has no tuning arm {', '.join(unknown)}; its arms: {', '.join(TUNING_ARMS[key])}")
        if then != ["report"]:
            runtime = runtime_speed.RUNTIMES["procs, lag 1"] if args.procs else []
            arms = [arm for arm in then if arm != "report"]
            tune(STUDIES[key], TUNING_ARMS[key], args.parallel, arms, TUNING_DEMOS, runtime)
        tune_report(STUDIES[key], key)
        return
    if args.command in STUDIES:
        study = STUDIES[args.command]
        if args.then and args.then != ["report"]:
            parser.error(f"after a study only 'report' may follow, got {' '.join(args.then)}")
        unknown = sorted(set(args.arms) - set(study.arms))
        if unknown:
            parser.error(f"{args.command} has no arm {', '.join(unknown)}; its arms: {', '.join(study.arms)}")
        if args.then != ["report"]:
            heldout(study, args.parallel, tuple(args.seeds), tuple(args.arms))
        heldout_report(study, args.command)
        return
    if args.command == "run":
        ensure_expert()
        if any(f"algo.dataset={DEMOS}" in ARMS[name] for name in args.only):
            record_demos(args.demos)
        run_arms(args.only, args.steps, args.parallel)
    report()


if __name__ == "__main__":
    main()
