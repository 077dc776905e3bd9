"""The code passes its linter and its formatter (ruff, configured in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing_to_lint():
    result = ruff("check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_the_code_is_formatted():
    result = ruff("format", "--check", "--no-cache", ".")
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout[-5000:] + result.stderr[-2000:]
