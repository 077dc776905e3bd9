"""Inference latency on the robot: a chunked flow policy served to simulated robots whose answers
arrive d ticks late, executed synchronously, asynchronously, by temporal ensembling and by
real-time chunking (RTC).

    python benchmarks/latency.py [--quick] [--seeds 101 102 103] [--delays 0 1 2 4 8]
    python benchmarks/latency.py --report        # rebuild latency.md and latency.png
    python benchmarks/latency.py --seeds 1 --delays 0 4 --results /tmp/tuning   # settings, on seed 1

1. demos   `embodied demos`: scripted-expert episodes of the task (end-effector delta control)
2. sft     `embodied sft` of the flow policy (16 actions executed per chunk, 16 predicted), one
           run per seed
3. delays  per seed: `embodied serve checkpoint=<sft run>`, and for each delay and mode
           `embodied robot robot=sim robot.env_from=<sft run> inject_delay_ticks=<d>` as several
           robot clients at once (the server batches them), on held-out episode seeds
           (never seen by the demos or the SFT runs' own evaluation):
             sync      the next chunk is asked for when the current one ends
                       (`broker.execute_steps=16`); until it is taken the robot stands still
                       (the simulator is not stepped) while the ticks go by, then executes
                       it from its first action
             async     asked for half way (`execute_steps=8`); the robot executes the rest of
                       the current chunk meanwhile and switches when the answer is taken,
                       skipping its first d actions
             ensemble  ACT's temporal ensembling (`broker.mode=ensemble`, a query as soon as the
                       last answer is in: one request is in flight at a time, so a new chunk
                       every max(d, 1) ticks)
             rtc       async with `broker.realtime=true`: the query carries the pending actions
                       and the expected delay, and the server's flow samples the next chunk by
                       guided inpainting to agree with them
   A tick's answer is never taken before `inject_delay_ticks` ticks after its query (the
   simulated inference delay); the server's real answer takes well under a tick here. While a
   chunk is executing, an answer is taken at the next tick at the earliest, so at d = 0 the
   modes other than sync hand over one tick after their query: each cell records the mean
   handoff (ticks from a query to its chunk taking over) beside d.

Measured per (seed, delay, mode): success over the held-out episodes, and the boundary jump:
the mean L2 change of the executed action at the ticks where a new chunk takes over, beside the
mean change between consecutive actions within a chunk.

Each (seed, delay, mode) cell is kept as a compact record under results/latency/ as soon as it
is measured (a rerun skips the cells recorded with the same settings), so the report can be
rebuilt (`--report`) from committed data; `--recount` measures the recorded cells again from the
robot clients' logs under benchmarks/runs/latency/ (after a change to what a cell measures).
`--quick`: one seed, 2 delays, 8 episodes (a smoke run, written to a temporary folder)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.commands import embodied, sft_or_resume
from harness.pushcube_sac import free_port
from harness.reports import provenance, provenance_line
from harness.runs import RESULTS, RUNS

NAME = "latency"
ENV = ["env=maniskill_pushcube", "env.control_mode=pd_ee_delta_pos"]
CHUNK = 16
POLICY = ["policy=flow", f"policy.chunk_size={CHUNK}", f"policy.horizon={CHUNK}"]
DEMO_EPISODES, SFT_STEPS = 100, 3000
SEEDS = (101, 102, 103)
DELAYS = (0, 1, 2, 4, 8)
MODES = {
    "sync": [f"broker.execute_steps={CHUNK}"],
    "async": [f"broker.execute_steps={CHUNK // 2}"],
    "ensemble": ["broker.mode=ensemble", "broker.execute_steps=1"],
    "rtc": [f"broker.execute_steps={CHUNK // 2}", "broker.realtime=true"],
}
EPISODES, CLIENTS = 100, 4  # held-out episodes per cell, spread over this many robot clients at once
HELDOUT_SEED = 50_000  # client k's episode i resets with seed HELDOUT_SEED + k * (EPISODES // CLIENTS) + i
CONTROL_HZ = 40  # fast enough to finish, slow enough for four simulated robots and the server on 2 cores


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a cell's record must match to be reused."""
    return {
        "env": ENV,
        "policy": POLICY,
        "demos": args.demos,
        "sft_steps": args.sft_steps,
        "episodes": args.episodes,
        "clients": CLIENTS,
        "control_hz": CONTROL_HZ,
        "heldout_seed": HELDOUT_SEED,
    }


