"""Supervised fine-tuning on demonstrations: `embodied sft dataset=<LeRobotDataset> ...`.

Each sample is a frame's observation (state, camera images, instruction) and the actions of
the following frames of its segment, as many as the policy predicts at once (its horizon,
else its chunk size); a segment's last action is repeated past its end. A segment is a run
of selected frames within one episode:

    frames=all             every frame the operator or the policy executed
    frames=interventions   only the operator's corrections (HG-DAgger / RaC-style SFT; with
                           `init=<the deployed run>` a round starts from the policy that was
                           corrected, keeping its input statistics)

Frames where the safety layer's own hold was executed are never demonstrations. The loss is
the policy's `bc_loss` (flow matching, token cross-entropy, Gaussian likelihood). Whole
episodes are held out for a validation loss.

The run directory has the layout of a training run (config.yaml, metrics.jsonl,
tensorboard, checkpoints/), so `embodied eval`, `embodied serve` and `embodied train
init=<run>` take it as they take any run, and `resume=<run>` continues it exactly."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from embodied.algos.datasets import IMAGE_PREFIX, cameras, dataset_info, held_out_episodes, read_frames
from embodied.build import build_env, build_policy, in_this_process, resolve_device
from embodied.config import SFTConfig, override_key, resumed, saved_config, to_schema, to_yaml
from embodied.core.errors import ConfigError
from embodied.core.policy import Policy
from embodied.core.types import EnvSpec, Observation
from embodied.runs.checkpoint import (
    load_checkpoint,
    load_policy_weights,
    resolve_checkpoint,
    run_dir_of,
    save_checkpoint,
    without_pretrained_frozen,
)
from embodied.runs.folders import MetricLogger, drop_metrics_after, new_run_dir, refuse_a_used_run_dir
from embodied.runs.loading import load_run_policy
from embodied.runtime.process import get_rng_state, set_rng_state, start_process

logger = logging.getLogger(__name__)

FRAME_SELECTIONS = ("all", "interventions")


class Demonstrations:
    """The selected frames of a dataset as (observation, action chunk) samples."""

    def __init__(self, root: str | Path, spec: EnvSpec, horizon: int, frames: str = "all"):
        if frames not in FRAME_SELECTIONS:
            raise ConfigError(f"frames must be one of {FRAME_SELECTIONS}, got '{frames}'")
        info = dataset_info(root)
        self.cameras = cameras(info)
        check_dataset_fits(info, spec, root)
        data = read_frames(
            root,
            ["observation.state", "action", "episode_index", "task", *(IMAGE_PREFIX + c for c in self.cameras)],
            optional=("intervention", "safety_override"),
        )
        length = len(data["action"])
        self.state = data["observation.state"].astype(np.float32).reshape(length, -1)
        self.action = data["action"].astype(np.float32).reshape(length, -1)
        self.images = {c: data[IMAGE_PREFIX + c] for c in self.cameras}
        self.instruction = data["task"]
        self.episode = data["episode_index"].astype(np.int64).reshape(-1)
        flag = lambda key: data[key].reshape(-1).astype(bool) if key in data else np.zeros(length, bool)  # noqa: E731
        selected = ~flag("safety_override")
        if frames == "interventions":
            if "intervention" not in data:
                raise ConfigError(f"the dataset at {root} has no intervention flags; use frames=all")
            selected &= flag("intervention")
        self.rows = np.flatnonzero(selected)
        if len(self.rows) == 0:
            raise ConfigError(f"the dataset at {root} has no frames to learn from with frames={frames}")
        # chunk[i, k]: the row whose action is the k-th of sample i's chunk
        same_segment = np.zeros(length, bool)  # row r and r + 1 are one segment
        same_segment[:-1] = selected[:-1] & selected[1:] & (self.episode[:-1] == self.episode[1:])
        chunk = [self.rows]
        for _ in range(1, horizon):
            previous = chunk[-1]
            chunk.append(np.where(same_segment[previous], previous + 1, previous))
        self.chunk = np.stack(chunk, 1)

    @property
    def episodes(self) -> np.ndarray:
        return np.unique(self.episode[self.rows])

    def __len__(self) -> int:
        return len(self.rows)

    def split(self, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Sample indices for training and validation, by whole episodes."""
        in_val = np.isin(self.episode[self.rows], held_out_episodes(self.episodes, val_fraction, seed))
        return np.flatnonzero(~in_val), np.flatnonzero(in_val)

    def batch(self, samples: np.ndarray, device: torch.device) -> tuple[Observation, torch.Tensor]:
        rows = self.rows[samples]
        observation = Observation(
            state=torch.from_numpy(self.state[rows]).to(device),
            images={c: torch.from_numpy(self.images[c][rows]).to(device) for c in self.cameras},
            instruction=[str(t) for t in self.instruction[rows]],
        )
        return observation, torch.from_numpy(self.action[self.chunk[samples]]).to(device)


