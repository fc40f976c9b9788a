# shellcheck shell=bash
# What the test VMs need, without changing the host beyond the tools that run them. Sourced by
# .ci/vm-deps.sh, tests/vm/run.sh and tests/systemd/run.sh (bash, as root).
#
#   install_missing_packages PKG...   apt-get install the PKGs that are not installed; refuses
#                                     (exit 1, naming them) when that would upgrade an installed
#                                     package (SANDBOXD_TESTS_ALLOW_UPGRADES=1 lets it)
#   guest_kernel_dir [--offline]      prints a directory with boot/vmlinuz-<ver> and
#                                     lib/modules/<ver> (modules.dep included): Debian's
#                                     linux-image-amd64 kernel, fetched with `apt-get download`
#                                     and unpacked with `dpkg -x` into the cache, never installed
#                                     on the host. --offline: only what the cache already has.
#   guest_kernel_image DIR            prints DIR/boot/vmlinuz-<ver>
#   guest_accel KERNEL                prints kvm when /dev/kvm boots KERNEL to its init within
#                                     VM_KVM_PROBE_TIMEOUT seconds (default 10), else tcg; the
#                                     reason goes to stderr. VM_ACCEL=kvm|tcg skips the probe.
#   guest_boots_to_init ACCEL CPU KERNEL TIMEOUT   the probe itself (see below)
#   guest_root_initramfs DIR OUT      writes OUT, an initramfs (busybox) that loads what a root
#                                     filesystem on virtio-blk ext4 needs from DIR's modules,
#                                     mounts root= and hands over to its /sbin/init
#
# Cache: SANDBOXD_TEST_CACHE (default /var/cache/sandboxd-test), shared with tests/systemd/run.sh.

guest_cache=${SANDBOXD_TEST_CACHE:-/var/cache/sandboxd-test}

