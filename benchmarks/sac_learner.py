"""What one env step costs the SAC/RLPD learner, from state and from pixels: the arms of
`hil.py`'s PickCube studies side by side, as ratios to the state learner.

    python benchmarks/sac_learner.py            # measure, write the results
    python benchmarks/sac_learner.py report     # rebuild the Markdown and plot from the JSON

Each configuration is the learner `hil.py` trains (128-wide actor and ten critics, batch 128,
two critic steps and one actor step per transition, one torch thread) on PickCube-v1's own
observation layout (its env spec, read from ManiSkill), fed rollout-like batches of four
transitions whose first frames are the previous batch's next frames and whose next frames
are new random ones. Two parts are timed per batch: `encode` (the frozen backbone's features
of the new frames, `with_features`) and `update` (storing the batch, then its critic and
actor steps, `learn`), in this process's CPU time (one torch thread), so other jobs on the
machine do not count as the learner's; the configurations also take turns batch by batch,
so what load remains (caches, memory bandwidth) weighs on all of them alike. The figures are
medians per env step, and the ratios are what to read. Writes benchmarks/results/sac_learner.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from harness.reports import provenance, provenance_line, write_report

RESULTS = Path(__file__).resolve().parent / "results"
ENVS = 4  # transitions per batch, as hil.py's four envs give them
PREFILL = 512  # transitions in replay before timing
WARMUP, BATCHES = 5, 60  # per configuration
RECIPE = dict(batch_size=128, critic_hidden=[128, 128], utd_ratio=2, replay_capacity=10_000, seed=0)
# name -> (ManiSkill overrides, policy overrides, algo overrides): hil.py's PickCube arms
CONFIGS = {
    "state": ({"obs_mode": "state"}, {}, {}),
    "pixels (64 px, pooled)": ({"obs_mode": "rgb", "image_size": 64}, {}, {}),
    "wrist + spatial embeddings": (
        {"obs_mode": "rgb", "image_size": 64, "robot": "panda_wristcam"},
        {"image_features": "spatial", "spatial_embeddings": 8},
        {},
    ),
    "wrist + spatial embeddings + 4 cached shifts": (
        {"obs_mode": "rgb", "image_size": 64, "robot": "panda_wristcam"},
        {"image_features": "spatial", "spatial_embeddings": 8},
        {"image_augmentation": "cached_shifts", "cached_shifts": 4},
    ),
    "the wrist camera alone, the same": (
        {"obs_mode": "rgb", "image_size": 64, "robot": "panda_wristcam"},
        {"image_features": "spatial", "spatial_embeddings": 8, "cameras": ["hand_camera"]},
        {"image_augmentation": "cached_shifts", "cached_shifts": 4},
    ),
}


def pickcube_spec(overrides: dict):
    from embodied.sim.maniskill import ManiSkillEnv
    from embodied.sim.maniskill_common import ManiSkillConfig

    env = ManiSkillEnv(ManiSkillConfig(task="PickCube-v1", control_mode="pd_ee_delta_pos", **overrides))
    try:
        return env.spec
    finally:
        env.close()


class Stream:
    """One configuration's learner and its rollout-like batches of random frames."""

    def __init__(self, spec, policy_overrides: dict, algo_overrides: dict):
        import torch

        from embodied.algos.sac_config import SACConfig
        from embodied.algos.sac_rlpd import SACRLPD
        from embodied.policies.gaussian.squashed_gaussian import SquashedGaussianConfig, SquashedGaussianPolicy

        torch.manual_seed(0)
        self.spec = spec
        self.generator = torch.Generator().manual_seed(1)
        policy = SquashedGaussianPolicy(SquashedGaussianConfig(hidden=[128, 128], **policy_overrides), spec)
        self.algo = SACRLPD(SACConfig(**RECIPE, **algo_overrides), policy)
        self.frames = self.new_frames()
        for _ in range(PREFILL // ENVS):
            self.algo.online.add(self.algo.with_features(self.batch()))

    def new_frames(self) -> dict:
        import torch

        return {
            camera: torch.randint(0, 256, (ENVS, *shape), generator=self.generator, dtype=torch.uint8)
            for camera, shape in self.algo.image_shapes.items()  # the cameras the policy reads
        }

    def batch(self):
        import torch

        from embodied.algos.replay import Transitions

        g, n, spec = self.generator, ENVS, self.spec
        first, self.frames = self.frames, self.new_frames()
        return Transitions(
            state=torch.randn(n, spec.state_dim, generator=g),
            action=torch.rand(n, spec.action_dim, generator=g) * 2 - 1,
            reward=torch.rand(n, generator=g),
            next_state=torch.randn(n, spec.state_dim, generator=g),
            discount=torch.ones(n),
            intervened=torch.zeros(n, dtype=torch.bool),
            mc_return=torch.full((n,), -torch.inf),
            images=first,
            next_images=self.frames,
        )

    def step(self) -> tuple[float, float]:
        """CPU seconds per env step: encoding the batch's new frames, then learning from it."""
        batch = self.batch()
        started = time.process_time()
        transitions = self.algo.with_features(batch)
        encoded = time.process_time()
        self.algo.learn(transitions)
        return (encoded - started) / ENVS, (time.process_time() - encoded) / ENVS


def measure() -> dict:
    import torch

    torch.set_num_threads(1)
    streams = {}
    for name, (env, policy, algo) in CONFIGS.items():
        streams[name] = Stream(pickcube_spec(env), policy, algo)
        print(f"{name}: ready", flush=True)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in streams}
    for turn in range(WARMUP + BATCHES):
        for name, stream in streams.items():  # turn by turn: the same load weighs on every configuration
            encode, update = stream.step()
            if turn >= WARMUP:
                times[name].append((encode, update))
    rows = {}
    for name, pairs in times.items():
        encode = statistics.median(p[0] for p in pairs) * 1e3
        update = statistics.median(p[1] for p in pairs) * 1e3
        total = statistics.median(p[0] + p[1] for p in pairs) * 1e3
        rows[name] = {"encode_ms": encode, "update_ms": update, "total_ms": total}
    state = rows["state"]["total_ms"]
    for row in rows.values():
        row["ratio_to_state"] = row["total_ms"] / state
        row["env_steps_per_s_bound"] = 1e3 / row["total_ms"]
    return {"rows": rows, "batches": BATCHES, "envs": ENVS, "recipe": RECIPE, **provenance("sac_learner.py")}


