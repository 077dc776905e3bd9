"""What a frozen image backbone tells a pixel policy about where the object is: a linear
read-out of PickCube's cube position (x, y) from each backbone's features, on episodes it
was not fitted on.

    python benchmarks/encoder_probe.py            # collect frames, probe, write the results
    python benchmarks/encoder_probe.py report     # rebuild the Markdown and plot from the JSON

Frames: `EPISODES` episodes of PickCube-v1 (64 and 128 px, its one camera), each driven by
the scripted expert with Gaussian action noise of a scale drawn per episode (0 to 0.3), so
the cube is picked and carried in some and pushed about or left in others. The features are
exactly what `policy=squashed_gaussian` reads (`frozen_backbone`), pooled and spatial.

The read-out is ridge regression on standardised features (each divided by its spread, or
by a tenth of the mean spread where its own is smaller). Its strength is chosen on
validation episodes, refitted on fit + validation episodes, and scored on held-out episodes
only. The baseline predicts the fitted mean everywhere: its error is the spread of the
cube's position itself. A linear read-out is a floor on what a trained head can extract,
not a ceiling; it says which features keep the position within easy reach.
Writes benchmarks/results/encoder_probe.{json,md,png}."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from harness.reports import provenance, provenance_line

RESULTS = Path(__file__).resolve().parent / "results"
TASK = "PickCube-v1"
SIZES = (64, 128)
EPISODES = 80  # of 50 steps each
FIT, VALIDATE = range(0, 40), range(40, 60)  # episodes; the rest (60-79) are held out
FIRST_EPISODE_SEED = 1000
MAX_NOISE = 0.3  # per episode, the expert's action noise scale is drawn from [0, MAX_NOISE]
RIDGE = (0.1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6)
STANDARD_FLOOR = 0.1  # of the features' mean spread: the least a feature is divided by
BACKBONES = [
    ("efficientnet_lite0", "pooled"),
    ("efficientnet_lite0", "spatial"),
    ("random_cnn", "pooled"),
    ("random_cnn", "spatial"),
]


def collect(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 frames (N, size, size, 3), the cube's (x, y) in cm (N, 2), each frame's episode (N,)."""
    from embodied.sim.maniskill import ManiSkillEnv
    from embodied.sim.maniskill_common import ManiSkillConfig

    env = ManiSkillEnv(ManiSkillConfig(task=TASK, obs_mode="rgb", image_size=size, control_mode="pd_ee_delta_pos"))
    rng = np.random.default_rng(0)
    frames, cubes, episodes = [], [], []
    try:
        for episode in range(EPISODES):
            observation = env.reset(FIRST_EPISODE_SEED + episode)
            noise = rng.uniform(0, MAX_NOISE)
            for _ in range(env.spec.max_episode_steps):
                (frame,) = observation.images.values()
                frames.append(frame)
                cubes.append(env.env.unwrapped.cube.pose.p[0, :2].numpy() * 100)
                episodes.append(episode)
                action = env.expert_action() + rng.normal(0, noise, env.spec.action_dim).astype(np.float32)
                observation = env.step(np.clip(action, env.spec.action_low, env.spec.action_high)).observation
    finally:
        env.close()
    return np.stack(frames), np.stack(cubes).astype(np.float64), np.array(episodes)


def features_of(backbone_name: str, features: str, frames: np.ndarray) -> np.ndarray:
    import torch

    from embodied.policies.image_backbones import frozen_backbone

    backbone = frozen_backbone(backbone_name, features)
    with torch.no_grad():
        batches = [backbone.features(torch.from_numpy(frames[i : i + 256])) for i in range(0, len(frames), 256)]
    return torch.cat(batches).numpy().astype(np.float64)


def ridge_fit(x: np.ndarray, y: np.ndarray, strength: float) -> tuple[np.ndarray, np.ndarray]:
    """Weights and intercept of ridge regression (the intercept not penalised)."""
    x_mean, y_mean = x.mean(0), y.mean(0)
    xc, yc = x - x_mean, y - y_mean
    if xc.shape[1] > xc.shape[0]:  # the dual form: a system the size of the rows
        weights = xc.T @ np.linalg.solve(xc @ xc.T + strength * np.eye(len(xc)), yc)
    else:
        weights = np.linalg.solve(xc.T @ xc + strength * np.eye(xc.shape[1]), xc.T @ yc)
    return weights, y_mean - x_mean @ weights


def rmse(prediction: np.ndarray, target: np.ndarray) -> np.ndarray:
    return np.sqrt(((prediction - target) ** 2).mean(0))


