"""`runtime=procs` placements side by side, one run after another on this machine: seconds
per update (collection and learning) and, on CUDA, the device memory every process of the
run holds at its peak.

    disaggregated   the rollout and the learner keep their policies on the device
    collocated      they take turns; the idle one's policy (the learner's Adam moments too)
                    waits in CPU memory (`runtime.placement=collocated`)

    python benchmarks/placement.py                                   # the default: a 45M token VLA
    python benchmarks/placement.py --updates 6 -- policy=pi0 policy.pretrained=/models/pi0 \\
        policy.tokenizer=/models/paligemma env.obs_mode=rgb        # a real-size VLA on a GPU

Memory is sampled from the device itself (`torch.cuda.mem_get_info`, every 0.1 s), so it
counts both roles' processes; on a CPU-only machine only the times are measured.

The bound: collocated roles take turns and move their policies between every turn, so a
collocated update cannot take less than a disaggregated one plus the copies it measures
(learner and rollout offload seconds per update). The placements run in ABBA order over
`--rounds` rounds, so slow drift of a shared machine falls on both alike, and the spread
between rounds of one placement is reported as the noise. A ratio below its bound by more
than that noise is flagged, not reported. Writes benchmarks/results/placement.{json,md,png}."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean

import torch

from harness.placement_runs import PLACEMENTS, WARMUP_UPDATES, defaults_under, run
from harness.reports import bar_chart, provenance, provenance_line

RESULTS = Path(__file__).resolve().parent / "results"


def compare(results: list[dict]) -> dict:
    """The collocated/disaggregated time ratio, its bound, and the noise between rounds."""
    times = {p: [r["seconds_per_update"] for r in results if r["placement"] == p] for p in PLACEMENTS}
    copies = mean([r["offload_s_per_update"] for r in results if r["placement"] == "collocated"])
    disaggregated, collocated = mean(times["disaggregated"]), mean(times["collocated"])
    ratio, bound = collocated / disaggregated, (disaggregated + copies) / disaggregated
    # the largest spread between rounds of one placement, relative to its mean
    noise = max((max(t) - min(t)) / mean(t) for t in times.values())
    return {
        "seconds_per_update": {p: {"mean": mean(t), "min": min(t), "max": max(t)} for p, t in times.items()},
        "collocated_time_ratio": ratio,
        "ratio_lower_bound": bound,
        "copies_s_per_update": copies,
        "noise": noise,
        "beyond_bound": ratio < bound - noise,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=8, help="updates timed per placement, after the warm-up")
    parser.add_argument("--rounds", type=int, default=2, help="runs per placement, in ABBA order")
    parser.add_argument("overrides", nargs="*", help="config overrides after --, e.g. policy=pi0 ...")
    args = parser.parse_args()
    order = [p for i in range(args.rounds) for p in (PLACEMENTS if i % 2 == 0 else PLACEMENTS[::-1])]
    results = [run(placement, args.updates, args.overrides) for placement in order]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU only"
    comparison = compare(results)
    summary = {
        "device": device,
        "config": [*defaults_under(args.overrides), *args.overrides],
        "order": order,
        "results": results,
        **comparison,
        **provenance("placement.py"),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "placement.json").write_text(json.dumps(summary, indent=2))
    bar_chart(
        RESULTS / "placement.png",
        {p: t["mean"] for p, t in comparison["seconds_per_update"].items()},
        "seconds per update (mean over rounds)",
        f"runtime=procs placements ({device})",
    )
    gb = lambda value: "n/a (no GPU)" if value is None else f"{value:.2f}"  # noqa: E731
    ratio, bound, noise = comparison["collocated_time_ratio"], comparison["ratio_lower_bound"], comparison["noise"]
    verdict = (
        f"**below its bound by more than the noise: not a result; investigate.** Measured {ratio:.3f}x"
        if comparison["beyond_bound"]
        else f"**{ratio:.2f}x**"
    )
    lines = [
        "# Placements: disaggregated against collocated",
        "",
        provenance_line(summary),
        "",
        f"`runtime=procs`, {device}, {args.rounds} rounds in the order {', '.join(order)}, {args.updates} updates "
        f"timed per run after {WARMUP_UPDATES} of warm-up. Config: `{' '.join(summary['config'])}`.",
        "",
        "| run | placement | s / update | device peak (GB, all processes) | copies (s / update) | "
        "moved per offload (GB) |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for index, r in enumerate(results, 1):
        lines.append(
            f"| {index} | {r['placement']} | {r['seconds_per_update']:.2f} | {gb(r['device_peak_gb'])} | "
            f"{r['offload_s_per_update']:.3f} | {r['offload_gb'] or 0:.3f} |"
        )
    lines += [
        "",
        f"Collocated / disaggregated time per update: {verdict}. Its bound: collocated takes at least a "
        f"disaggregated update plus its copies ({comparison['copies_s_per_update']:.3f} s), so the ratio is at "
        f"least **{bound:.3f}x**. Noise (the largest spread between rounds of one placement): {noise:.1%}.",
        "",
        "![times](placement.png)",
    ]
    (RESULTS / "placement.md").write_text("\n".join(lines) + "\n")
    print((RESULTS / "placement.md").read_text())


if __name__ == "__main__":
    main()
