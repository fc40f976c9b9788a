#!/usr/bin/env bash
# Provide what tests/vm/run.sh and tests/systemd/run.sh need to boot a Debian kernel under QEMU,
# changing the host only by the tools that run the VMs. Run as root. Idempotent: every step is
# skipped when what it provides is already there.
#
#   - Debian packages (only those missing; never an upgrade of an installed one, see
#     install_missing_packages in tests/vm/guest.sh): qemu-system-x86 (the emulator),
#     busybox-static (the VMs' initramfs), kmod (depmod for the guest's modules), python3-venv.
#   - the guest kernel: Debian's linux-image-amd64 kernel and its modules, fetched with
#     `apt-get download` and unpacked into the cache (SANDBOXD_TEST_CACHE, default
#     /var/cache/sandboxd-test), not installed: the host's /boot and /lib/modules stay as they are.
#   - a venv /opt/vng with virtme-ng from PyPI (the `vng` command).
#
# Environment knobs: VNG_VENV (default /opt/vng), VNG_VERSION (pip spec of
# virtme-ng, default the version this was tested with).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
# shellcheck source=../tests/vm/guest.sh
source "$here/../tests/vm/guest.sh"

VNG_VENV="${VNG_VENV:-/opt/vng}"
VNG_VERSION="${VNG_VERSION:-1.42}"
PACKAGES=(
    qemu-system-x86
    busybox-static
    kmod
    file
    python3
    python3-venv
)

log() { printf 'vm-deps: %s\n' "$*" >&2; }

if [[ "$(id -u)" -ne 0 ]]; then
    log "must run as root"
    exit 1
fi

install_missing_packages "${PACKAGES[@]}"
kernel_dir=$(guest_kernel_dir)
log "guest kernel: $(guest_kernel_image "$kernel_dir")"

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
