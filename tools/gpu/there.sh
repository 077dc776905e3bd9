#!/usr/bin/env bash
# On the GPU machine, from the repository root: install the kit tools/gpu/kit.py prepared
# (.gpu/, carried with the call), lay out the working tree as the `embodied` package, then run
# the campaign with the arguments given. Files land in /tmp, which lasts as long as the
# machine: a later call finds them and installs only what it carries anew.
#
#   bash tools/gpu/there.sh [--only step,...]     the campaign (benchmarks/gpu_campaign.py)
#   bash tools/gpu/there.sh --stage-only          only install what this call carries (extra-N.tar)
set -euo pipefail
site=/tmp/embodied-gpu-site
out="${OUT:-/tmp/embodied-gpu-out}"
mkdir -p "$site" "$out"

if [ -d .gpu/debs ]; then  # the Vulkan, EGL and X11 loaders, where the image lacks them
    for deb in .gpu/debs/*.deb; do dpkg -x "$deb" /; done
    ldconfig
fi
if [ -f .gpu/site.tar.xz ] && ! cmp -s .gpu/MANIFEST.json "$site/.kit-manifest"; then
    tar -xJf .gpu/site.tar.xz -C "$site"
    cp .gpu/MANIFEST.json "$site/.kit-manifest"
fi
for part in .gpu/extra-*.tar .gpu/physx-*.tar; do
    [ -f "$part" ] && tar -xf "$part" -C "$site"
done
if [ -f .gpu/vla-sft.tar ]; then  # the SFT run the campaign's vla step starts from
    mkdir -p /tmp/embodied-gpu-work
    tar -xf .gpu/vla-sft.tar -C /tmp/embodied-gpu-work
fi
python3 - "$site" <<'PY'
import json, lzma, pathlib, shutil, sys, tomllib
site = pathlib.Path(sys.argv[1])
# this call's manifest (every call carries it), else the one the site was installed with
carried = pathlib.Path(".gpu/MANIFEST.json")
manifest_file = carried if carried.is_file() else site / ".kit-manifest"
manifest = json.loads(manifest_file.read_text()) if manifest_file.is_file() else {}
for name, count in manifest.get("pieces", {}).items():  # files cut across extra parts, joined once all came
    pieces = [site / f"{name}.piece{i:03d}" for i in range(count)]
    if all(p.is_file() for p in pieces):
        with open(site / name, "wb") as whole:
            for piece in pieces:
                whole.write(piece.read_bytes())
                piece.unlink()
for packed in site.glob("sapien-physx/*/libPhysXGpu_64.so.xz"):  # SAPIEN's PhysX GPU library, where it looks
    library = pathlib.Path.home() / ".sapien" / "physx" / packed.parent.name / "libPhysXGpu_64.so"
    library.parent.mkdir(parents=True, exist_ok=True)
    library.write_bytes(lzma.decompress(packed.read_bytes()))
    packed.unlink()
# the working tree as the `embodied` package, by pyproject.toml's package-dir
shutil.rmtree(site / "embodied", ignore_errors=True)
layout = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
for package, folder in sorted(layout.items()):
    shutil.copytree(folder, site / package.replace(".", "/"), dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
PY

# A staging call stops here: what the machine offers takes torch's and SAPIEN's imports to
# find out, device time that only the campaign's own calls need to spend.
if [ "${1:-}" = "--stage-only" ]; then
    echo "staged: $(ls "$site" | wc -l) entries in $site"
    exit 0
fi

export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 MUJOCO_GL=egl PYTHONUNBUFFERED=1
nvidia=/usr/local/nvidia/share
if [ ! -e /usr/share/vulkan/icd.d/nvidia_icd.json ] && [ -e "$nvidia/vulkan/icd.d/nvidia_icd.json" ]; then
    export VK_DRIVER_FILES="$nvidia/vulkan/icd.d/nvidia_icd.json"
    export __EGL_VENDOR_LIBRARY_FILENAMES="$nvidia/glvnd/egl_vendor.d/10_nvidia.json"
fi
# The commit measured: the working tree travels without .git, so the caller names it
# (EMBODIED_COMMIT=<sha> bash tools/gpu/there.sh ...); else the kit's, which the tree may be newer than.
if [ -z "${EMBODIED_COMMIT:-}" ]; then
    kit_commit="$(python3 -c 'import json; print(json.load(open(".gpu/MANIFEST.json"))["commit"])' 2>/dev/null || echo unknown)"
    EMBODIED_COMMIT="unknown: the kit was prepared at $kit_commit"
fi
export EMBODIED_COMMIT

{  # what the machine offers, handed back with the results
    nvidia-smi -L 2>&1 || true
    python3 -c 'import sys, torch, numpy; print(sys.version.split()[0], torch.__version__, numpy.__version__,
torch.cuda.is_available())' 2>&1 || true
    for name in transformers peft timm diffusers; do  # one line each: a package the image lacks says so
        python3 -c "import importlib.metadata as m; print('$name', m.version('$name'))" 2>/dev/null || echo "$name absent"
    done
    python3 -c 'import sapien, mani_skill; print("sapien", sapien.__version__, sapien.render.get_device_summary())' 2>&1 \
        | tail -5 || true
} | tee "$out/machine.txt"

# From outside the checkout: `python -m embodied...` run from its root would find the bare
# embodied/ folder there (no configs, no sim) before the package laid out above.
repo="$(pwd)"
mkdir -p /tmp/embodied-gpu-run
cd /tmp/embodied-gpu-run
# The log goes back with the results, also when the call's time limit cuts the campaign off.
python3 "$repo/benchmarks/gpu_campaign.py" "$@" 2>&1 | tee "$out/campaign.log"