def check_dataset_fits(info: dict[str, Any], spec: EnvSpec, root: str | Path) -> None:
    """The dataset's state, action and cameras against the env's: every difference named."""
    features = info["features"]
    problems = []
    for key, expected in (("observation.state", spec.state_dim), ("action", spec.action_dim)):
        shape = list(features.get(key, {}).get("shape", []))
        if shape != [expected]:
            problems.append(f"{key} has shape {shape}, the env {[expected]}")
    recorded = {c: list(features[IMAGE_PREFIX + c]["shape"]) for c in cameras(info)}
    expected_images = {c: list(s) for c, s in spec.image_shapes.items()}
    if recorded != expected_images:
        problems.append(f"cameras {recorded}, the env {expected_images}")
    if problems:
        raise ConfigError(f"the dataset at {root} does not fit the env: " + "; ".join(problems))


def env_spec_of(env_cfg: Any, seed: int) -> EnvSpec:
    """The spec of the env a policy is for, from one env per task (in this process where it can live)."""
    env = build_env(
        in_this_process(env_cfg, num_envs=len(getattr(env_cfg, "tasks", None) or [None])), seed=seed, stream=1
    )
    try:
        return env.spec
    finally:
        env.close()


def policy_horizon(policy: Policy) -> int:
    """How many consecutive actions `bc_loss` learns from: the predicted horizon where the
    policy has one (flow), else its chunk size."""
    return int(getattr(getattr(policy, "cfg", None), "horizon", None) or policy.chunk_size)


def sft_keeps(override: str) -> bool:
    """What a resumed SFT run keeps: its env, policy, data and starting weights."""
    return override_key(override).split(".")[0] in ("env", "policy", "dataset", "frames", "init")


def sft_config(overrides: list[str], resume: str | None) -> SFTConfig:
    from embodied.core.compose import compose

    if not resume:
        return to_schema(SFTConfig, compose("sft", overrides))
    run_dir = run_dir_of(resolve_checkpoint(resume))
    # the starting command with resume= added restates the run's settings: those must hold
    merged = resumed(SFTConfig, "sft", saved_config(run_dir / "config.yaml"), overrides, sft_keeps, str(run_dir))
    merged.resume, merged.run_dir = str(run_dir), str(run_dir)
    return to_schema(SFTConfig, merged)


def run_sft(config: SFTConfig) -> Path:
    """Train, checkpoint and return the run directory."""
    if not config.dataset:
        raise ConfigError("sft needs dataset=<LeRobotDataset folder>")
    start_process(config.seed, config.runtime.torch_threads)
    device = resolve_device(config.runtime.device)
    spec = env_spec_of(config.env, config.seed)
    policy = build_policy(config.policy, spec, device)
    demos = Demonstrations(config.dataset, spec, policy_horizon(policy), config.frames)
    train_samples, val_samples = demos.split(config.val_fraction, config.seed)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    generator = np.random.default_rng(config.seed)
    run_dir, config_yaml = open_run_dir(config)
    iteration = restore(config, run_dir, policy, optimizer, generator, demos.rows[train_samples], demos)
    logger.info(
        "SFT on %d frames of %d episodes (%d held out), %s",
        len(train_samples),
        len(demos.episodes),
        len(val_samples),
        config.frames,
    )
    features = frozen_features(policy, demos, config.batch_size, device)
    metrics_log = MetricLogger(
        run_dir, config.logger, OmegaConf.to_container(OmegaConf.create(config_yaml)), step_key="iteration"
    )
    bar = tqdm(
        total=config.iterations,
        initial=iteration,
        unit="iteration",
        desc="sft",
        disable=not config.logger.progress_bar,
        dynamic_ncols=True,
    )
    try:
        policy.train()
        while iteration < config.iterations:
            samples = train_samples[generator.integers(0, len(train_samples), config.batch_size)]
            loss = bc_loss(policy, demos, samples, features, device)
            optimizer.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
            optimizer.step()
            iteration += 1
            bar.update(1)
            if iteration % config.log_every == 0 or iteration == config.iterations:
                metrics = {"sft/loss": float(loss.detach()), "sft/grad_norm": float(grad_norm)}
                if len(val_samples):
                    metrics["sft/val_loss"] = validation_loss(
                        policy, demos, val_samples, features, config.batch_size, device
                    )
                metrics_log.log(metrics, iteration)
                bar.set_postfix(
                    loss=f"{metrics['sft/loss']:.4f}",
                    **({"val": f"{metrics['sft/val_loss']:.4f}"} if "sft/val_loss" in metrics else {}),
                )
            last = iteration == config.iterations
            if last or (config.checkpoint_every > 0 and iteration % config.checkpoint_every == 0):
                save(config, run_dir, config_yaml, spec, policy, optimizer, generator, iteration)
    finally:
        bar.close()
        metrics_log.close()
    return run_dir


