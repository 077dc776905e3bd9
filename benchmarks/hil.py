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
drives the simulated robot through `embodied robot ... record.root=...`.

    python benchmarks/hil.py                  # everything, two runs at a time
    python benchmarks/hil.py --steps 20000    # a shorter budget per run
    python benchmarks/hil.py report           # rebuild the summary from collected runs"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plots import save_with_summary  # noqa: E402
from ppo import RESULTS, RUNS, first_reaching, load  # noqa: E402
from ppo import train as train_run  # noqa: E402

EXPERT = RUNS / "pushcube-s1"
DEMOS = RUNS / "hil-demos"
GOAL = 0.9
# Networks and batches sized for a CPU core per run (RLPD's own are 256 wide, batch 256).
COMMON = [
    "env=maniskill_pushcube",
    "env.num_envs=4",
    "env.num_workers=0",
    "policy=squashed_gaussian",
    "policy.hidden=[128,128]",
    "algo=sac_rlpd",
    "algo.critic_hidden=[128,128]",
    "algo.batch_size=128",
    "algo.gamma=0.9",
    "algo.utd_ratio=2",
    "eval_every=250",
    "periodic_eval_episodes=16",
    "checkpoint_every=250",
    "runtime.torch_threads=1",
    "seed=1",
    "algo.bc_weight=1.0",
]
PRETRAIN = [f"algo.demos={DEMOS}", "algo.offline_pretrain_steps=2000", "algo.calql_alpha=5"]
ARMS = {
    "hil-rlpd": [],
    "hil-rlpd-oracle": [
        f"intervention.expert={EXPERT}",
        "intervention.threshold=1.0",
        "intervention.patience=3",
        "intervention.release=10",
    ],
    "hil-rlpd-corrections": [
        f"intervention.expert={EXPERT}",
        "intervention.threshold=1.0",
        "intervention.patience=5",
        "intervention.max_takeover=5",
    ],
    "hil-wsrl": [*PRETRAIN, "algo.warmup_steps=2000", "algo.retain_offline=false"],
    "hil-naive": [*PRETRAIN, "algo.retain_offline=false"],
}


def ensure_expert() -> None:
    if not (EXPERT / "checkpoints" / "latest").is_file():
        train_run(EXPERT.name, ["env=maniskill_pushcube", "seed=1"], 300_000)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def record_demos(episodes: int) -> None:
    """The expert, served, drives the simulated robot while the client records."""
    if (DEMOS / "meta" / "info.json").is_file():
        return
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "embodied.cli", "serve", f"checkpoint={EXPERT}", f"endpoint={endpoint}", "device=cpu"]
    )
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "embodied.cli",
                "robot",
                "robot=sim",
                f"robot.env_from={EXPERT}",
                f"server={endpoint}",
                f"episodes={episodes}",
                "control_hz=50",
                f"record.root={DEMOS}",
                f"output={RUNS / 'hil-demos-client'}",
            ],
            check=True,
            stdin=subprocess.DEVNULL,
            timeout=1800,
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    summary = json.loads((RUNS / "hil-demos-client" / "summary.json").read_text())
    print(f"demos: {len(summary['episodes'])} episodes, expert success {summary['success_rate']:.2f}")


def run_arms(names: list[str], steps: int, parallel: int) -> None:
    def one(name: str) -> None:
        started = time.time()
        train_run(name, [*COMMON, *ARMS[name]], steps)
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


def held_from(curve: list[dict], threshold: float) -> int | None:
    """The first evaluation from which success never fell below `threshold` again."""
    held = None
    for point in curve:
        if point["eval/success_rate"] < threshold:
            held = None
        elif held is None:
            held = point["env_steps"]
    return held


def report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {name: load(name) for name in ARMS}
    runs = {name: run for name, run in runs.items() if run}
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
    (RESULTS / "hil.md").write_text("\n".join(lines) + "\n")
    print((RESULTS / "hil.md").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="run", choices=("run", "report"))
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per arm")
    parser.add_argument("--demos", type=int, default=20, help="expert episodes to record")
    parser.add_argument("--only", nargs="*", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("HF_HOME", str(RUNS / "hf-cache"))
    if args.command == "run":
        ensure_expert()
        if any(f"algo.demos={DEMOS}" in ARMS[name] for name in args.only):
            record_demos(args.demos)
        run_arms(args.only, args.steps, args.parallel)
    report()


if __name__ == "__main__":
    main()
