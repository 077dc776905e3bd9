"""hil.py's PushCube-v1 set-up, which wsrl.py builds on: the SAC recipe (RLPD's, with
ConRFT's BC term) sized for a CPU core per run, the goal, and the PPO expert with the demos it
records the way a user would (`embodied serve` driving `embodied robot robot=sim`)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from harness.runs import RUNS, train

EXPERT = RUNS / "pushcube-s1"  # a PPO run of the main job
DEMOS = RUNS / "hil-demos"  # hil.py's demos (wsrl.py records its own, per demo count)
GOAL = 0.9  # deterministic success in 16 fixed evaluation episodes
# Networks and batches sized for a CPU core per run (RLPD's own are 256 wide, batch 256).
RECIPE = [
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


def ensure_expert() -> None:
    """The expert, trained first where this machine has none."""
    if not (EXPERT / "checkpoints" / "latest").is_file():
        train(EXPERT.name, ["env=maniskill_pushcube", "seed=1"], 300_000)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def record_demos(episodes: int, root: Path = DEMOS) -> None:
    """The expert, served, drives the simulated robot while the client records into `root`."""
    if (root / "meta" / "info.json").is_file():
        return
    endpoint, client_output = f"tcp://127.0.0.1:{free_port()}", root.with_name(root.name + "-client")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "embodied.cli",
            "serve",
            f"checkpoint={EXPERT}",
            f"endpoint={endpoint}",
            "runtime.device=cpu",
        ]
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
                f"record.dataset={root}",
                f"output={client_output}",
            ],
            check=True,
            stdin=subprocess.DEVNULL,
            timeout=1800,
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    summary = json.loads((client_output / "summary.json").read_text())
    print(f"demos: {len(summary['episodes'])} episodes, expert success {summary['success_rate']:.2f}")