def readout(x: np.ndarray, y: np.ndarray, episodes: np.ndarray) -> dict:
    """Held-out RMSE per axis of the ridge read-out whose strength did best on validation."""
    fit, validate = np.isin(episodes, FIT), np.isin(episodes, VALIDATE)
    held_out = ~(fit | validate)
    known = fit | validate
    # standardised on the fit episodes only; a feature that barely varies there (a ReLU map's
    # unit that stays off) is not blown up, or it would swamp the read-out where it does vary
    spread = x[fit].std(0)
    x = (x - x[fit].mean(0)) / np.maximum(spread, STANDARD_FLOOR * spread.mean())

    def validation_error(strength: float) -> float:
        weights, bias = ridge_fit(x[fit], y[fit], strength)
        return float(rmse(x[validate] @ weights + bias, y[validate]).mean())

    strength = min(RIDGE, key=validation_error)
    weights, bias = ridge_fit(x[known], y[known], strength)
    prediction = x[held_out] @ weights + bias
    return {
        "rmse_cm": rmse(prediction, y[held_out]).tolist(),
        "median_abs_error_cm": np.median(np.abs(prediction - y[held_out]), 0).tolist(),
        "baseline_rmse_cm": rmse(np.broadcast_to(y[known].mean(0), y[held_out].shape), y[held_out]).tolist(),
        "ridge": strength,
        "dim": int(x.shape[1]),
    }


def measure() -> dict:
    rows = []
    for size in SIZES:
        started = time.perf_counter()
        frames, cubes, episodes = collect(size)
        print(f"{size} px: {len(frames)} frames in {time.perf_counter() - started:.0f} s", flush=True)
        for backbone_name, features in BACKBONES:
            row = {"size": size, "backbone": backbone_name, "features": features}
            row.update(readout(features_of(backbone_name, features, frames), cubes, episodes))
            rows.append(row)
            print(f"  {backbone_name} {features}: {np.round(row['rmse_cm'], 2)} cm", flush=True)
    return {
        **provenance("encoder_probe.py"),
        "task": TASK,
        "episodes": EPISODES,
        "fit_episodes": [FIT.start, FIT.stop - 1],
        "validation_episodes": [VALIDATE.start, VALIDATE.stop - 1],
        "held_out_episodes": [VALIDATE.stop, EPISODES - 1],
        "first_episode_seed": FIRST_EPISODE_SEED,
        "rows": rows,
    }


def report(result: dict) -> None:
    rows = result["rows"]
    lines = [
        f"# Where the cube is, read linearly from frozen image features ({result['task']})",
        "",
        provenance_line(result),
        "",
        f"{result['episodes']} episodes of the scripted expert with per-episode action noise; ridge fitted on "
        f"episodes {result['fit_episodes'][0]}-{result['fit_episodes'][1]}, its strength chosen on "
        f"{result['validation_episodes'][0]}-{result['validation_episodes'][1]}, scored on the held-out episodes "
        f"{result['held_out_episodes'][0]}-{result['held_out_episodes'][1]} (episode seeds from "
        f"{result['first_episode_seed']}). Baseline: the mean position everywhere (the spread of the cube's position).",
        "",
        "Held-out errors in cm, RMSE and (robust to the few frames where the cube was knocked far off) the median "
        "absolute error, per axis.",
        "",
        "| image | backbone | features | width | RMSE x | RMSE y | median x | median y | baseline RMSE x | y | ridge |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        (x, y), (mx, my), (bx, by) = row["rmse_cm"], row["median_abs_error_cm"], row["baseline_rmse_cm"]
        lines.append(
            f"| {row['size']} px | {row['backbone']} | {row['features']} | {row['dim']} | {x:.2f} | {y:.2f} | "
            f"{mx:.2f} | {my:.2f} | {bx:.2f} | {by:.2f} | {row['ridge']:g} |"
        )
    lines += ["", "![held-out read-out error](encoder_probe.png)"]
    (RESULTS / "encoder_probe.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SIZES), figsize=(4.2 * len(SIZES), 3.4), sharey=True)
    for ax, size in zip(np.atleast_1d(axes), SIZES):
        at_size = [row for row in rows if row["size"] == size]
        labels = [f"{row['backbone'].split('_')[0]}\n{row['features']}" for row in at_size]
        where = np.arange(len(at_size))
        ax.bar(where - 0.2, [np.mean(row["rmse_cm"]) for row in at_size], 0.4, color="tab:gray", label="RMSE")
        ax.bar(where + 0.2, [np.mean(row["median_abs_error_cm"]) for row in at_size], 0.4, label="median error")
        ax.set_xticks(where, labels)
        baseline = float(np.mean(at_size[0]["baseline_rmse_cm"]))
        ax.axhline(baseline, color="tab:red", linestyle="--", label="mean position everywhere (RMSE)")
        ax.set_title(f"{size} px")
        ax.tick_params(axis="x", labelsize=8)
    np.atleast_1d(axes)[0].set_ylabel("held-out error of cube x, y (cm, mean of both)")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "encoder_probe.png", dpi=110)
    plt.close(fig)
    print((RESULTS / "encoder_probe.md").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", choices=["run", "report"], default="run")
    args = parser.parse_args()
    path = RESULTS / "encoder_probe.json"
    if args.mode == "run":
        result = measure()
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
    elif not path.is_file():
        sys.exit(f"{path} is missing: run `python benchmarks/encoder_probe.py` first")
    report(json.loads(path.read_text()))


if __name__ == "__main__":
    main()
