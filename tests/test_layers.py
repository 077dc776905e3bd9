"""The package's shape: one namespace, three layers, no import cycles.

    core         embodied.core: types, errors, registry, contracts, protocol. Imports only
                 itself (and libraries), never torch at module level.
    components   embodied.sim, embodied.policies, embodied.robots, embodied.algos: import the
                 core and each other, never the application.
    application  everything else under embodied/ (CLI, runtimes, train, eval, serve, SFT):
                 fills the registries and composes configs.

Imports are read from the source (module-level and function-level, but not those under
`if TYPE_CHECKING:`), so a cycle closed by a late import is found too."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
CORE = ("embodied.core",)
COMPONENTS = ("embodied.sim", "embodied.policies", "embodied.robots", "embodied.algos")


def modules() -> dict[str, Path]:
    """Import name -> source file, by the package layout pyproject.toml declares."""
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = {}
    for package, folder in package_dirs.items():
        for path in (ROOT / folder).glob("*.py"):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
        for sub in (ROOT / folder).iterdir():
            if sub.is_dir() and (sub / "__init__.py").is_file() and f"{package}.{sub.name}" not in package_dirs:
                for path in sub.glob("*.py"):
                    stem = f"{package}.{sub.name}"
                    found[stem if path.stem == "__init__" else f"{stem}.{path.stem}"] = path
    return found


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING"
    )


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports anywhere in its body."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                add(base)
                for alias in child.names:
                    add(f"{base}.{alias.name}")
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def layer(name: str) -> str:
    if name.startswith(CORE):
        return "core"
    if name.startswith(COMPONENTS):
        return "components"
    return "application"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def test_every_module_is_under_the_one_namespace(graph):
    assert all(name == "embodied" or name.startswith("embodied.") for name in graph)
    assert {
        "embodied.core.types",
        "embodied.sim.maniskill",
        "embodied.policies.denoising.flow",
        "embodied.robots.client",
        "embodied.cli",
    } <= set(graph)


def test_no_module_imports_a_layer_above_its_own(graph):
    rank = {"core": 0, "components": 1, "application": 2}
    upward = sorted(
        f"{name} ({layer(name)}) imports {target} ({layer(target)})"
        for name, targets in graph.items()
        for target in targets
        if rank[layer(target)] > rank[layer(name)]
    )
    assert not upward, "\n".join(upward)


# The application's top level holds only the entry points: the CLI and its verbs, and the
# configs the verbs compose. Everything else lives in a subpackage by responsibility.
ENTRY_POINTS = {"embodied.cli", "embodied.robot_cli"}
VERBS = {
    "embodied.train",
    "embodied.evaluate",
    "embodied.serve",
    "embodied.sft",
    "embodied.demos",
    "embodied.reward_classifier",
    "embodied.plots",
    "embodied.info",
}
CONFIGS = {"embodied.config", "embodied.components", "embodied.build"}


def test_the_top_level_holds_only_entry_points_verbs_and_configs():
    top = {f"embodied.{path.stem}" for path in (ROOT / "embodied").glob("*.py") if path.stem != "__init__"}
    assert top == ENTRY_POINTS | VERBS | CONFIGS, f"unexpected: {sorted(top - ENTRY_POINTS - VERBS - CONFIGS)}"
    assert len(top) + 1 <= 14  # with __init__.py


def test_no_module_imports_a_verb(graph):
    importers = sorted(
        f"{name} imports the verb {target}"
        for name, targets in graph.items()
        for target in targets & VERBS
        if name not in ENTRY_POINTS
    )
    assert not importers, "\n".join(importers)


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path (first module repeated at its end), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = 1
        path.append(name)
        for target in sorted(graph.get(name, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[name] = 2
        return []

    for name in sorted(graph):
        if name not in state:
            cycle = visit(name)
            if cycle:
                return cycle
    return []


def test_there_is_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert not cycle, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle_closed_by_a_late_import():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
    source = "def late():\n    import embodied.cli\n"
    path = ROOT / "tests" / "_late_import_probe.py"
    path.write_text(source)
    try:
        assert imports("embodied.probe", path, {"embodied.cli", "embodied.probe"}) == {"embodied.cli"}
    finally:
        path.unlink()


# Third-party libraries loaded once before the forks, so each module's own import is cheap;
# which project modules load, and in what order, is untouched.
PRELOAD = [
    "numpy",
    "torch",
    "zmq",
    "msgpack",
    "omegaconf",
    "hydra",
    "tqdm",
    "safetensors",
    "gymnasium",
    "transformers",
    "diffusers",
    "peft",
]

ALONE = """
import importlib, os, sys
for library in {preload!r}:
    try:
        importlib.import_module(library)
    except ImportError:
        pass
failed = []
for name in {names!r}:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException as error:
            print(f"{{name}}: {{type(error).__name__}}: {{error}}", file=sys.stderr, flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status:
        failed.append(name)
print("failed:", " ".join(failed))
"""


@pytest.mark.slow
def test_each_module_imports_alone(graph):
    names = sorted(graph)
    script = ALONE.format(preload=PRELOAD, names=names)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "failed:", result.stdout + result.stderr[-3000:]


def test_the_core_imports_no_torch(graph):
    core = sorted(name for name in graph if layer(name) == "core")
    script = (
        "import importlib, sys\n"
        f"for name in {core!r}:\n    importlib.import_module(name)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "above = [m for m in sys.modules if m.startswith('embodied.') and not m.startswith(('embodied.core', "
        "'embodied.configs'))]\n"
        "assert not above, above\n"
        "print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
