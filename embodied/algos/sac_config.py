"""algo=sac_rlpd's settings and their checks (`embodied/algos/sac_rlpd.py` says what each does)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from embodied.core.errors import ConfigError


@dataclass
class SACConfig:
    name: str = "sac_rlpd"
    rollout_steps: int = 1  # env steps per batch handed to the learner
    gamma: float = 0.99
    tau: float = 0.005  # Polyak rate of the target critics
    batch_size: int = 256
    utd_ratio: int = 4  # critic updates per collected transition
    # critic updates per actor update (SERL's critic_actor_ratio), counted over the run's critic
    # updates; None: one actor update per collected transition
    actor_every: Optional[int] = None
    num_critics: int = 10
    critic_subset: int = 2  # the target takes the min over this many randomly chosen critics
    critic_hidden: list[int] = field(default_factory=lambda: [256, 256])
    critic_layer_norm: bool = True
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    temperature_lr: float = 3e-4
    init_temperature: float = 1.0
    target_entropy: Optional[float] = None  # default: -action_dim / 2
    backup_entropy: bool = True  # the target subtracts alpha * log pi(a'|s')
    replay_capacity: int = 200_000
    dataset: Optional[str] = None  # a LeRobotDataset of demonstrations/corrections (robots/recording.py)
    offline_fraction: float = 0.5  # of each batch from demos + interventions, while there are any
    retain_offline: bool = True  # WSRL: false drops the offline data once online learning starts
    online_bc: bool = False  # with retain_offline=false and bc_weight > 0: the actor's BC term keeps the demos
    warmup_steps: int = 0  # WSRL: env steps collected by the frozen policy before online updates
    online_temperature: Optional[float] = None  # the temperature online learning starts from (None: as it is)
    # env steps after the hand-over in which only the critics learn (the actor and temperature
    # wait): the critics fit the online data before the actor follows them
    critic_warmup_steps: int = 0
    offline_pretrain_steps: int = 0  # gradient steps on the offline data before any env step
    critic_loss: str = "mse"  # mse | hl_gauss
    hl_gauss_bins: int = 101
    hl_gauss_low: float = -100.0
    hl_gauss_high: float = 100.0
    hl_gauss_sigma_ratio: float = 0.75  # sigma as a multiple of the bin width
    calql_alpha: float = 0.0  # > 0: the Cal-QL conservative term on offline batches
    calql_actions: int = 4  # sampled actions per state (each: policy and uniform) in that term
    bc_weight: float = 0.0  # > 0: the actor mode's squared error to the offline rows' actions, weighted
    # from pixels: none (features cached per frame) | shift (DrQ, every batch through the backbone) |
    # cached_shifts (the features of `cached_shifts` shifted views cached per frame, one drawn per sample)
    image_augmentation: str = "none"
    cached_shifts: int = 4
    # from pixels: own (the actor projects the frozen features with its own trainable head, which
    # its loss trains) | critics (HIL-SERL: the actor reads the critics' projection, detached, so
    # the critics' TD loss alone shapes the image representation and the actor's BC and Q terms
    # cannot fit it to the demos' frames)
    actor_projection: str = "own"
    shift_pad: int = 4  # pixels of DrQ's random shift
    feature_batch: int = 256  # frames per backbone pass when caching features, their shifted views included
    seed: int = 0  # seeds critics, replay sampling and target subsets; configs/algo sets the run's seed


def check_sac_config(cfg: SACConfig) -> None:
    if cfg.critic_loss not in ("mse", "hl_gauss"):
        raise ConfigError(f"algo.critic_loss must be mse or hl_gauss, got '{cfg.critic_loss}'")
    if not 1 <= cfg.critic_subset <= cfg.num_critics:
        raise ConfigError(f"algo.critic_subset must be in [1, num_critics={cfg.num_critics}], got {cfg.critic_subset}")
    if not 0 <= cfg.offline_fraction < 1:
        raise ConfigError(f"algo.offline_fraction must be in [0, 1), got {cfg.offline_fraction}")
    for key in ("utd_ratio", "batch_size", "rollout_steps", "calql_actions"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"algo.{key} must be >= 1, got {getattr(cfg, key)}")
    if cfg.actor_every is not None and cfg.actor_every < 1:
        raise ConfigError(f"algo.actor_every must be >= 1 (or null: one per transition), got {cfg.actor_every}")
    for key in ("warmup_steps", "critic_warmup_steps", "offline_pretrain_steps", "calql_alpha", "bc_weight"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"algo.{key} must be >= 0, got {getattr(cfg, key)}")
    if cfg.online_temperature is not None and cfg.online_temperature <= 0:
        raise ConfigError(f"algo.online_temperature must be > 0 (or null), got {cfg.online_temperature}")
    if cfg.actor_projection not in ("own", "critics"):
        raise ConfigError(f"algo.actor_projection must be own or critics, got '{cfg.actor_projection}'")
    if cfg.image_augmentation not in ("none", "shift", "cached_shifts"):
        raise ConfigError(
            f"algo.image_augmentation must be none, shift or cached_shifts, got '{cfg.image_augmentation}'"
        )
    if cfg.cached_shifts < 1:
        raise ConfigError(f"algo.cached_shifts must be >= 1, got {cfg.cached_shifts}")
    if cfg.shift_pad < 0 or cfg.feature_batch < 1:
        raise ConfigError(
            f"algo.shift_pad must be >= 0 and algo.feature_batch >= 1, got {cfg.shift_pad}, {cfg.feature_batch}"
        )
    if cfg.online_bc and (cfg.retain_offline or not cfg.bc_weight):
        raise ConfigError(
            "algo.online_bc keeps the demos for the actor's BC term once retain_offline=false drops them from "
            f"the critics' batches: it needs algo.retain_offline=false and algo.bc_weight > 0 (got "
            f"retain_offline={cfg.retain_offline}, bc_weight={cfg.bc_weight})"
        )
    if (cfg.offline_pretrain_steps or cfg.calql_alpha) and not cfg.dataset:
        raise ConfigError("offline pretraining and Cal-QL need offline data: set algo.dataset=<LeRobotDataset folder>")
