"""A success classifier on camera images, trained from labelled frames, used as the env
reward where the env has none (a real robot) or to learn without a hand-written one.

    embodied reward dataset=data/pickcube-rgb positive_tail=10
    embodied train ... reward.classifier=runs/reward-20260101-120000 reward.threshold=0.7

Frames come from a LeRobotDataset (`embodied collect`, `embodied robot record.dataset=`,
`embodied demos env.obs_mode=rgb`). A frame is positive when it is one of the last
`positive_tail` frames of an episode labelled a success (the robot client's `y` key, or the
env's success), every other frame is negative: the operator marks when the task is done, and
the frames just before that look done too.

The model is HIL-SERL's recipe with this project's pretrained encoder: frozen
EfficientNet-Lite0 features of each camera (`embodied.policies.encoders`), concatenated, and a small
trainable MLP giving one logit. The encoder's features are computed once per frame, so
training the head takes seconds on a CPU. Positives are weighted by the class ratio.

As the env reward, the model and its env wrapper live in `embodied.runtime.classified_reward`."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from embodied.algos.datasets import IMAGE_PREFIX, cameras, dataset_info, held_out_episodes, read_frames
from embodied.core.errors import ConfigError
from embodied.runs.checkpoint import save_checkpoint
from embodied.runtime.classified_reward import RewardClassifier

logger = logging.getLogger(__name__)


@dataclass
class RewardClassifierConfig:
    dataset: Optional[str] = None  # a LeRobotDataset with camera images
    positive_tail: int = 10  # the last frames of a successful episode that count as success
    hidden: list[int] = field(default_factory=lambda: [256])
    iterations: int = 500  # gradient steps, one batch each
    batch_size: int = 256
    lr: float = 1e-3
    val_fraction: float = 0.2  # episodes held out for accuracy, precision and recall
    threshold: float = 0.5  # for the held-out metrics (usage sets its own)
    seed: int = 1
    run_name: str = "reward"
    runs_root: str = "runs"
    run_dir: Optional[str] = None


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
    from embodied.runs.folders import new_run_dir

    if not config.dataset:
        raise ConfigError("the reward classifier needs dataset=<LeRobotDataset with camera images>")
    if config.positive_tail < 1 or config.iterations < 1:
        raise ConfigError("positive_tail and iterations must be >= 1")
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
    for _ in range(config.iterations):
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
        f"iter_{config.iterations:06d}",
        {k: v.detach() for k, v in model.head.state_dict().items()},
        state,
        config_yaml,
    )
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return run_dir, metrics
