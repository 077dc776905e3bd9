"""Where this package runs from: a checkout (an editable install) or an installed wheel."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def checkout_root() -> Path | None:
    """The repository this package is imported from (an editable install, where
    tools/setup.sh keeps the simulators' own virtualenvs), or None for an installed wheel."""
    root = PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() and (root / "configs").is_dir() else None