# Messages name the script that sourced this file by its last two path parts (vm/run.sh...).
guest_log() {
    local dir=${0%/*}
    printf '%s/%s: %s\n' "${dir##*/}" "${0##*/}" "$*" >&2
}

install_missing_packages() {
    local pkg missing=() upgrades
    for pkg in "$@"; do
        if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" != "install ok installed" ]]; then
            missing+=("$pkg")
        fi
    done
    ((${#missing[@]})) || return 0
    guest_log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # A third-party source being unreachable must not stop us: the install below fails loudly
    # if Debian's own lists lack what we need.
    apt-get update -qq || guest_log "apt-get update reported errors; trying the install anyway"
    # `Inst NAME [OLD] (NEW ...)` in a simulation is an upgrade of an installed package.
    upgrades=$(apt-get install -s --no-install-recommends "${missing[@]}" \
        | sed -n 's/^Inst \([^ ]*\) \[\([^]]*\)\] (\([^ ]*\).*/  \1 \2 -> \3/p') \
        || { guest_log "apt-get cannot install ${missing[*]}"; return 1; }
    if [[ -n "$upgrades" && "${SANDBOXD_TESTS_ALLOW_UPGRADES:-}" != 1 ]]; then
        guest_log "installing ${missing[*]} would upgrade packages of this host:"
        printf '%s\n' "$upgrades" >&2
        guest_log "refusing: the tests do not upgrade the host (upgrade them yourself, or set SANDBOXD_TESTS_ALLOW_UPGRADES=1)"
        return 1
    fi
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}"
}

# The newest complete kernel directory in the cache (empty when there is none).
_guest_cached_kernel() {
    find "$guest_cache/kernel" -mindepth 2 -maxdepth 2 -name .complete -printf '%h\n' 2>/dev/null \
        | sort -V | tail -n 1
}

guest_kernel_dir() {
    local offline=0 pkg dir tmp deb kver
    [[ "${1:-}" == --offline ]] && offline=1
    if ((offline)); then
        dir=$(_guest_cached_kernel)
        [[ -n "$dir" ]] || { guest_log "no kernel in $guest_cache/kernel: run .ci/vm-deps.sh"; return 1; }
        printf '%s\n' "$dir"
        return 0
    fi
    # linux-image-amd64 is a metapackage: the kernel is the linux-image-<abi>-amd64 it depends on.
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)/\1/p' | head -n 1)
    if [[ -z "$pkg" ]]; then
        apt-get update -qq || true
        pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)/\1/p' | head -n 1)
    fi
    if [[ -z "$pkg" ]]; then
        guest_log "apt knows no linux-image-amd64; using the cache as it is"
        guest_kernel_dir --offline
        return
    fi
    dir=$guest_cache/kernel/$pkg
    if [[ -e "$dir/.complete" ]]; then
        printf '%s\n' "$dir"
        return 0
    fi
    guest_log "fetching $pkg into $dir (apt-get download + dpkg -x; nothing is installed)"
    mkdir -p "$guest_cache/kernel"
    tmp=$(mktemp -d "$guest_cache/kernel/.fetch.XXXXXX")
    # The download runs as root: _apt, apt's sandbox user, may not write to the cache.
    if ! (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2); then
        rm -rf "$tmp"
        guest_log "apt-get download $pkg failed; using the cache as it is"
        guest_kernel_dir --offline
        return
    fi
    deb=$(find "$tmp" -maxdepth 1 -name '*.deb' -print -quit)
    dpkg -x "$deb" "$tmp/root"
    rm -f "$deb"
    kver=$(find "$tmp/root/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | head -n 1)
    [[ -n "$kver" && -r "$tmp/root/boot/vmlinuz-$kver" ]] || {
        rm -rf "$tmp"
        guest_log "$pkg has no boot/vmlinuz-<ver> with lib/modules/<ver>"
        return 1
    }
    # Debian's packages leave modules.dep to their postinst: make it here, in the cache.
    depmod -b "$tmp/root" "$kver"
    rm -rf "$dir"
    mv "$tmp/root" "$dir"
    rmdir "$tmp"
    touch "$dir/.complete"
    # Older kernels of the cache go; the one just fetched is what every VM boots.
    find "$guest_cache/kernel" -mindepth 1 -maxdepth 1 -type d ! -path "$dir" ! -name '.fetch.*' \
        -exec rm -rf {} +
    printf '%s\n' "$dir"
}

guest_kernel_image() {
    local image
    image=$(find "$1/boot" -maxdepth 1 -name 'vmlinuz-*' -print | sort -V | tail -n 1)
    [[ -n "$image" ]] || { guest_log "no boot/vmlinuz-* in $1"; return 1; }
    printf '%s\n' "$image"
}

# A busybox initramfs whose /init is the script given on stdin.
_guest_busybox_initramfs() {
    local out=$1 tree
    tree=$(mktemp -d)
    mkdir -p "$tree/bin" "$tree/dev" "$tree/proc" "$tree/sys" "$tree/newroot"
    cp /bin/busybox "$tree/bin/busybox"
    cat >"$tree/init"
    chmod 0755 "$tree/init"
    if [[ -n "${2:-}" ]]; then cp -a "$2" "$tree/lib"; fi
    (cd "$tree" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$out"
    rm -rf "$tree"
}

# guest_boots_to_init ACCEL CPU KERNEL TIMEOUT: 0 when qemu with -accel ACCEL -cpu CPU boots
# KERNEL to a busybox init (which prints a marker and powers off) within TIMEOUT seconds; else
# non-zero, with qemu's exit and last words in $guest_probe_said.
guest_boots_to_init() {
    local accel=$1 cpu=$2 kernel=$3 timeout=$4 work rc=0
    work=$(mktemp -d)
    _guest_busybox_initramfs "$work/probe.img" <<'EOF2'
#!/bin/busybox sh
/bin/busybox echo SANDBOXD-GUEST-INIT-REACHED
/bin/busybox poweroff -f
EOF2
    # In a subshell: a qemu that aborts is reported here, not by bash's job control.
    (timeout -s KILL "$timeout" qemu-system-x86_64 -accel "$accel" -cpu "$cpu" -smp 1 -m 256M \
        -display none -no-reboot -net none -monitor none -serial "file:$work/serial" \
        -kernel "$kernel" -initrd "$work/probe.img" \
        -append 'console=ttyS0 quiet panic=-1 rdinit=/init' </dev/null >"$work/qemu" 2>&1
        exit $?) 2>/dev/null || rc=$?
    if grep -aq '^SANDBOXD-GUEST-INIT-REACHED' "$work/serial" 2>/dev/null; then
        rm -rf "$work"
        return 0
    fi
    if ((rc == 137)); then
        guest_probe_said="no guest init within ${timeout}s"
    else
        guest_probe_said="qemu exited $rc: $(tail -c 300 "$work/qemu" | tr '\n' ' ')"
    fi
    rm -rf "$work"
    return 1
}

guest_accel() {
    local kernel=$1 timeout=${VM_KVM_PROBE_TIMEOUT:-10} started elapsed
    case "${VM_ACCEL:-auto}" in
    kvm | tcg)
        guest_log "accelerator ${VM_ACCEL} (VM_ACCEL; no probe)"
        printf '%s\n' "$VM_ACCEL"
        return 0
        ;;
    auto) ;;
    *) guest_log "VM_ACCEL=$VM_ACCEL: expected kvm, tcg or auto"; return 1 ;;
    esac
    if [[ ! -r /dev/kvm || ! -w /dev/kvm ]]; then
        guest_log "accelerator tcg (software emulation): no usable /dev/kvm"
        printf 'tcg\n'
        return 0
    fi
    # The kernel the VMs boot, with KVM and the CPU model they use under it (-cpu host).
    started=$(date +%s%N)
    if guest_boots_to_init kvm host "$kernel" "$timeout"; then
        elapsed=$((($(date +%s%N) - started) / 1000000))
        guest_log "accelerator kvm: a KVM guest reached its init in ${elapsed} ms"
        printf 'kvm\n'
    else
        guest_log "accelerator tcg (software emulation): KVM probe failed ($guest_probe_said)"
        printf 'tcg\n'
    fi
}

