"""Hydra composition and dataclass validation, shared by the training side and the robot
client (which must not import torch): the configs are package data, `embodied.configs`."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from embodied.core.errors import ConfigError

CONFIG_DIR = Path(str(resources.files("embodied.configs")))  # a checkout's configs/, or the installed wheel's


def compose(config_name: str, overrides: list[str]) -> DictConfig:
    """`configs/<config_name>.yaml` with its defaults and the command line's overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return hydra_compose(config_name=config_name, overrides=overrides)
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
        message = str(error).splitlines()[0]
        raise ConfigError(f"config error at '{where}{key}': {message}") from None


def load_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"no config file at {path}")
    return OmegaConf.load(path)
