"""The wheel, as a user installs it: built from this checkout, installed into fresh
virtualenvs outside it, trained with, and a torch-free robot client driven by its server.

The installs take their packages from pip's cache or the registry (the test command's own
set-up has just fetched the same releases), pinned by constraints.txt."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_TRAIN = [
    "env=mujoco_invertedpendulum",
    "policy.actor_hidden=[16]",
    "policy.critic_hidden=[16]",
    "algo.rollout_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "total_env_steps=64",
    "eval_episodes=1",
    "eval_every=0",
    "logger.progress_bar=false",
    "logger.tensorboard=false",
]


def run(command: list[str], cwd: Path, timeout: float = 900, **kwargs) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**environment, **kwargs.pop("env", {})},
        **kwargs,
    )
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def virtualenv(path: Path, requirement: str) -> Path:
    """A fresh virtualenv at `path` with `requirement` installed; returns its bin folder."""
    run([sys.executable, "-m", "venv", str(path)], cwd=path.parent)
    # --no-compile: compiling every installed module (torch's thousands) took most of the
    # install; the few modules these runs import compile as they load
    pip = [str(path / "bin" / "pip"), "install", "-q", "--no-compile", "-c", str(ROOT / "constraints.txt")]
    run([*pip, requirement], cwd=path.parent)
    return path / "bin"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the checkout's files (what git tracks or would), so the build
    writes nothing into the checkout."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    listed = run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT).stdout.splitlines()
    for name in listed:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)], cwd=out)
    (built,) = out.glob("embodied_rl-*.whl")
    return built


def test_the_wheel_holds_one_namespace_and_every_config(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = archive.read(next(n for n in names if n.endswith("top_level.txt"))).decode().split()
    assert top_level == ["embodied"]
    assert not [n for n in names if not n.startswith(("embodied/", "embodied_rl-"))]
    shipped = {
        n.removeprefix("embodied/configs/") for n in names if n.startswith("embodied/configs/") and n.endswith(".yaml")
    }
    assert shipped == {str(p.relative_to(ROOT / "configs")) for p in (ROOT / "configs").rglob("*.yaml")}
    for package in ("core", "sim", "policies", "robots", "algos", "runtime"):
        assert f"embodied/{package}/__init__.py" in names
    # every Python module of the checkout's packages, subpackages included, is in the wheel
    for folder, package in (("embodied", "embodied"), *((f, f"embodied/{f}") for f in ("sim", "policies", "robots"))):
        for module in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in module.parts:
                assert f"{package}/{module.relative_to(ROOT / folder).as_posix()}" in names, module


@pytest.mark.slow
def test_installed_wheel_trains_and_serves_a_robot_client_without_torch(wheel, tmp_path):
    work = tmp_path / "elsewhere"  # no checkout here: what runs is what the wheel installed
    work.mkdir()
    trainer = virtualenv(tmp_path / "train-env", f"{wheel}[train,mujoco]")
    where = run([str(trainer / "python"), "-c", "import embodied; print(embodied.__file__)"], cwd=work).stdout
    assert str(tmp_path / "train-env") in where and str(ROOT) not in where
    run([str(trainer / "embodied"), "train", *TINY_TRAIN, f"run_dir={work / 'run'}"], cwd=work)
    assert (work / "run" / "checkpoints" / "latest").is_file()
    assert json.loads((work / "run" / "eval" / "InvertedPendulum-v4" / "report.json").read_text())["overall"]

    robot = virtualenv(tmp_path / "robot-env", f"{wheel}[robot,mujoco]")
    torch_free = run(
        [str(robot / "python"), "-c", "import importlib.util; print(importlib.util.find_spec('torch'))"], cwd=work
    )
    assert torch_free.stdout.strip() == "None"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    server = subprocess.Popen(
        [str(trainer / "embodied"), "serve", f"checkpoint={work / 'run'}", f"endpoint={endpoint}"],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = server.stdout.readline()
        while line and "serving" not in line:
            line = server.stdout.readline()
        assert "serving" in line, "the server did not start"
        run(
            [
                str(robot / "embodied"),
                "robot",
                "robot=sim",
                f"robot.env_from={work / 'run'}",
                f"server={endpoint}",
                "episodes=1",
                "max_episode_steps=20",
                f"output={work / 'robot'}",
            ],
            cwd=work,
            timeout=300,
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    summary = json.loads((work / "robot" / "summary.json").read_text())
    assert summary["action_sources"].get("policy", 0) > 0 and len(summary["episodes"]) == 1
