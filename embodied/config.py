"""Hydra configs -> typed dataclass schemas, once, at the entry point.

The top level is `TrainConfig`; each of the groups env/policy/algo/runtime is validated
against the schema its registry entry declares, chosen by the group's `name`. A wrong key or
type fails here with the full key in the message, before anything is built."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from embodied.core.compose import RENAMED, RENAMED_IN, compose, load_yaml, renamed, validate
from embodied.core.errors import ConfigError
from embodied.core.operator import OperatorConfig
from embodied.core.registry import ALGOS, ENVS, POLICIES, RUNTIMES, Registry
from embodied.runtime.configs import DeviceConfig

GROUPS: dict[str, Registry] = {"env": ENVS, "policy": POLICIES, "algo": ALGOS, "runtime": RUNTIMES}


@dataclass
class LoggerConfig:
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "embodied"
    progress_bar: bool = True


@dataclass
class RewardConfig:
    classifier: Optional[str] = None  # a reward classifier run (`embodied reward`); None: the env's own reward
    threshold: float = 0.5  # success probability above which a step is rewarded


@dataclass
class TrainConfig:
    env: Any = None
    policy: Any = None
    algo: Any = None
    runtime: Any = None
    seed: int = 1
    total_env_steps: int = 200_000
    time_limit_s: Optional[float] = None  # also stop once the run has trained this long (all resumptions)
    run_name: str = "train"
    runs_root: str = "runs"
    run_dir: Optional[str] = None  # default: <runs_root>/<run_name>-<timestamp>
    resume: Optional[str] = None  # a run directory to continue from its latest checkpoint
    init: Optional[str] = None  # a run or checkpoint whose policy weights a new run starts from (e.g. an SFT run)
    # On resume, the episodes in progress at the checkpoint: replay them exactly (a simulator
    # whose physics does not depend on its history) or start new ones.
    env_resume: str = "replay"
    checkpoint_every: int = 10  # iterations (a rollout and the update on it)
    keep_checkpoints: int = 3
    eval_episodes: int = 50  # evaluated after training; 0 to skip
    eval_video_episodes: int = 0
    eval_every: int = 0  # iterations between evaluations during training; 0: none
    periodic_eval_episodes: int = 16
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    operator: OperatorConfig = field(default_factory=OperatorConfig)  # who corrects the learner in simulation
    # The env's reward, or a success classifier's on camera images.
    reward: RewardConfig = field(default_factory=RewardConfig)


@dataclass
class SFTConfig:
    """`embodied sft`: supervised fine-tuning (behaviour cloning) on a LeRobotDataset."""

    env: Any = None  # the env the policy is for: its spec must match the dataset's
    policy: Any = None
    dataset: Optional[str] = None  # a LeRobotDataset folder (demos, `embodied collect`, tools/demos.py)
    frames: str = "all"  # all | interventions (HG-DAgger: only the operator's corrections)
    init: Optional[str] = None  # a run or checkpoint whose policy weights (and input statistics) to start from
    iterations: int = 2000  # gradient steps, one batch each
    batch_size: int = 256
    lr: float = 3e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    val_fraction: float = 0.1  # episodes held out for the validation loss (at least one when there are two)
    seed: int = 1
    runtime: DeviceConfig = field(default_factory=DeviceConfig)  # runtime.device, runtime.torch_threads
    run_name: str = "sft"
    runs_root: str = "runs"
    run_dir: Optional[str] = None
    resume: Optional[str] = None  # an SFT run directory to continue
    checkpoint_every: int = 500  # iterations; the last one is always saved
    keep_checkpoints: int = 3
    log_every: int = 50  # iterations between logged losses (the validation loss too)
    eval_episodes: int = 20  # evaluated in the env after training; 0 to skip
    logger: LoggerConfig = field(default_factory=LoggerConfig)


@dataclass
class EvalConfig:
    GROUPS_OPTIONAL: ClassVar[bool] = True  # a run's checkpoint names its env and policy
    checkpoint: Optional[str] = None  # a run directory or one checkpoint directory in it
    env: Any = None  # default: the env the checkpoint was trained on
    # instead of checkpoint: a published model as it is (policy=pi05 policy.pretrained=<dir>)
    policy: Any = None
    episodes: int = 50
    video_episodes: int = 0
    deterministic: bool = True
    seed: int = 0
    output: Optional[str] = None  # default: <run dir>/eval/<env task or suites>
    progress_bar: bool = True
    # Suite mode: every task of these suites (one, or a list: suite=[libero_spatial,libero_goal]),
    # `trials` each, trial k reset with seed k; resumable. `episodes` is then unused.
    suite: Any = None  # one suite, or several as a list: suite=[libero_spatial,libero_spatial_swap]
    trials: int = 50  # per task in suite mode; trial k is reset with seed k (LIBERO: init state k)
    task_ids: Optional[list[int]] = None  # a subset of each suite's tasks


def check_values(config: Any) -> None:
    """Range checks the types alone do not catch."""
    positive = {
        "TrainConfig": ("total_env_steps",),
        "EvalConfig": ("episodes", "trials"),
        "SFTConfig": ("iterations", "batch_size", "log_every"),
    }.get(type(config).__name__, ())
    for key in positive:
        if getattr(config, key) < 1:
            raise ConfigError(f"'{key}' must be >= 1, got {getattr(config, key)}")
    if getattr(config, "time_limit_s", None) is not None and config.time_limit_s <= 0:
        raise ConfigError(f"'time_limit_s' must be > 0 (or null for no limit), got {config.time_limit_s}")
    if getattr(config, "env_resume", "replay") not in ("replay", "fresh"):
        raise ConfigError(f"'env_resume' must be 'replay' or 'fresh', got '{config.env_resume}'")
    for key in ("seed", "eval_episodes", "eval_video_episodes", "video_episodes", "checkpoint_every", "eval_every"):
        if getattr(config, key, 0) < 0:
            raise ConfigError(f"'{key}' must be >= 0, got {getattr(config, key)}")


def validate_group(group: str, section: Any) -> Any:
    import embodied.components  # noqa: F401  (the built-in components' registry entries, at the first validation)

    if section is None:
        raise ConfigError(f"no '{group}' config selected; pass {group}=<name>")
    if is_dataclass(section):
        return section
    name = section.get("name") if isinstance(section, (dict, DictConfig)) else None
    if name is None:
        raise ConfigError(f"config group '{group}' has no 'name' key naming which {group} to use")
    message = renamed(f"{group}={name}")
    if message:
        raise ConfigError(
            f"{message}: change '{group}.name' in the config (a saved run's config.yaml) to "
            f"'{RENAMED[f'{group}={name}'].split('=', 1)[1]}'"
        )
    entry = GROUPS[group].get(name)
    return validate(entry.schema, section, f"{group}.")


def to_schema(schema: type, cfg: DictConfig | dict) -> Any:
    """Validate the top level, then each component group against its registered schema."""
    cfg = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
    # a component group is a field typed Any (its schema comes from the registry); serve's and
    # sft's `runtime:` is a block of its own (DeviceConfig), not training's runtime group
    group_names = [f.name for f in fields(schema) if f.name in GROUPS and f.type in (Any, "Any")]
    top = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k not in group_names])
    config = validate(schema, top, "")
    check_values(config)
    # A group's interpolations (an algo's `seed: ${seed}`) resolve against the top level, its
    # defaults included, before the group is validated on its own.
    scope = OmegaConf.structured(config)
    for group in group_names:
        scope[group] = cfg.get(group)
    try:
        resolved = OmegaConf.to_container(scope, resolve=True)
    except OmegaConfBaseException as error:
        raise ConfigError(f"config error at '{getattr(error, 'full_key', None) or '?'}': {error}") from None
    for group in group_names:
        section = resolved.get(group)
        if section is None and getattr(schema, "GROUPS_OPTIONAL", False):
            continue
        setattr(config, group, validate_group(group, section))
    return config


def to_yaml(config: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def saved_config(path: Path) -> DictConfig:
    """A run's saved config.yaml (a training or an SFT run's) in today's names: each key renamed
    since (RENAMED, and RENAMED_IN for its kind of run) moves to its new name, e.g. a run written
    before the `operator:` block has `intervention.expert` where `operator.policy` is now, and an
    SFT run written before `runtime.device` has `device`."""
    saved = load_yaml(path)
    kind = "sft" if "dataset" in saved else "train"
    for old, new in {**RENAMED, **RENAMED_IN.get(kind, {})}.items():
        if "=" in old:  # a group's option, not a key
            continue
        *parents, leaf = old.split(".")
        block = OmegaConf.select(saved, ".".join(parents)) if parents else saved
        if not isinstance(block, DictConfig) or leaf not in block or OmegaConf.select(saved, new) is not None:
            continue
        OmegaConf.update(saved, new, block.pop(leaf), force_add=True)
        if parents and not block:  # a block whose keys all moved
            outer = OmegaConf.select(saved, ".".join(parents[:-1])) if parents[:-1] else saved
            outer.pop(parents[-1])
    policy = saved.get("policy")
    if isinstance(policy, DictConfig) and policy.get("name") == "openvla" and "cameras" in policy:
        # OpenVLA chose its cameras by a list before it took policy.features as pi0 does
        policy.features = ",".join(f"{camera}={camera}" for camera in policy.pop("cameras"))
    return saved


def checkpoint_config(checkpoint: Path) -> Any:
    """The config a checkpoint was written with: a training run's or an SFT run's. Both name
    the env and the policy, which is what loading the policy needs."""
    saved = saved_config(checkpoint / "config.yaml")
    policy = saved.get("policy") or {}
    if policy.get("name") in ("pi0", "pi05") and policy.get("pretrained") and "normalization" not in policy:
        # written before pi0 read its checkpoint's statistics: the run kept running ones
        saved.policy.normalization = "running"
    return to_schema(SFTConfig if "dataset" in saved else TrainConfig, saved)


# ---- resuming with the starting command restated ----------------------------------------------
def override_key(override: str) -> str:
    """`key` of a command-line `key=value` (Hydra's `+` prefix dropped)."""
    return override.lstrip("+").split("=", 1)[0]


def resumed(
    schema: type,
    config_name: str,
    saved: DictConfig,
    overrides: list[str],
    is_fixed: Callable[[str], bool],
    resume: str,
) -> DictConfig:
    """A run's saved config with the overrides its resume command gives: the settings the run
    keeps (`is_fixed`) may only be restated (checked), the others are merged in."""
    overrides = [o for o in overrides if override_key(o) != "resume"]
    refuse_changes(schema, config_name, to_schema(schema, saved), overrides, is_fixed, resume)
    changed = [o for o in overrides if override_key(o) not in GROUPS]  # a group=option is checked, not merged
    return OmegaConf.merge(saved, OmegaConf.from_dotlist(changed))


def refuse_changes(
    schema: type, config_name: str, saved: Any, overrides: list[str], is_fixed: Callable[[str], bool], resume: str
) -> None:
    """Each setting a resumed run keeps (`is_fixed`) that a command restates must hold the run's
    value: a `group=option` stands for the whole section it composes (with the command's keys
    of that group), any other `key=value` for that key. The first that differs is refused with
    both values, so the command that started a run may be given again with resume= added."""
    fixed = [override_key(o) for o in overrides if is_fixed(o)]
    chosen = {key for key in fixed if key in GROUPS}  # groups restated as group=option
    restated: dict[str, Any] = {}
    if chosen:
        kept = [o for o in overrides if not is_fixed(o) or override_key(o).split(".")[0] in chosen]
        fresh = to_schema(schema, compose(config_name, [f"seed={saved.seed}", *kept]))  # algo.seed: ${seed}
        for group in chosen:
            restated.update(flatten(asdict(getattr(fresh, group)), group))
    plain = [o.lstrip("+") for o in overrides if is_fixed(o) and override_key(o).split(".")[0] not in chosen]
    values = OmegaConf.to_container(OmegaConf.from_dotlist(plain))
    restated.update({override_key(o): value_at(values, override_key(o)) for o in plain})
    for path, now in restated.items():
        was = value_at(saved, path)
        if was is not MISSING and was != now:
            raise ConfigError(
                f"cannot change '{path}' when resuming {resume} (the run has {was!r}, this command "
                f"{now!r}): start a new run instead, or leave it out"
            )


def flatten(node: Any, prefix: str) -> dict[str, Any]:
    """A nested dict as dotted paths to its leaves (lists are leaves)."""
    if not isinstance(node, dict):
        return {prefix: node}
    return {path: value for key, item in node.items() for path, value in flatten(item, f"{prefix}.{key}").items()}


MISSING = object()


def value_at(config: Any, path: str) -> Any:
    """The value at a dotted path of a dataclass or dict, or MISSING."""
    for part in path.split("."):
        config = config.get(part, MISSING) if isinstance(config, dict) else getattr(config, part, MISSING)
        if config is MISSING:
            return MISSING
    return config
