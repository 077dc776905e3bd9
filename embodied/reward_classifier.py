"""A success classifier on camera images, trained from labelled frames, used as the env
reward where the env has none (a real robot) or to learn without a hand-written one.

    embodied reward dataset=data/pickcube-rgb positive_tail=10
    embodied train ... reward.classifier=runs/reward-20260101-120000 reward.threshold=0.7

Frames come from a LeRobotDataset (`embodied collect`, `embodied robot record.root=`,
`embodied demos env.obs_mode=rgb`). A frame is positive when it is one of the last
`positive_tail` frames of an episode labelled a success (the robot client's `y` key, or the
env's success), every other frame is negative: the operator marks when the task is done, and
the frames just before that look done too.

The model is HIL-SERL's recipe with this project's pretrained encoder: frozen
EfficientNet-Lite0 features of each camera (`embodied.policies.encoders`), concatenated, and a small
trainable MLP giving one logit. The encoder's features are computed once per frame, so
training the head takes seconds on a CPU. Positives are weighted by the class ratio.

As the env reward (`ClassifiedReward`), each step's reward is 1 where the probability for
the observation the step led to exceeds `threshold`, else 0, per executed action. The env's
own success and episode statistics are left as they are: in simulation they show whether
the classifier's reward leads to true success."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from embodied.algos.datasets import IMAGE_PREFIX, cameras, dataset_info, held_out_episodes, read_frames
from embodied.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint
from embodied.config import RewardConfig
from embodied.core.env import BatchedEnv
from embodied.core.errors import ConfigError
from embodied.core.types import Observation, StepResult

logger = logging.getLogger(__name__)


@dataclass
class RewardClassifierConfig:
    dataset: Optional[str] = None  # a LeRobotDataset with camera images
    positive_tail: int = 10  # the last frames of a successful episode that count as success
    hidden: list[int] = field(default_factory=lambda: [256])
    steps: int = 500
    batch_size: int = 256
    lr: float = 1e-3
    val_fraction: float = 0.2  # episodes held out for accuracy, precision and recall
    threshold: float = 0.5  # for the held-out metrics (usage sets its own)
    seed: int = 1
    run_name: str = "reward"
    runs_root: str = "runs"
    run_dir: Optional[str] = None


class RewardClassifier(nn.Module):
    def __init__(self, camera_names: list[str], hidden: list[int]):
        super().__init__()
        from embodied.policies.encoders import EfficientNetLite0
        from embodied.policies.mlp import mlp

        self.cameras = list(camera_names)
        object.__setattr__(self, "encoder", EfficientNetLite0.pretrained())  # frozen, from its package
        self.head = mlp([len(self.cameras) * EfficientNetLite0.feature_dim, *hidden, 1], nn.ReLU, out_gain=1.0)

    @torch.no_grad()
    def features(self, images: dict[str, torch.Tensor]) -> torch.Tensor:
        missing = [c for c in self.cameras if c not in images]
        if missing:
            raise ConfigError(f"the reward classifier reads cameras {self.cameras}; the observation lacks {missing}")
        return torch.cat([self.encoder.features(images[c].cpu()) for c in self.cameras], -1)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(features).squeeze(-1)

    @torch.no_grad()
    def probability(self, images: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B,) success probability of uint8 (B, H, W, 3) images per camera."""
        return torch.sigmoid(self.logits(self.features(images)))


def frame_labels(episode: np.ndarray, success: np.ndarray, tail: int) -> np.ndarray:
    """Positive: the last `tail` frames of each episode whose last frame says success."""
    labels = np.zeros(len(episode), bool)
    for index in np.unique(episode):
        rows = np.flatnonzero(episode == index)
        if success[rows[-1]]:
            labels[rows[-tail:]] = True
    return labels


