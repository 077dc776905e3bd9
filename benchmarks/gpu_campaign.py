"""The GPU campaign: every measurement that needs a GPU, most important first, each step
writing its result under benchmarks/results/gpu/ (and into $OUT, where the GPU machine hands
files back) the moment it finishes, since GPU time can end at any minute.

    python benchmarks/gpu_campaign.py                        # every step, in order
    python benchmarks/gpu_campaign.py --only ppo,pipeline    # some of them
    python benchmarks/gpu_campaign.py --smoke --results /tmp/r   # every step at toy size on a CPU
    python benchmarks/gpu_campaign.py report                 # benchmarks/results/gpu/README.md from the steps

On the GPU machine it runs through tools/gpu/there.sh, which installs the kit that
tools/gpu/kit.py prepares here (docs/gpu.md). `--smoke` (physx_cpu, one env, a few
steps) is part of the test suite, so the campaign cannot rot between visits to a GPU."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness import gpu_model_steps, gpu_sim_steps, gpu_steps

RESULTS = Path(__file__).resolve().parent / "results" / "gpu"
STEPS = {  # the campaign's order: what matters most comes first
    "correctness": gpu_sim_steps.correctness,
    "throughput": gpu_sim_steps.throughput,
    "ppo": gpu_sim_steps.ppo,
    "vla": gpu_model_steps.vla,
    "pipeline": gpu_model_steps.pipeline,
    "placement": gpu_model_steps.placement,
    "rendering": gpu_sim_steps.rendering,
    "openvla": gpu_model_steps.openvla,
}


def commit() -> str:
    """The commit measured: the kit records it (the GPU machine gets no .git), else git's."""
    if os.environ.get("EMBODIED_COMMIT"):
        return os.environ["EMBODIED_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=gpu_steps.ROOT)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=gpu_steps.ROOT)
        return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def machine() -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "gpu": gpu,
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host": platform.node(),
    }


