#!/usr/bin/env bash
# Prove packaging/systemd/sandboxd.service under a real systemd as PID 1.
#
#   sudo tests/systemd/run.sh                       # cgroup2 isolation through Delegate=
#   sudo SANDBOXD_SMOKE_ISOLATION=none tests/systemd/run.sh
#
# Builds (and caches) a small Debian bookworm root filesystem with debootstrap, installs the
# project into it from wheels built here (a venv at /opt/sandboxd, installed offline), installs
# the unit, its env file and a root-only token, boots it under QEMU (KVM when a probe boot with
# it reaches the guest's init, else software emulation; the choice is printed) with Debian's
# kernel from the cache of tests/vm/guest.sh (downloaded and unpacked there, never installed on
# the host) and a small initramfs made from its modules, and lets a test unit inside (smoke.py)
# run the checks: READY only once
# listening, auth, create, exec as a pool uid in the sandbox's own cgroup, an OOM kill (137)
# under SANDBOXD_MEMORY_MAX, restart after a crash, and `systemctl stop` draining (a running
# command finishes, /readyz 503, creates refused) with a clean exit. Results are read from the
# serial log; the exit status is pass (0) or fail (1). Not root: prints SKIP and exits 0.
#
# Cache: SANDBOXD_TEST_CACHE (default /var/cache/sandboxd-test) keeps the debootstrapped base
# (keyed by suite and package list), a build venv and the guest kernel; delete it to start from
# scratch. The host gets only the tools (debootstrap, qemu, ...), never a kernel or an upgrade.
# VM_ACCEL=kvm|tcg skips the KVM probe.
# SANDBOXD_SMOKE_KEEP=1 keeps the work directory (image, serial log) for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=../vm/guest.sh
source tests/vm/guest.sh

if [ "$(id -u)" != 0 ]; then
  echo "SKIP tests/systemd/run.sh: needs root (debootstrap, chroot, a filesystem image)"
  exit 0
fi