# ---- demos and SFT ----------------------------------------------------------------------------
def sft_runs(runs: Path, args: argparse.Namespace) -> dict[int, Path]:
    demos = runs / "demos"
    if not (demos / "meta" / "info.json").is_file():
        embodied("demos", *ENV, f"episodes={args.demos}", f"dataset={demos}", "progress_bar=false")
    trained = {}
    for seed in args.seeds:
        trained[seed] = runs / f"sft-{seed}"
        sft_or_resume(trained[seed], args.sft_steps, [*ENV, *POLICY, f"dataset={demos}", f"seed={seed}"])
    return trained


# ---- one cell: a server's policy at one delay and mode ------------------------------------------
class Server:
    """`embodied serve` of a run, until closed."""

    def __init__(self, run: Path):
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        command = [sys.executable, "-m", "embodied.cli", "serve", f"checkpoint={run}", f"endpoint={self.endpoint}"]
        self.process = subprocess.Popen(
            [*command, "stats_every_s=0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        seen = []
        line = self.process.stdout.readline()
        while line and not line.startswith("serving"):
            seen.append(line)
            line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the server did not start:\n{''.join(seen[-30:])}")
        # its later log lines are read and dropped, so a full pipe never blocks the server
        threading.Thread(target=self.process.stdout.read, daemon=True).start()

    def close(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def drive(run: Path, server: str, delay: int, mode: str, episodes: int, output: Path) -> list[Path]:
    """The robot clients of one cell, side by side; their output folders."""
    per_client = max(1, episodes // CLIENTS)
    outputs, processes = [], []
    for k in range(min(CLIENTS, episodes)):
        out = output / f"client{k}"
        outputs.append(out)
        command = [
            sys.executable,
            "-m",
            "embodied.cli",
            "robot",
            "robot=sim",
            f"robot.env_from={run}",
            f"server={server}",
            f"episodes={per_client}",
            f"seed={HELDOUT_SEED + k * per_client}",
            f"control_hz={CONTROL_HZ}",
            f"inject_delay_ticks={delay}",
            f"client_name=robot{k}",
            f"output={out}",
            *MODES[mode],
        ]
        processes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    failed = []
    try:
        for process in processes:
            log, _ = process.communicate(timeout=1800)
            if process.returncode != 0:
                failed.append(log[-3000:])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    if failed:
        raise RuntimeError("a robot client failed:\n" + "\n".join(failed))
    return outputs


def measure_cell(outputs: list[Path]) -> dict[str, Any]:
    """Success and action continuity from the clients' summary.json and steps.jsonl."""
    successes, boundary, within, handoffs, overruns, skipped, round_trips = [], [], [], [], 0, 0, []
    for out in outputs:
        summary = json.loads((out / "summary.json").read_text())
        successes += [bool(e["success"]) for e in summary["episodes"]]
        overruns += summary["overrun_ticks"]
        skipped += summary["skipped_actions"]
        round_trips.append(summary["round_trip_ms"].get("p50", float("nan")))
        previous: dict[str, Any] | None = None
        for line in (out / "steps.jsonl").read_text().splitlines():
            step = json.loads(line)
            if "handoff_ticks" in step:
                handoffs.append(step["handoff_ticks"])
            if step.get("source") != "policy" or "executed_action" not in step:
                continue  # a tick without a command (sync waiting): the robot's last one stands
            if previous is not None and previous["episode"] == step["episode"]:
                change = float(np.linalg.norm(np.subtract(step["executed_action"], previous["executed_action"])))
                (boundary if "handoff_ticks" in step else within).append(change)
            previous = step
    return {
        "episodes": len(successes),
        "success": float(np.mean(successes)),
        "successes": int(np.sum(successes)),
        "boundary_jump": float(np.mean(boundary)) if boundary else None,
        "boundaries": len(boundary),
        "within_chunk_change": float(np.mean(within)) if within else None,
        "handoff_ticks": float(np.mean(handoffs)) if handoffs else None,
        "overrun_ticks": overruns,
        "skipped_actions": skipped,
        "round_trip_p50_ms": float(np.nanmedian(round_trips)),
    }


def cell_path(results: Path, seed: int, delay: int, mode: str) -> Path:
    return results / NAME / f"seed{seed}" / f"{mode}-d{delay}.json"


def recorded(path: Path, wanted: dict[str, Any]) -> bool:
    """Whether the cell at `path` was measured with the `wanted` settings."""
    return path.is_file() and json.loads(path.read_text())["settings"] == wanted


def write_cell(path: Path, record: dict[str, Any]) -> None:
    """The cell's record, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(record, indent=1))
    os.replace(temporary, path)


def measure_seed(seed: int, run: Path, work: Path, results: Path, args: argparse.Namespace) -> None:
    wanted = settings(args)
    todo = [(d, m) for d in args.delays for m in MODES if not recorded(cell_path(results, seed, d, m), wanted)]
    if not todo:
        return
    server = Server(run)
    try:
        for delay, mode in todo:
            started = time.perf_counter()
            output = work / f"seed{seed}" / f"{mode}-d{delay}"
            shutil.rmtree(output, ignore_errors=True)  # a cell cut short before
            cell = measure_cell(drive(run, server.endpoint, delay, mode, args.episodes, output))
            record = {"seed": seed, "delay": delay, "mode": mode, **cell, "settings": wanted}
            record["wall_s"] = time.perf_counter() - started
            write_cell(cell_path(results, seed, delay, mode), record)
            print(
                f"seed {seed}, delay {delay}, {mode}: success {cell['success']:.2f}, boundary jump "
                f"{cell['boundary_jump'] or 0:.3f}, within {cell['within_chunk_change'] or 0:.3f}, "
                f"{record['wall_s']:.0f} s",
                flush=True,
            )
    finally:
        server.close()


def recount(results: Path, work: Path, wanted: dict[str, Any]) -> None:
    """Each recorded cell measured again from its robot clients' logs (settings, seed and wall
    time kept)."""
    for cell in load_cells(results, wanted):
        mode, delay, seed = cell["mode"], cell["delay"], cell["seed"]
        outputs = sorted((work / f"seed{seed}" / f"{mode}-d{delay}").glob("client*"))
        if not outputs:
            raise SystemExit(f"no robot logs for seed {seed}, {mode}, d={delay} under {work}: nothing to recount")
        write_cell(cell_path(results, seed, delay, mode), {**cell, **measure_cell(outputs)})


# ---- report ---------------------------------------------------------------------------------------
def load_cells(results: Path, wanted: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The cell records, those measured with `wanted` settings only where given."""
    cells = [json.loads(path.read_text()) for path in sorted((results / NAME).glob("seed*/*.json"))]
    return [cell for cell in cells if wanted is None or cell["settings"] == wanted]


def table(cells: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """mode -> delay -> {success: mean and per seed, jump: mean}."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for mode in MODES:
        for delay in sorted({c["delay"] for c in cells}):
            here = sorted((c for c in cells if c["mode"] == mode and c["delay"] == delay), key=lambda c: c["seed"])
            if not here:
                continue
            jumps = [c["boundary_jump"] for c in here if c["boundary_jump"] is not None]
            handoffs = [c["handoff_ticks"] for c in here if c.get("handoff_ticks") is not None]
            within = [c["within_chunk_change"] for c in here if c["within_chunk_change"] is not None]
            out.setdefault(mode, {})[delay] = {
                "success": float(np.mean([c["success"] for c in here])),
                "per_seed": {c["seed"]: c["success"] for c in here},
                "boundary_jump": float(np.mean(jumps)) if jumps else None,
                "within_chunk_change": float(np.mean(within)) if within else None,
                "handoff_ticks": float(np.mean(handoffs)) if handoffs else None,
                "overrun_ticks": int(sum(c["overrun_ticks"] for c in here)),
            }
    return out


def goals(summary: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    rtc, asynchronous = summary.get("rtc", {}), summary.get("async", {})
    if 0 not in rtc or 4 not in rtc or 4 not in asynchronous:
        return {}
    jump_rtc, jump_async = rtc[4]["boundary_jump"], asynchronous[4]["boundary_jump"]
    return {
        "rtc_flat": {
            "value": rtc[4]["success"] - rtc[0]["success"],
            "goal": "RTC's success at 4 ticks within 5 points of its success at 0",
            "met": rtc[4]["success"] >= rtc[0]["success"] - 0.05,
        },
        "rtc_over_async": {
            "value": rtc[4]["success"] - asynchronous[4]["success"],
            "goal": ">= 10 points above asynchronous chunking at 4 ticks",
            "met": rtc[4]["success"] >= asynchronous[4]["success"] + 0.10,
        },
        "rtc_jump": {
            "value": None if not jump_async or jump_rtc is None else jump_rtc / jump_async,
            "goal": "boundary jump at 4 ticks <= half of asynchronous chunking's",
            "met": bool(jump_async) and jump_rtc is not None and jump_rtc <= 0.5 * jump_async,
        },
    }


def success_text(point: dict[str, Any]) -> str:
    per_seed = ", ".join(f"{v:.2f}" for v in point["per_seed"].values())
    return f"{point['success']:.2f} ({per_seed})"


def jump_text(point: dict[str, Any]) -> str:
    if point["boundary_jump"] is None:
        return ""
    inside = point["within_chunk_change"]
    return f"{point['boundary_jump']:.3f} ({'-' if inside is None else f'{inside:.3f}'})"


def handoff_text(point: dict[str, Any]) -> str:
    return "" if point.get("handoff_ticks") is None else f"{point['handoff_ticks']:.2f}"


def mode_table(title: str, summary: dict[str, dict[int, dict[str, Any]]], delays: list[int], text: Any) -> list[str]:
    """A Markdown section: a row per mode, a column per delay, each cell `text(point)`."""
    lines = [
        "",
        f"## {title}",
        "",
        "| mode | " + " | ".join(f"d={d}" for d in delays) + " |",
        "| --- | " + " | ".join("---:" for _ in delays) + " |",
    ]
    for mode, row in summary.items():
        lines.append(f"| {mode} | " + " | ".join("" if d not in row else text(row[d]) for d in delays) + " |")
    return lines


def write_report(results: Path, record: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """latency.md, latency.json and latency.png from the cells measured with `wanted` settings."""
    cells = load_cells(results, wanted)
    summary = table(cells)
    reached = goals(summary)
    seeds = sorted({c["seed"] for c in cells})
    delays = sorted({c["delay"] for c in cells})
    setup = wanted
    lines = [
        "# Inference latency on the robot: sync, async, temporal ensembling and real-time chunking",
        "",
        provenance_line(record)
        + (
            f" Cells measured again from the robot clients' logs at {record['recounted']['commit']} "
            f"(`{record['recounted']['command']}`)."
            if "recounted" in record
            else ""
        ),
        "",
        f"A flow policy ({CHUNK} actions executed per chunk) SFT'd on {setup.get('demos')} scripted demos of "
        f"{' '.join(setup.get('env', []))} ({setup.get('sft_steps')} steps; seeds {', '.join(map(str, seeds))}), "
        f"served by `embodied serve` to {setup.get('clients')} simulated robots at once (`embodied robot "
        f"robot=sim`, {setup.get('control_hz')} Hz), each answer taken no earlier than d ticks after its query "
        f"(`inject_delay_ticks`). {setup.get('episodes')} held-out episodes per seed and cell (reset seeds from "
        f"{setup.get('heldout_seed')}). Success: the mean over the seeds; per seed in brackets. Boundary jump: the "
        "mean L2 change of the executed action where a new chunk takes over; within: between consecutive "
        "actions of one chunk. Sync stands still while it waits (its simulator is not stepped), then executes "
        "the chunk from its first action; its waiting ticks count against the episode's limit. The client "
        "keeps one request in flight, so ensembling gets a new chunk every max(d, 1) ticks, and while a chunk "
        "executes an answer is taken at the next tick at the earliest: at d = 0 the modes but sync hand over "
        "one tick after their query (the handoff table).",
    ]
    lines += mode_table("Success", summary, delays, success_text)
    lines += mode_table("Boundary jump (within a chunk)", summary, delays, jump_text)
    lines += mode_table("Handoff (mean ticks from a query to its chunk taking over)", summary, delays, handoff_text)
    overruns = sum(c["overrun_ticks"] for c in cells)
    lines += [
        "",
        f"Ticks the clients fell behind and skipped (`overrun_ticks`), all cells: {overruns}.",
        "",
        "## Goals",
        "",
    ]
    if not reached:
        lines.append("- Not evaluated: the cells for RTC at d=0 and d=4 and async at d=4 are not all measured.")
    for name, goal in reached.items():
        if goal["value"] is None:
            value = "n/a"
        else:  # the jump's is a ratio, the others differences in success
            value = f"{goal['value']:.2f}x" if name == "rtc_jump" else f"{goal['value']:+.2f}"
        lines.append(f"- {goal['goal']}: {value}: **{'met' if goal['met'] else 'not met'}**.")
    lines.append(
        "- Training with a simulated delay closing half of the remaining gap: **not measured** "
        "(`env.latency` trains under delay; RTC is not yet used in training rollouts)."
    )
    (results / f"{NAME}.md").write_text("\n".join(lines) + f"\n\n![latency]({NAME}.png)\n")
    (results / f"{NAME}.json").write_text(
        json.dumps(
            {
                **record,
                "settings": wanted,
                "summary": {m: {str(d): v for d, v in r.items()} for m, r in summary.items()},
                "goals": reached,
            },
            indent=1,
        )
    )
    plot(results / f"{NAME}.png", summary, delays)
    return lines


def plot(path: Path, summary: dict[str, dict[int, dict[str, Any]]], delays: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for mode, row in summary.items():
        ds = [d for d in delays if d in row]
        axes[0].plot(ds, [row[d]["success"] for d in ds], "o-", label=mode)
        jumps = [(d, row[d]["boundary_jump"]) for d in ds if row[d]["boundary_jump"] is not None]
        axes[1].plot([d for d, _ in jumps], [j for _, j in jumps], "o-", label=mode)
    axes[0].set(xlabel="inference delay (ticks)", ylabel="success (mean over seeds)", ylim=(0, 1.02))
    axes[1].set(xlabel="inference delay (ticks)", ylabel="boundary jump (L2, mean)")
    axes[0].set_title("success")
    axes[1].set_title("action jump where a chunk takes over")
    for ax in axes:
        ax.set_xticks(delays)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one seed, delays 0 and 4, 8 episodes, a temporary folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--delays", type=int, nargs="+", default=list(DELAYS))
    parser.add_argument("--episodes", type=int, default=EPISODES)
    parser.add_argument("--demos", type=int, default=DEMO_EPISODES)
    parser.add_argument("--sft-steps", type=int, default=SFT_STEPS)
    parser.add_argument("--report", action="store_true", help="rebuild latency.md and latency.png from the records")
    parser.add_argument(
        "--recount", action="store_true", help="measure the recorded cells again from the clients' logs, then report"
    )
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="where the records and report go (tuning: elsewhere)"
    )
    args = parser.parse_args()
    results, runs = args.results, RUNS / NAME
    if args.quick:
        args.seeds, args.delays, args.episodes, args.demos, args.sft_steps = args.seeds[:1], [0, 4], 8, 10, 200
        results = Path(tempfile.mkdtemp(prefix="latency-quick-"))
        runs = results / "runs"
    if args.report or args.recount:
        previous = json.loads((results / f"{NAME}.json").read_text())
        record = {k: previous[k] for k in ("commit", "machine", "command", "recounted") if k in previous}
        wanted = previous.get("settings") or load_cells(results)[0]["settings"]
        if args.recount:
            recount(results, runs / "cells", wanted)
            record["recounted"] = provenance("latency.py")
        print("\n".join(write_report(results, record, wanted)))
        return
    record = provenance("latency.py")
    for seed, run in sft_runs(runs, args).items():
        measure_seed(seed, run, runs / "cells", results, args)
    print("\n".join(write_report(results, record, settings(args))))
    if args.quick:
        print(f"(quick: written to {results})")


if __name__ == "__main__":
    main()