def report(summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["rows"]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    names = list(rows)
    encode = [rows[n]["encode_ms"] for n in names]
    update = [rows[n]["update_ms"] for n in names]
    ax.barh(names, update, color="tab:blue", label="update (critic and actor steps)")
    ax.barh(names, encode, left=update, color="tab:orange", label="encode (frozen backbone)")
    ax.invert_yaxis()
    ax.set_xlabel("learner CPU ms per env step (median)")
    ax.set_title("SAC/RLPD learner on PickCube-v1's observations, UTD 2")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "sac_learner.png", dpi=110)
    plt.close(fig)
    lines = [
        "# What one env step costs the SAC/RLPD learner, from state and from pixels",
        "",
        provenance_line(summary),
        "",
        f"hil.py's learner (batch {summary['recipe']['batch_size']}, critics "
        f"{summary['recipe']['critic_hidden']}, UTD {summary['recipe']['utd_ratio']}, one torch thread) on "
        f"PickCube-v1's observation layout, batches of {summary['envs']} transitions of random frames, "
        f"{summary['batches']} batches per configuration taken in turns; medians of CPU time per env step. "
        "The env's own stepping and rendering are not included: `steps/s bound` is what the learner alone would "
        "allow.",
        "",
        "| configuration | encode (ms) | update (ms) | total (ms) | x state | steps/s bound |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *(
            f"| {name} | {r['encode_ms']:.1f} | {r['update_ms']:.1f} | {r['total_ms']:.1f} | "
            f"{r['ratio_to_state']:.1f}x | {r['env_steps_per_s_bound']:.0f} |"
            for name, r in rows.items()
        ),
        "",
        "![learner time per env step](sac_learner.png)",
    ]
    write_report(RESULTS, "sac_learner", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="run", choices=("run", "report"))
    args = parser.parse_args()
    path = RESULTS / "sac_learner.json"
    if args.command == "run":
        path.write_text(json.dumps(measure(), indent=2))
    report(json.loads(path.read_text()))


if __name__ == "__main__":
    main()
