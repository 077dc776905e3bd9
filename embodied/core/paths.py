"""Where this package runs from: a checkout (an editable install) or an installed wheel."""

from __future__ import annotations

from pathlib import Path

from embodied.core.errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def checkout_root() -> Path | None:
    """The repository this package is imported from (an editable install, where
    tools/setup.sh keeps the simulators' own virtualenvs), or None for an installed wheel."""
    root = PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() and (root / "configs").is_dir() else None


def simulator_python(configured: str | None, simulator: str, venv: str, install: str) -> str:
    """The interpreter of a simulator that runs in a virtualenv of its own (LIBERO, Genesis):
    `env.python` where set, else the `venv` that tools/setup.sh makes in a checkout; refused,
    with what to do (`install`: what goes into such a virtualenv), where there is none."""
    checkout = checkout_root()
    if configured:
        python = Path(configured)
    elif checkout is not None:
        python = checkout / venv / "bin" / "python"
    else:
        raise ConfigError(
            f"{simulator} runs under its own interpreter: create a virtualenv for it, {install} there, "
            f"and pass env.python=<its bin/python>"
        )
    if not python.is_file():
        raise ConfigError(
            f"no {simulator} interpreter at {python}: run `bash tools/setup.sh install` "
            f"(it creates {venv}) or set env.python"
        )
    return str(python)