def open_run_dir(config: SFTConfig) -> tuple[Path, str]:
    """The run's folder (a new one, or the resumed one) with the config written into it; sets
    `config.run_dir` and returns the config as written."""
    run_dir = Path(config.run_dir) if config.run_dir else new_run_dir(config.runs_root, config.run_name)
    if not config.resume:
        refuse_a_used_run_dir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config.run_dir = str(run_dir)
    config_yaml = to_yaml(config)
    (run_dir / "config.yaml").write_text(config_yaml)
    return run_dir, config_yaml


def restore(
    config: SFTConfig,
    run_dir: Path,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    generator: np.random.Generator,
    train_rows: np.ndarray,
    demos: Demonstrations,
) -> int:
    """The iteration to start from: a resumed run's checkpoint restored (weights, optimizer, sampler,
    RNG, metrics cut back to it), or `init`'s weights, or statistics fitted to the training rows."""
    if config.resume:
        weights, saved = load_checkpoint(resolve_checkpoint(run_dir))
        load_policy_weights(policy, weights, saved)
        optimizer.load_state_dict(saved["sft"]["optimizer"])
        generator.bit_generator.state = saved["sft"]["sampler"]
        iteration = int(saved["iteration"])
        set_rng_state(saved["rng"])
        drop_metrics_after(run_dir, "iteration", iteration, renamed_from="sft_step")
        return iteration
    if config.init:  # e.g. the deployed policy, for a round of HG-DAgger on its corrections
        load_run_policy(config.init, into=policy, label=f"policy '{config.policy.name}' on this env")
    else:  # statistics from the demonstrations, once: the policy meets these states first
        policy.fit_statistics(
            Observation(state=torch.from_numpy(demos.state[train_rows]).to(policy.device)),
            torch.from_numpy(demos.action[train_rows]).to(policy.device),
        )
    return 0


def save(
    config: SFTConfig,
    run_dir: Path,
    config_yaml: str,
    spec: EnvSpec,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    generator: np.random.Generator,
    iteration: int,
) -> None:
    """Checkpoint `iter_<iteration>`: the trained weights (a frozen pretrained part left out) and
    what resuming needs, in the layout `embodied train` writes, so serve and evaluate load it."""
    weights, left_out = without_pretrained_frozen(policy, {k: v.detach().cpu() for k, v in policy.state_dict().items()})
    state = {
        "sft": {"optimizer": optimizer.state_dict(), "sampler": generator.bit_generator.state},
        "rng": get_rng_state(),
        "iteration": iteration,
        "env_steps": 0,
        "learner": {"policy_version": 0},
        "spec": spec.to_dict(),
        "episodes": [],
        "pretrained_frozen": left_out,
    }
    save_checkpoint(
        run_dir / "checkpoints", f"iter_{iteration:06d}", weights, state, config_yaml, keep=config.keep_checkpoints
    )


@torch.no_grad()
def frozen_features(
    policy: Policy, demos: Demonstrations, batch_size: int, device: torch.device
) -> torch.Tensor | None:
    """Every sample's frozen-encoder features, computed once (images through a pretrained
    encoder cost far more than the trainable part); None for policies without any."""
    everything = np.arange(len(demos))
    first = policy.frozen_features(demos.batch(everything[:1], device)[0])
    if first is None:
        return None
    parts = np.array_split(everything, max(1, -(-len(everything) // batch_size)))
    return torch.cat([policy.frozen_features(demos.batch(part, device)[0]) for part in parts])


def bc_loss(
    policy: Policy, demos: Demonstrations, samples: np.ndarray, features: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    observation, actions = demos.batch(samples, device)
    if features is None:
        return policy.bc_loss(observation, actions)
    return policy.bc_loss(observation, actions, features=features[torch.as_tensor(samples)])


@torch.no_grad()
def validation_loss(
    policy: Policy,
    demos: Demonstrations,
    samples: np.ndarray,
    features: torch.Tensor | None,
    batch_size: int,
    device: torch.device,
) -> float:
    """The mean loss over the held-out samples. It draws from torch's generator (flow
    matching samples t and noise), so a fork keeps training's stream untouched."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        policy.eval()
        losses = [
            float(bc_loss(policy, demos, part, features, device)) * len(part)
            for part in np.array_split(samples, max(1, -(-len(samples) // batch_size)))
        ]
        policy.train()
    return sum(losses) / len(samples)
