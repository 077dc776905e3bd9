"""Hydra composition and dataclass validation, shared by the training side and the robot
client (which must not import torch): the configs are package data, `embodied.configs`."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from embodied.core.errors import ConfigError

CONFIG_DIR = Path(str(resources.files("embodied.configs")))  # a checkout's configs/, or the installed wheel's

# Names that were changed: an old one is refused with its new name, never taken silently.
# "group=option" for a config group's option, "group.key" for a key.
RENAMED = {
    "policy=flow_vlm": "policy=vlm_expert",  # one letter from flow_vla, a different model
    "policy.checkpoint": "policy.pretrained",  # pi0 / pi0.5's pretrained model, not one of our checkpoints
    # one `operator:` block for whoever takes over in simulation, in training and on a robot
    "intervention.expert": "operator.policy",
    **{f"intervention.{key}": f"operator.{key}" for key in ("threshold", "patience", "release", "max_takeover")},
    "teleop.expert": "teleop.operator.policy",
    **{f"teleop.{key}": f"teleop.operator.{key}" for key in ("threshold", "patience", "release", "max_takeover")},
    # one key for a dataset's folder: `dataset` (as `embodied sft dataset=` has it)
    "record.root": "record.dataset",
    "algo.demos": "algo.dataset",  # RLPD's and DSRL's offline data, a dataset folder like the others
    # one key for whose statistics a pretrained checkpoint acts with (openpi's and OpenVLA's names)
    "policy.asset_id": "policy.statistics_key",
    "policy.unnorm_key": "policy.statistics_key",
}
# Keys renamed in one config only: config name -> {old key: new key}.
RENAMED_IN = {
    "demos": {"root": "dataset"},
    # device settings under `runtime.`, as training has them
    "serve": {"device": "runtime.device", "torch_threads": "runtime.torch_threads"},
    # every `*_every` counts iterations: an SFT iteration is one gradient step
    "sft": {"device": "runtime.device", "steps": "iterations"},
    "reward": {"steps": "iterations"},
}


def renamed(name: str) -> str | None:
    """The message for an old name (`group=option` or `group.key`), or None."""
    new = RENAMED.get(name)
    return f"'{name}' was renamed '{new}'" if new else None


def closest(name: str, known: list[str]) -> str:
    """' (did you mean 'x'?)' for the known name nearest a misspelled one, or ''."""
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def is_group(key: str) -> bool:
    """Whether `key` (of `key=value`) chooses a config group's option (`env=...`)."""
    return "@" not in key and (CONFIG_DIR / key).is_dir()


def group_options(group: str) -> list[str]:
    """The options of a config group: its YAML files' names."""
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


def check_overrides(overrides: list[str], config_name: str = "") -> None:
    """Refuse a command line that uses an old name, saying the new one, or a group option
    that does not exist, saying the closest one and the others."""
    renamed_keys = {**RENAMED, **RENAMED_IN.get(config_name, {})}
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if f"{key}={value}" in RENAMED:
            raise ConfigError(f"'{key}={value}' was renamed: pass {RENAMED[f'{key}={value}']}")
        if key in renamed_keys:
            raise ConfigError(f"'{key}' was renamed: pass {renamed_keys[key]}={value}")
        options = group_options(key) if is_group(key) else None
        if options is not None and value not in ("", "null", *options):
            raise ConfigError(
                f"'{key}={value}': no such {key}{closest(value, options)}; the options are {', '.join(options)}"
            )


def setting(override: str) -> str:
    """A command-line `key=value` as Hydra's add-or-override `++key=value`. The YAML files hold
    only what differs from their schema's defaults (the dataclasses are the one source of
    them), so a key may be absent until validation fills it in; validation still refuses a
    key the schema lacks. Choosing a group's option (`env=...`) stays as it is."""
    key, equals, _ = override.partition("=")
    if not equals or override.startswith(("+", "~")) or "@" in key or is_group(key):
        return override
    return "++" + override


def compose(config_name: str, overrides: list[str]) -> DictConfig:
    """`configs/<config_name>.yaml` with its defaults and the command line's overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    check_overrides(overrides, config_name)
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return hydra_compose(config_name=config_name, overrides=[setting(o) for o in overrides])
    except HydraException as error:
        raise ConfigError(str(error)) from None
    except OmegaConfBaseException as error:
        raise ConfigError(f"config error: {error}") from None


def validate(schema: type, section: Any, where: str = "") -> Any:
    """`section` as an instance of the dataclass `schema`: a wrong key or type is a
    ConfigError naming the full key (`where` is its prefix, e.g. 'robot.')."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), section)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "?"
        message = renamed(f"{where}{key}") or str(error).splitlines()[0] + unknown_key_hint(error, where)
        raise ConfigError(f"config error at '{where}{key}': {message}") from None


def unknown_key_hint(error: OmegaConfBaseException, where: str = "") -> str:
    """For a key its section's dataclass lacks: the closest field; else the same key one level
    down, where it lives (`progress_bar` -> `logger.progress_bar`); else the fields there are."""
    schema = getattr(error, "object_type", None)
    name = getattr(error, "key", None)
    if not ("not in" in str(error) and isinstance(name, str) and dataclasses.is_dataclass(schema)):
        return ""
    fields = [field.name for field in dataclasses.fields(schema)]
    moved = getattr(schema, "RENAMED", {}).get(name)  # a key renamed in this section only
    if moved:
        return f" ('{name}' was renamed '{moved}' here)"
    nearest = closest(name, fields)
    if nearest:
        return nearest
    parent = str(getattr(error, "full_key", "") or "").rpartition(".")[0]
    prefix = f"{where}{parent}." if parent else where
    nested = [
        f"{prefix}{field}.{name}"
        for field, kind in typing.get_type_hints(schema).items()
        if dataclasses.is_dataclass(kind) and name in {inner.name for inner in dataclasses.fields(kind)}
    ]
    if nested:
        return f" (did you mean {' or '.join(repr(key) for key in nested)}?)"
    return f" (its keys: {', '.join(fields)})"


def load_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"no config file at {path}")
    return OmegaConf.load(path)
