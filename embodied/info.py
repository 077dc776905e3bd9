"""`embodied info`: what this installation has and can do, for a bug report: versions, devices
(CPU, CUDA GPUs, Vulkan for ManiSkill, EGL for MuJoCo/LIBERO), and the simulators' own
virtualenvs. Each probe runs in a process of its own with a deadline, so a broken driver
shows up as a line in the report rather than a crash or a hang."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys

from embodied.core.paths import checkout_root

DISTRIBUTIONS = [
    "embodied-rl",
    "torch",
    "numpy",
    "mani-skill",
    "sapien",
    "mujoco",
    "robosuite",
    "gymnasium",
    "transformers",
    "diffusers",
    "peft",
    "pyzmq",
    "msgpack",
    "hydra-core",
    "omegaconf",
    "ray",
    "opencv-python",
    "opencv-python-headless",
]
PROBES = {
    "CUDA": "import torch; n = torch.cuda.device_count(); print(', '.join(f'{torch.cuda.get_device_name(i)} "
    "({torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB)' for i in range(n)) or 'none')",
    "Vulkan (ManiSkill)": "import sapien; s = sapien.render.get_device_summary(); "
    "print('; '.join(l.strip() for l in s.splitlines() if l.startswith('GPU')) or 'no device')",
    "EGL (MuJoCo, LIBERO)": "import os; os.environ['MUJOCO_GL'] = 'egl'; import mujoco; c = mujoco.GLContext(8, 8); "
    "c.make_current(); c.free(); print('works')",
}
# The virtualenvs tools/setup.sh makes beside the main one, and what each is for.
VIRTUALENVS = {
    ".venv-libero": (
        "LIBERO's env workers",
        "import libero, robosuite, mujoco; print('libero', 'robosuite', "
        "robosuite.__version__, 'mujoco', mujoco.__version__)",
    ),
    ".venv-dataset": (
        "the LeRobotDataset writer",
        "import importlib.metadata as m; print('lerobot-dataset', m.version('lerobot-dataset'))",
    ),
    ".venv-pi0ref": (
        "lerobot's pi0, the parity tests' reference",
        "import importlib.metadata as m; print('lerobot', m.version('lerobot'))",
    ),
}


def probe(python: str, code: str, timeout_s: float = 60.0) -> str:
    """What `code` prints under `python`, or why it did not."""
    try:
        result = subprocess.run(
            [python, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout_s:.0f} s"
    except OSError as error:
        return f"cannot run {python}: {error}"
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["failed"])[-1]
        return f"unavailable ({last[:160]})"
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "works"


def report() -> str:
    lines = [
        "embodied installation",
        "",
        f"python       {sys.version.split()[0]} ({sys.executable})",
        f"platform     {platform.platform()}",
        f"cpu cores    {os.cpu_count()} ({len(os.sched_getaffinity(0))} usable)"
        if hasattr(os, "sched_getaffinity")
        else f"cpu cores    {os.cpu_count()}",
        f"checkout     {checkout_root() or '(an installed wheel)'}",
        "",
        "versions",
    ]
    for name in DISTRIBUTIONS:
        try:
            lines.append(f"  {name:24} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"  {name:24} (not installed)")
    lines += ["", "devices"]
    lines += [f"  {name:24} {probe(sys.executable, code)}" for name, code in PROBES.items()]
    lines += ["", "simulator virtualenvs (tools/setup.sh)"]
    root = checkout_root()
    for folder, (purpose, code) in VIRTUALENVS.items():
        python = root / folder / "bin" / "python" if root is not None else None
        found = probe(str(python), code) if python is not None and python.is_file() else "not made here"
        lines.append(f"  {folder:24} {found}  [{purpose}]")
    return "\n".join(lines)


def main() -> int:
    print(report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
