"""The image success classifier as the env reward: the model (frozen EfficientNet-Lite0 features
of each camera, concatenated, and a small trainable MLP giving one logit), loaded from the run
`embodied reward` trained, and the env wrapper that rewards each step by its verdict.

Each step's reward is 1 where the probability for the observation the step led to exceeds
`reward.threshold`, else 0, per executed action. The env's own success and episode statistics
are left as they are: in simulation they show whether the classifier's reward leads to true
success."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.config import RewardConfig
from embodied.core.env import BatchedEnv
from embodied.core.errors import ConfigError
from embodied.core.types import Observation, StepResult
from embodied.runs.checkpoint import load_checkpoint, resolve_checkpoint

logger = logging.getLogger(__name__)


class RewardClassifier(nn.Module):
    def __init__(self, camera_names: list[str], hidden: list[int]):
        super().__init__()
        from embodied.policies.encoders import EfficientNetLite0
        from embodied.policies.gaussian.mlp import mlp

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
