"""Counts the checks in the test suite, so a change that reorganises tests can show that none
was lost: `assert` statements, `pytest.raises`/`pytest.warns`, numpy's and torch's
`assert_*` helpers, and the test functions that hold them.

    python tools/count_assertions.py            # this checkout
    git stash; python tools/count_assertions.py; git stash pop   # before a change, to compare
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def count(folder: Path) -> dict[str, int]:
    totals = {"assert statements": 0, "pytest.raises/warns": 0, "assert_* helpers": 0, "test functions": 0}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Assert):
                totals["assert statements"] += 1
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                if name in ("raises", "warns"):
                    totals["pytest.raises/warns"] += 1
                elif name.startswith("assert_"):
                    totals["assert_* helpers"] += 1
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                totals["test functions"] += 1
    return totals


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests"
    totals = count(folder)
    for name, value in totals.items():
        print(f"{value:6d}  {name}")
    checks = sum(v for k, v in totals.items() if k != "test functions")
    print(f"{checks:6d}  checks in all")


if __name__ == "__main__":
    main()
