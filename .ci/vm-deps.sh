#!/usr/bin/env bash
# Install what tests/vm/run.sh needs to boot a cgroup-v2 kernel under QEMU
# with virtme-ng (software emulation, no KVM). Run as root. Idempotent: every
# step is skipped when what it provides is already there.
#
#   - Debian packages: qemu-system-x86 (the emulator), linux-image-amd64 (a
#     kernel in /boot plus its modules in /lib/modules), busybox-static
#     (virtme-ng's initramfs), kmod (modprobe/depmod for the guest's modules),
#     python3-venv (for the venv below).
#   - a venv /opt/vng with virtme-ng from PyPI (the `vng` command).
#
# Environment knobs: VNG_VENV (default /opt/vng), VNG_VERSION (pip spec of
# virtme-ng, default the version this was tested with).
set -euo pipefail

VNG_VENV="${VNG_VENV:-/opt/vng}"
VNG_VERSION="${VNG_VERSION:-1.42}"
PACKAGES=(
    qemu-system-x86
    linux-image-amd64
    busybox-static
    kmod
    python3
    python3-venv
    # mkfs.ext4 (e2fsprogs, in the base system) and mkfs.xfs make the loop filesystems of the
    # ext4/XFS project-quota tests (tests/kernel/test_disk_project_quota.py) in the guest
    xfsprogs
)

log() { printf 'vm-deps: %s\n' "$*" >&2; }

if [[ "$(id -u)" -ne 0 ]]; then
    log "must run as root"
    exit 1
fi

# --- Debian packages --------------------------------------------------------
missing=()
for pkg in "${PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
    if [[ "$status" != "install ok installed" ]]; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]})); then
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # A third-party source being unreachable must not stop us: apt-get install
    # below fails loudly if Debian's own lists are missing what we need.
    apt-get update || log "apt-get update reported errors; trying the install anyway"
    apt-get install -y --no-install-recommends "${missing[@]}"
else
    log "Debian packages already installed"
fi

shopt -s nullglob
kernels=(/boot/vmlinuz-*)
shopt -u nullglob
if ((${#kernels[@]} == 0)); then
    log "no kernel in /boot after installing linux-image-amd64"
    exit 1
fi
log "kernel(s): ${kernels[*]}"

# --- virtme-ng venv ---------------------------------------------------------
want="virtme-ng==${VNG_VERSION}"
if [[ -x "$VNG_VENV/bin/vng" ]] \
    && "$VNG_VENV/bin/python" -m pip show virtme-ng 2>/dev/null \
        | grep -qx "Version: ${VNG_VERSION}"; then
    log "$VNG_VENV already has $want"
else
    log "creating $VNG_VENV with $want"
    # Debian's own python3, not whatever `python3` is on PATH (pyenv shims,
    # a project venv): the venv must outlive those.
    /usr/bin/python3 -m venv "$VNG_VENV"
    "$VNG_VENV/bin/python" -m pip install --disable-pip-version-check -q "$want"
fi
"$VNG_VENV/bin/vng" --version >&2
log "done"