guest_root_initramfs() {
    local dir=$1 out=$2 kver mods tree mod
    kver=$(find "$dir/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | head -n 1)
    tree=$(mktemp -d)
    # What a root filesystem on virtio-blk ext4 needs (modules in Debian's kernel), in load order.
    mods=$(for mod in virtio_pci virtio_blk crc32c_generic ext4; do
        modprobe -d "$dir" -S "$kver" --show-depends "$mod"
    done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }')
    mkdir -p "$tree/modules"
    : >"$tree/modules/order"
    for mod in $mods; do
        cp "$mod" "$tree/modules/"
        printf '%s\n' "${mod##*/}" >>"$tree/modules/order"
    done
    _guest_busybox_initramfs "$out" "$tree/modules" <<'EOF'
#!/bin/busybox sh
# Load the root filesystem's modules, mount root= and start its init (tests/vm/guest.sh).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
while read -r mod; do insmod "/lib/$mod" 2>/dev/null || true; done </lib/order
root=/dev/vda
for arg in $(cat /proc/cmdline); do
  case "$arg" in root=*) root=${arg#root=} ;; esac
done
n=0
while [ ! -b "$root" ] && [ "$n" -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
mount -t ext4 -o rw "$root" /newroot || { echo "initramfs: cannot mount $root"; poweroff -f; }
for fs in /dev /proc /sys; do mount --move "$fs" "/newroot$fs" || umount "$fs"; done
exec switch_root /newroot /sbin/init
EOF
    rm -rf "$tree"
}
