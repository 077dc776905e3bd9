#!/usr/bin/env bash
# One entry point for a fresh machine: installs everything, then runs a job.
#
#   bash tools/setup.sh train [hydra overrides...]   # install, then the main training job
#   bash tools/setup.sh test  [pytest args...]       # install, then the test suite
#   bash tools/setup.sh install                      # install only
#
# Idempotent: the virtualenv is reused and pip runs only when pyproject.toml or
# constraints.txt changed; system packages are installed only when missing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${EMBODIED_VENV:-$root/.venv}"
python="${EMBODIED_PYTHON:-python3}"
job="${1:-install}"
[ $# -gt 0 ] && shift

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        log "this step needs root: $*"
        log "run this command as root (or install sudo), or run that step yourself and then this command again"
        exit 1
    fi
}

# apt_install <package>...: Debian/Ubuntu system packages, after one refresh of the package lists.
apt_lists_fresh=0
apt_install() {
    if [ "$apt_lists_fresh" = 0 ]; then
        as_root apt-get update -qq
        apt_lists_fresh=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# system_packages <why> <Debian package>...: installs them through apt, or, on a system
# without apt, says what is missing and stops.
system_packages() {
    local why="$1"
    shift
    if ! command -v apt-get >/dev/null; then
        log "$why: install your distribution's packages for what Debian calls: $*"
        log "then run this command again"
        exit 1
    fi
    log "$why: installing $*"
    apt_install "$@"
}

python_version() { "$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")'; }

# A Python that can make virtualenvs: a container image or a minimal Debian 12 has no python3,
# and Debian and Ubuntu ship venv's pip bootstrap apart (python3-venv).
ensure_python() {
    if ! command -v "$python" >/dev/null; then
        if [ -n "${EMBODIED_PYTHON:-}" ]; then
            log "no $python: name an interpreter of Python 3.10 or newer with EMBODIED_PYTHON=/path/to/python3"
            exit 1
        fi
        system_packages "no python3" python3 python3-venv
    fi
    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
        log "$("$python" --version 2>&1) is too old: Python 3.10 or newer is needed (EMBODIED_PYTHON=...)"
        exit 1
    fi
    if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
        system_packages "$python cannot make virtualenvs" "python$(python_version)-venv"
    fi
}

# Some dependencies publish no Linux wheel and build from source (evdev, through robosuite's
# keyboard input): they need a C compiler, Python's headers and the kernel's input headers.
ensure_build_tools() {
    local include
    include="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    if command -v cc >/dev/null && [ -f "$include/Python.h" ] && [ -f /usr/include/linux/input.h ]; then return; fi
    system_packages "some dependencies build from source" gcc libc6-dev linux-libc-dev "python$(python_version)-dev"
}

# The tests read the checkout with git (what a wheel ships, what the GPU kit carries) and
# pack and unpack the GPU kit's xz archives.
ensure_test_tools() {
    local missing=()
    command -v git >/dev/null || missing+=(git)
    command -v xz >/dev/null || missing+=(xz-utils)
    if [ ${#missing[@]} -gt 0 ]; then system_packages "the tests need git and xz" "${missing[@]}"; fi
}

# opencv-python (cameras; ManiSkill imports it too) links the system's libGL and GLib.
ensure_opencv() {
    if "$venv/bin/python" -c 'import cv2' >/dev/null 2>&1; then return; fi
    system_packages "OpenCV cannot load the system's libGL and GLib" libgl1 libglib2.0-0
    if ! "$venv/bin/python" -c 'import cv2'; then
        log "OpenCV still does not load (see above)"
        exit 1
    fi
}

# ensure_virtualenv <dir> <part> <what> <files that decide its contents> -- <pip install arguments>
# Creates the virtualenv once, and (re)installs <part> of it only when those files changed.
ensure_virtualenv() {
    local dir="$1" part="$2" what="$3"
    shift 3
    local files=()
    while [ "$1" != "--" ]; do files+=("$1"); shift; done
    shift
    # Ready only once its pip is current: a first try cut off there (no network, a proxy's
    # certificate) is finished by the next run instead of leaving an old pip behind.
    if [ ! -f "$dir/.embodied-venv-ready" ]; then
        if [ ! -x "$dir/bin/python" ]; then
            log "creating virtualenv $dir"
            "$python" -m venv "$dir"
        fi
        "$dir/bin/pip" install -q -U pip setuptools wheel
        touch "$dir/.embodied-venv-ready"
    fi
    local stamp="$dir/.embodied-$part-stamp"
    local want
    want="$(cat "${files[@]}" | sha256sum | cut -d' ' -f1)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        log "installing $what"
        "$dir/bin/pip" install -q "$@"
        echo "$want" > "$stamp"
    fi
}

ensure_venv() {
    ensure_virtualenv "$venv" install "Python packages (pinned by constraints.txt)" pyproject.toml constraints.txt -- \
        -c constraints.txt -e ".[train,robot,ray,sim,video,vla,dev]"
}

vulkan_works() {
    "$venv/bin/python" - <<'PY' >/dev/null 2>&1
import sapien
sapien.render.RenderSystem()
PY
}

# ManiSkill needs a Vulkan device even for state observations. An NVIDIA driver brings
# its own; a CPU-only Debian 12 machine needs Mesa >= 23 (llvmpipe) from backports,
# because bookworm's Mesa 22 lavapipe is rejected by SAPIEN.
ensure_vulkan() {
    if vulkan_works; then return; fi
    if [ ! -r /etc/os-release ] || ! grep -q 'VERSION_CODENAME=bookworm' /etc/os-release; then
        log "no working Vulkan device. Install your GPU driver's Vulkan ICD, or Mesa >= 23"
        log "(package mesa-vulkan-drivers), then run this command again."
        exit 1
    fi
    log "no working Vulkan device: installing Mesa's Vulkan drivers from bookworm-backports"
    local list=/etc/apt/sources.list.d/bookworm-backports.sources
    if [ ! -f "$list" ]; then
        as_root tee "$list" >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    fi
    apt_lists_fresh=0  # the backports source may be new
    apt_install -t bookworm-backports mesa-vulkan-drivers libvulkan1
    if ! vulkan_works; then
        log "Vulkan still not usable after installing Mesa; see sapien.render.get_device_summary()"
        exit 1
    fi
}

libero_venv="${EMBODIED_LIBERO_VENV:-$root/.venv-libero}"

# LIBERO (robosuite 1.4, mujoco 2.3.7) gets a virtualenv of its own; its env workers run
# `python -m embodied.sim.worker` under that interpreter (sim/libero.py), so the package is
# installed there too, with its `libero` extra (ensure_checkouts).
ensure_libero_packages() {
    ensure_virtualenv "$libero_venv" packages "LIBERO and its assets (about 650 MB)" tools/libero-requirements.txt -- \
        -r tools/libero-requirements.txt
}

dataset_venv="${EMBODIED_DATASET_VENV:-$root/.venv-dataset}"

# LeRobotDataset gets a virtualenv of its own (its pins clash with transformers 5); the robot
# client's dataset writer runs under that interpreter (robots/recording.py).
ensure_dataset_packages() {
    ensure_virtualenv "$dataset_venv" packages "the LeRobotDataset writer's packages" tools/dataset-requirements.txt -- \
        -r tools/dataset-requirements.txt
}

genesis_venv="${EMBODIED_GENESIS_VENV:-$root/.venv-genesis}"

# Genesis (numpy 2, mujoco 4) gets a virtualenv of its own; its batched scenes run in env worker
# processes under that interpreter (sim/genesis.py), with this package installed there without
# its dependencies (ensure_checkouts).
ensure_genesis_packages() {
    ensure_virtualenv "$genesis_venv" packages "Genesis (about 4 GB)" tools/genesis-requirements.txt -- \
        -r tools/genesis-requirements.txt
}

# A first Genesis scene compiles its kernels (3 to 5 minutes on one core), cached under
# ~/.cache/genesis and ~/.cache/quadrants: built once here, so that no training run or test
# waits for it. The stamp names the cache it filled.
ensure_genesis_kernels() {
    local stamp="$genesis_venv/.embodied-kernels-stamp"
    local cache="${XDG_CACHE_HOME:-$HOME/.cache}/quadrants"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$cache" ] && [ -d "$cache" ]; then return; fi
    log "compiling Genesis's kernels (once; a few minutes)"
    "$genesis_venv/bin/python" -m embodied.sim.genesis
    echo "$cache" > "$stamp"
}

pi0_reference_venv="${EMBODIED_PI0_REFERENCE_VENV:-$root/.venv-pi0ref}"
pi0_reference_lerobot=0.4.4

# lerobot's pi0, which the pi0 parity test compares with (tests/policies/test_pi0.py). lerobot
# itself installs without its dependencies (see tools/pi0-reference-requirements.txt).
ensure_pi0_reference_venv() {
    ensure_virtualenv "$pi0_reference_venv" packages "lerobot's pi0 (the parity test's reference)" \
        tools/pi0-reference-requirements.txt -- -r tools/pi0-reference-requirements.txt
    if ! "$pi0_reference_venv/bin/pip" show lerobot 2>/dev/null | grep -qx "Version: $pi0_reference_lerobot"; then
        "$pi0_reference_venv/bin/pip" install -q --no-deps "lerobot==$pi0_reference_lerobot"
    fi
}

egl_works() {
    MUJOCO_GL=egl PYOPENGL_PLATFORM=egl "$libero_venv/bin/python" - <<'PY' >/dev/null 2>&1
import mujoco
context = mujoco.GLContext(32, 32)
context.make_current()
context.free()
PY
}

# LIBERO renders its cameras offscreen through EGL (Mesa's software renderer on a CPU machine).
# PyOpenGL's EGL platform also loads GLVND's libOpenGL (libopengl0), which no EGL package pulls in.
ensure_egl() {
    if egl_works; then return; fi
    log "no working EGL: installing Mesa's EGL and GL drivers"
    local release=()
    if [ -f /etc/apt/sources.list.d/bookworm-backports.sources ]; then
        release=(-t bookworm-backports)  # the same Mesa as the Vulkan driver above
    fi
    apt_install "${release[@]}" libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0
    if ! egl_works; then
        log "EGL still not usable; LIBERO can render with OSMesa instead: install libosmesa6 and"
        log "pass env.mujoco_gl=osmesa"
        exit 1
    fi
}

# The side virtualenvs' own packages, which never touch this checkout.
ensure_side_packages() {
    ensure_libero_packages
    ensure_dataset_packages
    if [ "$job" = test ]; then ensure_pi0_reference_venv; fi
}

# This checkout into the side virtualenvs, one after the other: an editable install writes the
# checkout's package metadata (embodied_rl.egg-info), so two at once would race.
ensure_checkouts() {
    ensure_virtualenv "$libero_venv" checkout "this package into LIBERO's virtualenv" pyproject.toml -- \
        -e ".[libero]"
    # The dataset writer is `python -m embodied.robots.dataset_writer`: the package without its
    # dependencies, since lerobot-dataset brings its own numpy (2.x) and the writer needs only
    # numpy and msgpack.
    ensure_virtualenv "$dataset_venv" checkout "this package into the dataset writer's virtualenv" pyproject.toml -- \
        --no-deps -e .
    ensure_virtualenv "$genesis_venv" checkout "this package into Genesis's virtualenv" pyproject.toml -- \
        --no-deps -e .
}

# Waits for a background step, and ends the set-up where it failed.
wait_for() {
    if ! wait "$1"; then
        log "$2 failed (see above)"
        exit 1
    fi
}

ensure_python
ensure_build_tools
# pip installs on one core: the side virtualenvs install beside the main one (Genesis's, the
# largest, in a line of its own), so a fresh machine waits for the longest line rather than
# for their sum.
ensure_side_packages &
side=$!
ensure_genesis_packages &
genesis=$!
trap 'wait' EXIT  # a failed main install still lets the side ones finish, rather than orphan them
ensure_venv
wait_for "$side" "installing the side virtualenvs"
wait_for "$genesis" "installing Genesis's virtualenv"
ensure_checkouts
ensure_genesis_kernels &  # beside the system checks below, which do not touch it
kernels=$!
ensure_opencv
ensure_vulkan
ensure_egl
wait_for "$kernels" "compiling Genesis's kernels"
export PATH="$venv/bin:$PATH"

case "$job" in
    install) log "installed. Activate with: source $venv/bin/activate" ;;
    train) exec embodied train "$@" ;;
    test)
        ensure_test_tools
        exec python -m pytest "$@"
        ;;
    *) log "unknown job '$job' (expected: train, test, install)"; exit 2 ;;
esac
