"""deploy.py's report and plot, from its results (deploy.json) alone: the setup they describe
(observation, chunk, models, warm-up) is read from the results, so a report rebuilt later says
what was measured then."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

# ours first; the bridge (openpi's client against embodied serve) is missing from older results
PROTOCOLS = ("ours", "openpi", "bridge")
COLORS = {"ours": "tab:blue", "openpi": "tab:orange", "bridge": "tab:green"}


def measured(results: dict[str, Any]) -> list[str]:
    first = next(iter(results["latency_1_client"].values()))
    return [protocol for protocol in PROTOCOLS if protocol in first]


def write(results_dir: Path, results: dict[str, Any]) -> list[str]:
    """deploy.md and deploy.png from the results (deploy.json)."""
    lines = report(results)
    (results_dir / "deploy.md").write_text("\n".join(lines) + "\n\n![deploy](deploy.png)\n")
    plot(results_dir / "deploy.png", results, results["clients"])
    return lines


def plot(path: Path, results: dict[str, Any], client_counts: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = results["setup"]["model_ms"]
    protocols = measured(results)
    fig, axes = plt.subplots(1, 1 + len(models), figsize=(4.4 * (1 + len(models)), 3.6))
    one = results["latency_1_client"]
    labels = [f"{model}\n{stat}" for model in models for stat in ("p50", "p99")]
    x = np.arange(len(labels))
    width = 0.8 / len(protocols)
    for k, protocol in enumerate(protocols):
        offset = (k - (len(protocols) - 1) / 2) * width
        values = [
            one[model][protocol][f"{stat}_ms"] - (model_ms or 0.0)
            for model, model_ms in models.items()
            for stat in ("p50", "p99")
        ]
        axes[0].bar(x + offset, values, width, label=protocol, color=COLORS[protocol])
    axes[0].set_xticks(x, labels, fontsize=8)
    axes[0].set_ylabel("round trip minus fixed model cost (ms)")
    axes[0].set_title("overhead, 1 client")
    axes[0].legend()
    for ax, model in zip(axes[1:], models):
        for protocol in protocols:
            rates = [results["throughput"][model][str(n)][protocol]["replies_per_s"] for n in client_counts]
            ax.plot(client_counts, rates, "o-", label=protocol, color=COLORS[protocol])
        ratio = results["throughput"][model][str(client_counts[-1])]["ratio"]
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(client_counts, [str(n) for n in client_counts])
        ax.set_xlabel("clients")
        ax.set_ylabel("replies / s (all clients)")
        ax.set_title(f"{model}: ours {ratio:.1f}x openpi at {client_counts[-1]}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(results: dict[str, Any]) -> list[str]:
    counts = results["clients"]
    one, through, goals = results["latency_1_client"], results["throughput"], results["goals"]
    setup = results["setup"]
    models, state_dim, (chunk, action_dim) = setup["model_ms"], setup["state_dim"], setup["chunk"]
    image_shape, images = "x".join(map(str, setup["image_shape"])), ", ".join(setup["images"])
    protocols = measured(results)
    bridge = "bridge" in protocols
    lines = [
        f"# Robot <-> policy server: ours vs the openpi client protocol, loopback, {os.cpu_count()} cores",
        "",
        f"Commit {results['commit']}, {results['machine']}; `{results['command']}`.",
        "",
        f"Observation: two uint8 {image_shape} images ({images}), a float32 "
        f"({state_dim},) state and an instruction ({setup['observation_bytes'] / 1e3:.0f} kB of arrays); reply: a "
        f"float32 {chunk}x{action_dim} action chunk. Each server runs in its own process; the clients run "
        f"as threads spread over {setup['client_procs']} other processes (1 process for 1 client), the same "
        f"arrangement for both protocols, each closed-loop: one request in flight, the next sent as soon as "
        f"the reply is in. Each client makes {setup['warmup_requests']} warm-up requests; replies are then counted "
        f"over {setup['seconds']:g} s after {setup['settle']:g} s of settling. {setup['repeats']} interleaved "
        f"run(s) per point: throughput is the best run's, latency percentiles are over the replies of all runs. "
        f"Latency is measured in the client, from handing over the observation to holding the decoded "
        f"actions, so encoding and decoding on both ends count.",
        "",
        "- **ours**: `embodied.serve.PolicyServer` (one ZeroMQ ROUTER socket; requests that arrive together "
        "are answered by one batched forward pass, batch window 2 ms) and `embodied.robots.policy_client.PolicyClient` "
        "(frames: arrays travel as raw buffers, no copies in the codec).",
        f"- **openpi**: openpi-client {setup['openpi_client']} `WebsocketClientPolicy.infer` (msgpack-numpy "
        f"over a websocket, websockets {setup['websockets']}) against a server written here to openpi's "
        "documented protocol: an asyncio websockets server that sends the packed metadata on connect, then "
        "for every message unpacks the observation, calls the policy and sends back the packed "
        "`{actions, server_timing}`. As in openpi's reference server, the policy is called synchronously "
        "inside the connection handler, so requests from several clients are served one at a time; no "
        "batching was added. (`openpi-server` 0.1.0 on PyPI ships that server loop, but names no author "
        "or project: it is not openpi's own release, so it is not used.)",
        "- **Model costs**, applied identically to both servers. *Transport only*: the model returns zeros "
        "instantly, so the round trip is the protocol's overhead. *10 ms model*: each forward pass costs "
        "10 ms (`time.sleep(0.010)` per call) whatever its batch size. This stands for a GPU forward of a VLA "
        "whose cost is flat in the batch size up to 32: an assumption about the accelerator, not measured "
        "here (no GPU). *CPU network*: a real forward pass of a small convolutional policy (both cameras "
        "through a strided convolution stack, the state beside, an MLP to the chunk; torch on one thread), "
        "whose cost grows with the batch as a real model's does on a CPU; the server's process and the "
        "clients' share this machine's cores. Ours answers up to 64 requests per forward pass; openpi one.",
        *(
            [
                "- **bridge**: the same openpi-client against `embodied serve`'s openpi endpoint (`openpi.port`, "
                "`embodied/runtime/openpi_endpoint.py`): a websocket server in the policy server's process whose "
                "every connection is one more client of our policy server over loopback ZeroMQ, so its requests "
                "are batched with the others'. One hop more than openpi's own pair: the question is what it costs."
            ]
            if bridge
            else []
        ),
        f"- **lerobot gRPC async inference**: {results['lerobot']}.",
        "",
        "## Latency at 1 client (ms)",
        "",
        "| model | protocol | p50 | p99 | mean | overhead p50 (minus model) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for model, model_ms in models.items():
        for protocol in protocols:
            row = one[model][protocol]
            overhead = "n/a" if model_ms is None else f"{row['p50_ms'] - model_ms:.2f}"  # no fixed cost to subtract
            lines.append(
                f"| {model} | {protocol} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['mean_ms']:.2f} | "
                f"{overhead} |"
            )
    lines += [
        "",
        "## Throughput (replies/s, all clients together)",
        "",
        "| model | clients | ours | openpi | ours / openpi | ours p50 / p99 ms | openpi p50 / p99 ms |"
        + (" bridge | bridge / openpi | bridge p50 / p99 ms |" if bridge else ""),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: | ---: |" if bridge else ""),
    ]
    for model in models:
        for n in counts:
            point = through[model][str(n)]
            ours, theirs = point["ours"], point["openpi"]
            row = (
                f"| {model} | {n} | {ours['replies_per_s']:.0f} | {theirs['replies_per_s']:.0f} | "
                f"**{point['ratio']:.2f}x** | {ours['p50_ms']:.1f} / {ours['p99_ms']:.1f} | "
                f"{theirs['p50_ms']:.1f} / {theirs['p99_ms']:.1f} |"
            )
            if bridge:
                ours_bridged = point["bridge"]
                row += (
                    f" {ours_bridged['replies_per_s']:.0f} | {point['bridge_ratio']:.2f}x | "
                    f"{ours_bridged['p50_ms']:.1f} / {ours_bridged['p99_ms']:.1f} |"
                )
            lines.append(row)
    floor = results["ours_floor"]
    bare_ratio = floor["bare_zeromq_p50_ms"] / one["transport only"]["openpi"]["p50_ms"]
    lines += [
        "",
        f"Where ours' {one['transport only']['ours']['p50_ms']:.2f} ms (p50, transport only) goes: a "
        f"heartbeat round trip over the same sockets, no arrays, takes {floor['heartbeat_p50_ms']:.2f} ms (p99 "
        f"{floor['heartbeat_p99_ms']:.2f}); the server's own handling of an observation (decode, checks, "
        f"batching, the zeros, encode) {floor['server_p50_ms']:.2f} ms. The rest is moving the "
        f"{setup['observation_bytes'] / 1e3:.0f} kB through ZeroMQ over loopback TCP. The same frames through "
        f"a bare pyzmq DEALER/ROUTER pair, with no envelope, codec or checks, take "
        f"{floor['bare_zeromq_p50_ms']:.2f} ms (p99 {floor['bare_zeromq_p99_ms']:.2f}): "
        f"{bare_ratio:.2f} of openpi's round trip"
        + (
            ", above the 1/3 target: no protocol on ZeroMQ over loopback TCP from Python reaches it on this machine."
            if bare_ratio > 1 / 3
            else "."
        ),
    ]
    overhead, top = goals["overhead_1_client"], goals["throughput_top_clients"]
    lines += [
        "",
        "## Goals",
        "",
        f"- Overhead at 1 client <= 1/3 of openpi's (transport only): ours / openpi = "
        f"{overhead['p50_ratio']:.2f} at p50, {overhead['p99_ratio']:.2f} at p99: "
        f"**{'met' if overhead['met'] else 'not met'}**.",
        f"- Throughput at {counts[-1]} clients >= 5x openpi's: 10 ms model {top['10 ms model']['ratio']:.1f}x "
        f"(**{'met' if top['10 ms model']['met'] else 'not met'}**); transport only "
        f"{top['transport only']['ratio']:.1f}x (**{'met' if top['transport only']['met'] else 'not met'}**). "
        "With the transport alone, each server and all the client processes share the same "
        f"{os.cpu_count()} cores, so that figure compares CPU cost per reply more than how either server "
        "handles many clients.",
        f"- No goal for the CPU network: its cost grows with the batch, so batching can only save the "
        f"per-call overheads; measured, ours / openpi at {counts[-1]} clients = "
        f"{through['CPU network'][str(counts[-1])]['ratio']:.2f}x.",
    ]
    if bridge:
        ratios = goals["bridge_1_client"]
        lines.append(
            "- openpi's client against `embodied serve` (the bridge) within 1.2x of openpi's own pair, round trip "
            "p50 at 1 client: "
            + "; ".join(
                f"{model} {value['p50_ratio']:.2f}x (**{'met' if value['met'] else 'not met'}**)"
                for model, value in ratios.items()
            )
            + "."
        )
    return lines
