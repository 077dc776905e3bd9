#!/usr/bin/env bash
# Runs one of the README's two commands on a truly fresh Debian 12: a debootstrap "minbase"
# system (no python3, no compiler, no Mesa, no git), as a container image or a minimal
# install is, in a chroot. It clones this checkout's committed HEAD there, runs
# `tools/setup.sh <job> [args]` as a user would, and removes the chroot afterwards (KEEP=1
# keeps it, and a kept one is reused).
#
#   sudo bash tools/fresh_debian.sh train                        # the main job
#   sudo bash tools/fresh_debian.sh train total_env_steps=4096   # a shorter run
#   sudo bash tools/fresh_debian.sh test                         # the test suite
#
# Needs root, network access to Debian's and Python's package registries and about 15 GB
# (25 GB for `test`) under FRESH_DEBIAN_DIR. pip settings in the environment (PIP_CERT for a
# TLS-inspecting proxy, PIP_FIND_LINKS for local wheels) are passed into the chroot.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${FRESH_DEBIAN_DIR:-/srv/embodied-fresh-debian12}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
job="${1:-train}"
[ $# -gt 0 ] && shift

log() { printf '\033[1m[fresh-debian]\033[0m %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
    log "needs root (debootstrap, chroot): sudo bash $0 $job $*"
    exit 1
fi
for tool in debootstrap git; do
    if ! command -v "$tool" >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$tool" >/dev/null
    fi
done

mounts=()
cleanup() {
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -R "${mounts[i]}" 2>/dev/null || umount -lR "${mounts[i]}"; done
    if [ "${KEEP:-0}" != 1 ]; then rm -rf "$target"; fi
}
trap cleanup EXIT

bind() { # bind <host path> <path in the chroot>
    mkdir -p "$target$2"
    mount --rbind "$1" "$target$2"
    mounts+=("$target$2")
}

if [ ! -x "$target/bin/bash" ]; then
    log "debootstrap bookworm (minbase) into $target"
    debootstrap --variant=minbase bookworm "$target" "$mirror" >/dev/null
fi
cp /etc/resolv.conf "$target/etc/resolv.conf"
mkdir -p "$target/proc"
mount -t proc proc "$target/proc"
mounts+=("$target/proc")
bind /dev /dev
bind /sys /sys

passed=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin CI="${CI:-}")
if [ -n "${PIP_CERT:-}" ]; then
    cp "$PIP_CERT" "$target/root/pip-ca.crt"
    passed+=(PIP_CERT=/root/pip-ca.crt)
fi
if [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "$PIP_FIND_LINKS" ]; then
    bind "$PIP_FIND_LINKS" /root/pip-find-links
    passed+=(PIP_FIND_LINKS=/root/pip-find-links)
fi

log "cloning $(git -C "$root" rev-parse --short HEAD) to /root/embodied"
rm -rf "$target/root/embodied"
git clone -q "$root" "$target/root/embodied"

log "running: bash tools/setup.sh $job $*"
chroot "$target" env -i "${passed[@]}" bash -c 'cd /root/embodied && bash tools/setup.sh "$@"' setup "$job" "$@"
log "'tools/setup.sh $job' passed on a fresh Debian 12"