def run_step(name: str, scale: gpu_steps.Scale, results: Path, work: Path) -> dict[str, Any]:
    started = time.time()
    record: dict[str, Any] = {
        "step": name,
        "smoke": scale.smoke,
        "commit": commit(),
        "machine": machine(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
    }
    measured: list[dict[str, Any]] = []

    def publish(row: dict[str, Any]) -> None:  # the rows so far, in case GPU time ends mid-step
        measured.append(row)
        write({**record, "unfinished": True, "rows": measured, "seconds": time.time() - started}, results)

    gpu_steps.on_measured = publish
    try:
        record.update(asdict(STEPS[name](scale, work)))
    except (Exception, SystemExit) as error:  # recorded, and the campaign goes on with the next step
        record.update(error=f"{type(error).__name__}: {error}", traceback=traceback.format_exc()[-4000:])
    record["seconds"] = time.time() - started
    write(record, results)
    return record


def write(record: dict[str, Any], results: Path) -> None:
    results.mkdir(parents=True, exist_ok=True)
    name = record["step"]
    (results / f"{name}.json").write_text(json.dumps(record, indent=2, default=str))
    (results / f"{name}.md").write_text(step_markdown(record))
    out = os.environ.get("OUT")
    if out:  # the GPU machine hands back at most 8 files: the JSON only (`report` rebuilds the Markdown)
        shutil.copy(results / f"{name}.json", Path(out) / f"{name}.json")


def cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        text = json.dumps(value, default=str)
        return text if len(text) <= 80 else text[:77] + "..."
    return str(value)


def step_markdown(record: dict[str, Any]) -> str:
    verdict = {True: "met", False: "**not met**", None: "a measurement"}[record.get("met")]
    lines = [
        f"# GPU campaign: {record['step']}",
        "",
        f"{record['machine'].get('gpu') or 'no GPU (CPU only)'}, {record['machine']['cpu_cores']} cores, torch "
        f"{record['machine']['torch']}; commit {record['commit']}; {record['started']} UTC, "
        f"{record['seconds']:.0f} s{' (smoke: toy sizes)' if record['smoke'] else ''}.",
        "",
        f"`{record['command']}`",
        "",
    ]
    if "error" in record:
        return "\n".join([*lines, f"**Failed:** {record['error']}", "", "```", record["traceback"], "```", ""])
    if record.get("unfinished"):
        lines += ["**Unfinished:** the step was cut off; the rows it had measured by then:", ""]
    else:
        lines += [f"Goal: {record['goal']}: {verdict}.", ""]
    rows = record["rows"]
    if rows:
        keys = list(dict.fromkeys(key for row in rows for key in row))
        lines += ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
        lines += ["| " + " | ".join(cell(row.get(key, "")) for key in keys) + " |" for row in rows]
        lines.append("")
    lines += [f"- {note}" for note in record.get("notes", [])]
    return "\n".join(lines) + "\n"


def failure_cause(error: str, width: int = 110) -> str:
    """An error's last line, where the cause is named (its end, where that is long), fit for a
    table cell."""
    last = [line.strip() for line in error.splitlines() if line.strip()][-1].replace("|", "/")
    return last if len(last) <= width else "..." + last[-width:]


def report(results: Path) -> str:
    """The campaign's state: which GPU figures are measured (and on what), which are not."""
    lines = [
        "# GPU campaign",
        "",
        "What `benchmarks/gpu_campaign.py` measured on a GPU machine, step by step (smoke runs on a CPU are "
        "not listed). A step marked 'not measured' has not run on a GPU yet.",
        "",
        "| step | result | GPU | commit | when |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in STEPS:
        path = results / f"{name}.json"
        record = json.loads(path.read_text()) if path.is_file() else None
        if record is None or record.get("smoke"):
            lines.append(f"| {name} | not measured on a GPU yet | | | |")
            continue
        (results / f"{name}.md").write_text(step_markdown(record))  # from the JSON a GPU machine handed back
        if "error" in record:
            result = "failed: " + failure_cause(record["error"])
        elif record.get("unfinished"):
            result = f"unfinished: cut off after {len(record['rows'])} rows"
        elif not record["rows"]:
            result = "nothing measured (see its notes)"
        else:
            result = {True: "goal met", False: "goal not met", None: "measured"}[record.get("met")]
        lines.append(
            f"| [{name}]({name}.md) | {result} | {record['machine'].get('gpu')} | {record['commit'][:10]} "
            f"| {record['started']} |"
        )
    text = "\n".join(lines) + "\n"
    results.mkdir(parents=True, exist_ok=True)
    (results / "README.md").write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["run", "report"], default="run")
    parser.add_argument("--only", default=",".join(STEPS), help=f"comma-separated steps of: {', '.join(STEPS)}")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on a CPU (physx_cpu, one env)")
    parser.add_argument(
        "--results", type=Path, default=None, help=f"default: {RESULTS} (with --smoke: a fresh temporary folder)"
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "embodied-gpu-work",
        help="where the steps' runs go; kept between calls, so a long step resumes",
    )
    args = parser.parse_args()
    if args.results is None:  # a smoke run never writes over what a GPU measured
        args.results = Path(tempfile.mkdtemp(prefix="gpu-campaign-smoke-")) if args.smoke else RESULTS
        if args.smoke:
            print(f"results: {args.results}", flush=True)
    if args.command == "report":
        print(report(args.results))
        return 0
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in STEPS]
    if unknown:
        parser.error(f"unknown steps {unknown}; known: {', '.join(STEPS)}")
    scale = gpu_steps.Scale(smoke=args.smoke)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in chosen:
        print(f"== {name}", flush=True)
        record = run_step(name, scale, args.results, work)
        failed += "error" in record
        print(f"   {record.get('error') or record.get('met')} ({record['seconds']:.0f} s)", flush=True)
    if not args.smoke:
        report(args.results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