def train_reward_classifier(config: RewardClassifierConfig) -> tuple[Path, dict[str, float]]:
    """Train the head, save it as a checkpoint and return the run dir and held-out metrics."""
    from embodied.runs import new_run_dir

    if not config.dataset:
        raise ConfigError("the reward classifier needs dataset=<LeRobotDataset with camera images>")
    if config.positive_tail < 1 or config.steps < 1:
        raise ConfigError("positive_tail and steps must be >= 1")
    info = dataset_info(config.dataset)
    names = cameras(info)
    if not names:
        raise ConfigError(f"the dataset at {config.dataset} has no camera images to classify")
    frames = read_frames(config.dataset, ["episode_index", "next.success", *(IMAGE_PREFIX + c for c in names)])
    episode = frames["episode_index"].astype(np.int64).reshape(-1)
    labels = frame_labels(episode, frames["next.success"].reshape(-1).astype(bool), config.positive_tail)
    if labels.all() or not labels.any():
        raise ConfigError(
            f"the dataset at {config.dataset} gives only {'positive' if labels.any() else 'negative'} "
            "frames; the classifier needs successful episodes and frames that are not successes"
        )
    torch.manual_seed(config.seed)
    model = RewardClassifier(names, config.hidden)
    features = torch.cat(
        [
            model.features({c: torch.from_numpy(frames[IMAGE_PREFIX + c][part]) for c in names})
            for part in np.array_split(np.arange(len(labels)), max(1, len(labels) // 64))
        ]
    )
    target = torch.from_numpy(labels).float()
    val = np.isin(episode, held_out_episodes(np.unique(episode), config.val_fraction, config.seed))
    train_rows = np.flatnonzero(~val)
    positives = max(float(target[train_rows].sum()), 1.0)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor((len(train_rows) - positives) / positives))
    optimizer = torch.optim.Adam(model.head.parameters(), lr=config.lr)
    generator = np.random.default_rng(config.seed)
    for _ in range(config.steps):
        rows = train_rows[generator.integers(0, len(train_rows), config.batch_size)]
        loss = loss_fn(model.logits(features[rows]), target[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    metrics = {"train_loss": float(loss.detach())}
    if val.any():
        with torch.no_grad():
            predicted = torch.sigmoid(model.logits(features[val])).numpy() > config.threshold
        truth = labels[val]
        metrics.update(
            val_accuracy=float((predicted == truth).mean()),
            val_precision=float((predicted & truth).sum() / max(predicted.sum(), 1)),
            val_recall=float((predicted & truth).sum() / max(truth.sum(), 1)),
        )
    run_dir = Path(config.run_dir) if config.run_dir else new_run_dir(config.runs_root, config.run_name)
    run_dir.mkdir(parents=True, exist_ok=True)
    state = {
        "cameras": names,
        "hidden": list(config.hidden),
        "metrics": metrics,
        "image_shapes": {c: list(info["features"][IMAGE_PREFIX + c]["shape"]) for c in names},
    }
    config_yaml = json.dumps(asdict(config), indent=2)  # JSON is YAML
    (run_dir / "config.yaml").write_text(config_yaml)
    save_checkpoint(
        run_dir / "checkpoints",
        f"iter_{config.steps:06d}",
        {k: v.detach() for k, v in model.head.state_dict().items()},
        state,
        config_yaml,
    )
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return run_dir, metrics


def load_reward_classifier(path: str | Path) -> RewardClassifier:
    checkpoint = resolve_checkpoint(path)
    weights, state = load_checkpoint(checkpoint)
    if "cameras" not in state:
        raise ConfigError(f"{checkpoint} is not a reward classifier (train one with `embodied reward`)")
    model = RewardClassifier(state["cameras"], state["hidden"])
    model.head.load_state_dict(weights)
    return model.eval()


class ClassifiedReward(BatchedEnv):
    """A batched env whose reward is the classifier's verdict on each step's outcome."""

    def __init__(self, env: BatchedEnv, cfg: RewardConfig):
        if not 0.0 <= cfg.threshold <= 1.0:
            raise ConfigError(f"reward.threshold must be in [0, 1], got {cfg.threshold}")
        self.env, self.threshold = env, cfg.threshold
        self.model = load_reward_classifier(cfg.classifier)
        missing = [c for c in self.model.cameras if c not in env.spec.image_shapes]
        if missing:
            raise ConfigError(
                f"reward.classifier reads cameras {self.model.cameras}; the env has "
                f"{sorted(env.spec.image_shapes)} (use env.obs_mode=rgb)"
            )
        self.spec, self.num_envs = env.spec, env.num_envs

    def __getattr__(self, name: str) -> Any:  # tasks, instructions, worker counters...
        env = self.__dict__.get("env")
        if env is None:
            raise AttributeError(name)
        return getattr(env, name)

    def step(self, actions: np.ndarray) -> StepResult:
        result = self.env.step(actions)
        done = result.terminated | result.truncated
        outcome = {
            c: np.where(done[:, None, None, None], result.final_observation.images[c], result.observation.images[c])
            for c in self.model.cameras
        }
        success = self.model.probability({c: torch.from_numpy(v) for c, v in outcome.items()}).numpy() > self.threshold
        result.reward = (success * result.executed_steps).astype(np.float32)
        return result

    def reset(self, seeds: Any = None, env_idx: Any = None) -> Observation:
        return self.env.reset(seeds, env_idx)

    def rewind(self) -> Observation:
        return self.env.rewind()

    def recover(self) -> Observation:
        return self.env.recover()

    def resume_state(self) -> dict[str, Any] | None:
        return self.env.resume_state()

    def restore(self, state: dict[str, Any] | None) -> Observation:
        return self.env.restore(state)

    def render(self, env_idx: int = 0) -> np.ndarray:
        return self.env.render(env_idx)

    def close(self) -> None:
        self.env.close()


def with_reward(env: BatchedEnv, cfg: RewardConfig) -> BatchedEnv:
    """The env, with the classifier's reward where `reward.classifier` names one."""
    if not cfg.classifier:
        return env
    logger.info("reward from the classifier at %s (threshold %.2f)", cfg.classifier, cfg.threshold)
    return ClassifiedReward(env, cfg)