cache=${SANDBOXD_TEST_CACHE:-/var/cache/sandboxd-test}
isolation=${SANDBOXD_SMOKE_ISOLATION:-cgroup2}
vm_timeout=${SANDBOXD_SMOKE_VM_TIMEOUT:-2400}
suite=bookworm
mirror=${SANDBOXD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
include=systemd-sysv,udev,python3,python3-venv,util-linux,rsync,curl,procps
key=$(printf '%s %s v1' "$suite" "$include" | sha256sum | cut -c1-12)
base=$cache/base-$suite-$key

stamp() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*"; }
started=$SECONDS

# --- host tools ---------------------------------------------------------------------------
# Only what is missing, never an upgrade (install_missing_packages refuses those).
install_missing_packages debootstrap qemu-system-x86 e2fsprogs python3-venv busybox-static kmod
kernel_dir=$(guest_kernel_dir)
kernel=$(guest_kernel_image "$kernel_dir")
accel=$(guest_accel "$kernel")
if [ "$accel" = kvm ]; then cpu=host; else cpu=max; fi

# --- the base image (cached) --------------------------------------------------------------
mkdir -p "$cache"
if [ ! -e "$base/.complete" ]; then
  stamp "debootstrap $suite into $base (one time; cached afterwards)"
  rm -rf "$base.tmp"
  t0=$SECONDS
  timeout -s KILL 1500 debootstrap --variant=minbase --include="$include" \
    "$suite" "$base.tmp" "$mirror" >"$cache/debootstrap.log" 2>&1 \
    || { tail -n 30 "$cache/debootstrap.log"; exit 1; }
  rm -rf "$base.tmp/var/cache/apt/archives/"*.deb "$base.tmp/usr/share/doc" \
    "$base.tmp/usr/share/man" "$base.tmp/usr/share/locale"
  touch "$base.tmp/.complete"
  mv "$base.tmp" "$base"
  stamp "debootstrap took $((SECONDS - t0)) s"
fi

work=$(mktemp -d "$cache/run.XXXXXX")
qemu_pid=
cleanup() {
  if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then kill -KILL "$qemu_pid" || true; fi
  if [ "${SANDBOXD_SMOKE_KEEP:-}" = 1 ]; then
    echo "kept $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

# --- wheels, built on the host; the dependencies' venv is cached ---------------------------
# The venv at /opt/sandboxd with every dependency installed is cached, keyed by the files that
# declare the dependencies; each run then builds and installs only the project's own wheel.
t0=$SECONDS
buildvenv=$cache/build-venv
if [ ! -e "$buildvenv/.complete-v2" ]; then
  rm -rf "$buildvenv"
  /usr/bin/python3 -m venv "$buildvenv"
  "$buildvenv/bin/pip" install -q --disable-pip-version-check --upgrade pip 'setuptools>=64' wheel
  touch "$buildvenv/.complete-v2"
fi
mkdir -p "$work/src" "$work/wheels"
# The work tree as it is (tracked and new files, nothing git ignores), outside the repository.
git ls-files -z --cached --others --exclude-standard \
  | xargs -0 -I{} sh -c 'test -e "$1" && printf "%s\0" "$1" || true' _ {} \
  | tar --null -T - -cf - | tar -xf - -C "$work/src"
deps_key=$(cat setup.py pyproject.toml | sha256sum | cut -c1-12)
deps=$cache/venv-$key-$deps_key
for old in "$cache"/venv-*; do   # venvs of older dependency lists
  if [ -d "$old" ] && [ "$old" != "$deps" ]; then rm -rf "$old"; fi
done
pipw=("$buildvenv/bin/pip" wheel -q --disable-pip-version-check -w "$work/wheels")
if [ -e "$deps/.complete" ]; then
  timeout -s KILL 600 "${pipw[@]}" --no-deps --no-build-isolation "$work/src" \
    >"$work/pip-wheel.log" 2>&1 || { cat "$work/pip-wheel.log"; exit 1; }
else
  timeout -s KILL 600 "${pipw[@]}" "$work/src" >"$work/pip-wheel.log" 2>&1 \
    || { cat "$work/pip-wheel.log"; exit 1; }
fi
stamp "wheels built in $((SECONDS - t0)) s: $(ls "$work/wheels" | tr '\n' ' ')"

# --- the image: base + venv + unit + smoke test -------------------------------------------
t0=$SECONDS
root=$work/rootfs
cp -a "$base" "$root"
rm -f "$root/.complete"
mkdir -p "$root/tmp/wheels"
cp "$work/wheels/"*.whl "$root/tmp/wheels/"
if [ -e "$deps/.complete" ]; then
  cp -a "$deps/sandboxd" "$root/opt/sandboxd"
else
  stamp "installing the dependencies into /opt/sandboxd (one time; cached afterwards)"
  rm -rf "$deps"
  timeout -s KILL 900 chroot "$root" /bin/sh -euc '
    python3 -m venv /opt/sandboxd
    ls /tmp/wheels/*.whl | grep -v "/sandboxd-" \
      | xargs /opt/sandboxd/bin/pip install -q --no-index --no-deps --disable-pip-version-check
  ' >"$work/chroot-deps.log" 2>&1 || { cat "$work/chroot-deps.log"; exit 1; }
  mkdir -p "$deps.tmp"
  cp -a "$root/opt/sandboxd" "$deps.tmp/sandboxd"
  touch "$deps.tmp/.complete"
  mv "$deps.tmp" "$deps"
fi
timeout -s KILL 600 chroot "$root" /bin/sh -euc '
  /opt/sandboxd/bin/pip install -q --no-index --disable-pip-version-check \
    --find-links /tmp/wheels /tmp/wheels/sandboxd-*.whl
  /opt/sandboxd/bin/python -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"
  test -s /opt/sandboxd/lib/python3*/site-packages/twisted/plugins/dropin.cache
  /opt/sandboxd/bin/twistd sandboxd --help >/dev/null
  test -x /opt/sandboxd/bin/sandboxctl
' >"$work/chroot.log" 2>&1 || { cat "$work/chroot.log"; exit 1; }
rm -rf "$root/tmp/wheels"

install -m 0644 packaging/systemd/sandboxd.service "$root/etc/systemd/system/sandboxd.service"
# Python under software emulation starts 50-100x slower than on the host: give the start (and
# the READY=1 that ends it) more time than the unit's own 120 s.
mkdir -p "$root/etc/systemd/system/sandboxd.service.d"
printf '[Service]\nTimeoutStartSec=900\n' >"$root/etc/systemd/system/sandboxd.service.d/10-emulated.conf"
install -d -m 0755 "$root/etc/sandboxd"
{
  cat packaging/systemd/sandboxd.env
  echo
  echo "# --- tests/systemd/run.sh"
  echo "SANDBOXD_LISTEN=tcp:8080:interface=127.0.0.1"
  echo "SANDBOXD_ISOLATION=$isolation"
  echo "SANDBOXD_MEMORY_MAX=64M"
  echo "SANDBOXD_DRAIN_DEADLINE=75s"
} >"$root/etc/sandboxd/sandboxd.env"
(umask 077 && head -c 24 /dev/urandom | base64 >"$root/etc/sandboxd/token")
chmod 0600 "$root/etc/sandboxd/token"
install -m 0644 tests/systemd/smoke.py "$root/usr/local/lib/sandboxd-smoke.py"
install -m 0644 tests/systemd/sandboxd-smoke.service "$root/etc/systemd/system/"
ln -sf /etc/systemd/system/sandboxd.service \
  "$root/etc/systemd/system/multi-user.target.wants/sandboxd.service"
ln -sf /etc/systemd/system/sandboxd-smoke.service \
  "$root/etc/systemd/system/multi-user.target.wants/sandboxd-smoke.service"
# The serial console carries the results: no login prompt on it, nothing else to wait for.
ln -sf /dev/null "$root/etc/systemd/system/serial-getty@ttyS0.service"
ln -sf /dev/null "$root/etc/systemd/system/systemd-networkd-wait-online.service"
echo sandboxd-test >"$root/etc/hostname"
: >"$root/etc/fstab"

guest_root_initramfs "$kernel_dir" "$work/initrd.img"
truncate -s 2G "$work/rootfs.img"
mkfs.ext4 -q -F -d "$root" "$work/rootfs.img"
rm -rf "$root"
stamp "image built in $((SECONDS - t0)) s"

# --- boot it and read the verdict from the serial log -------------------------------------
t0=$SECONDS
serial=$work/serial.log
stamp "booting $kernel (${accel^^})"
qemu-system-x86_64 -M q35 -accel "$accel" -cpu "$cpu" -smp 2 -m 1G -display none -no-reboot \
  -net none -serial "file:$serial" -monitor none \
  -drive "file=$work/rootfs.img,format=raw,if=virtio,cache=unsafe" \
  -kernel "$kernel" -initrd "$work/initrd.img" \
  -append "root=/dev/vda rw console=ttyS0 quiet systemd.show_status=0 panic=-1" \
  </dev/null >"$work/qemu.log" 2>&1 &
qemu_pid=$!
status=0
timeout -s KILL "$vm_timeout" tail --pid="$qemu_pid" -f /dev/null || status=$?
if kill -0 "$qemu_pid" 2>/dev/null; then
  kill -KILL "$qemu_pid" || true
  echo "the VM did not power off within ${vm_timeout}s"
fi
wait "$qemu_pid" 2>/dev/null || true
qemu_pid=
stamp "boot + smoke took $((SECONDS - t0)) s"

grep -a -E '^(SMOKE|JOURNAL)' "$serial" || { echo "--- serial log"; tail -n 60 "$serial"; }
cat "$work/qemu.log"
echo "total $((SECONDS - started)) s (isolation $isolation, ${accel^^})"
if grep -aq '^SMOKE RESULT: PASS' "$serial" && [ "$status" = 0 ]; then
  echo "systemd smoke: PASS"
  exit 0
fi
echo "systemd smoke: FAIL"
exit 1
