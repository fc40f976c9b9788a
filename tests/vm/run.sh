#!/usr/bin/env bash
# Run pytest inside ONE cgroup-v2 VM (virtme-ng; KVM when it works, else software emulation) and
# exit with its status.
#
#   tests/vm/run.sh [--coverage] [pytest args...]
#   tests/vm/run.sh -m kernel tests/vm
#   tests/vm/run.sh --coverage -m kernel tests/kernel      # then: coverage combine . vm-out
#
# Needs root and what .ci/vm-deps.sh provides (qemu, /opt/vng, a Debian kernel and its modules
# in the cache, see tests/vm/guest.sh). The guest boots that kernel under KVM when a probe boot
# with KVM reaches its init (else software emulation, TCG; the choice is printed), with the
# host's root filesystem read-only (over 9p), runs tests/vm/inside.sh as root, and powers off. Only <repo>/vm-out is writable in
# the guest and is written back; run.sh passes the arguments and environment in through it
# and reads back the test run's exit code (vm-out/status) and coverage data.
#
# --coverage     run pytest under `coverage run` in the guest (pyproject's [tool.coverage]);
#                the data lands in vm-out/.coverage.vm.* for the host's `coverage combine`.
#                pytest-cov arguments (--cov...) work too: COVERAGE_FILE points into vm-out.
#                Reports that write files (xml, html, junit) must name a path in vm-out.
#
# Environment:
#   VM_PYTHON     interpreter for the guest's pytest (default: `python3` on PATH, e.g. the
#                 project venv); its sys.executable is used, so a venv stays a venv
#   VM_TIMEOUT    seconds before the whole VM is killed (default 1500)
#   VM_CPUS, VM_MEMORY, VNG       (defaults 2, 2G, /opt/vng/bin/vng)
#   VM_KERNEL     kernel image (default: the cached one of .ci/vm-deps.sh); its modules are
#                 <root>/lib/modules/<version> of the tree the image lies in (virtme-ng's rule)
#   VM_ACCEL      kvm, tcg or auto (default: probe /dev/kvm); VM_KVM_PROBE_TIMEOUT (10 s)
#   VM_COVERAGE_SOURCE  with --coverage: measure only these paths of the work tree (space-
#                 separated, e.g. the code only this guest reaches); the rest of pyproject's
#                 [tool.coverage.run] holds (docs/performance.rst, "CI's time").
#   VM_PASS_ENV   extra variable names to pass into the guest (PYTHONPATH, PYTEST_ADDOPTS,
#                 CI and SANDBOXD_*/HYPOTHESIS_* variables always are)
#   VM_PYTEST_PLUGINS  pytest plugins loaded in the guest (default "pytest_twisted"; pytest_cov
#                 is added for --cov arguments). Entry-point autoloading is off in the guest:
#                 importing every installed plugin (schemathesis, hypothesis...) costs minutes
#                 under emulation. "auto" turns autoloading back on.
#
# Exit status: pytest's (0 passed, 1 failed, 5 no tests collected...), or 97 when the
# guest never started inside.sh (boot failure), 98 when it started but never reported
# (crash, timeout), 99 when inside.sh failed before pytest (no cgroup2, missing
# controllers), 96 when run.sh itself cannot start (missing deps, busy vm-out).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
# shellcheck source=guest.sh
source "$here/guest.sh"
repo="$(cd "$here/../.." && pwd -P)"
out="$repo/vm-out"

VNG="${VNG:-/opt/vng/bin/vng}"
VM_TIMEOUT="${VM_TIMEOUT:-1500}"
VM_CPUS="${VM_CPUS:-2}"
VM_MEMORY="${VM_MEMORY:-2G}"
VM_PYTHON="${VM_PYTHON:-python3}"

# udev in the guest coldplugs every emulated device and loads a module for each; under TCG
# some take tens of seconds (kvm_amd, powernow_k8...) and none is needed for cgroup tests.
# Blacklisting keeps udev from autoloading them (explicit modprobe still works).
VM_MODULE_BLACKLIST="${VM_MODULE_BLACKLIST:-kvm,kvm_amd,kvm_intel,powernow_k8,acpi_cpufreq,pcc_cpufreq,amd64_edac,edac_mce_amd,k10temp,fam15h_power,sp5100_tco,ccp,iTCO_wdt,iTCO_vendor_support,intel_pmc_bxt,i6300esb,lpc_ich,i2c_i801,i2c_smbus,pcspkr,psmouse,serio_raw,evdev,joydev,ahci,libahci,libata,sr_mod,cdrom,sg,scsi_mod,qemu_fw_cfg,aesni_intel,crypto_simd,cryptd,ghash_clmulni_intel,sha512_ssse3,sha256_ssse3,sha1_ssse3,crc32_pclmul,crc32c_intel,crct10dif_pclmul,polyval_clmulni,polyval_generic,button,intel_rapl_msr,intel_rapl_common,rapl,drm,bochs,virtio_gpu,virtio_net,net_failover,failover,virtio_rng,rng_core,virtio_balloon}"

die() {
    local code="$1"
    shift
    printf 'tests/vm/run.sh: %s\n' "$*" >&2
    exit "$code"
}

coverage=0
if [[ "${1:-}" == "--coverage" ]]; then
    coverage=1
    shift
fi
[[ "${VM_COVERAGE:-0}" == 1 ]] && coverage=1

# --- preconditions (fail before booting anything) ----------------------------
[[ "$(id -u)" -eq 0 ]] || die 96 "must run as root (the guest user is root; cgroup setup needs it)"
[[ -x "$VNG" ]] || die 96 "no $VNG: run .ci/vm-deps.sh first"
command -v qemu-system-x86_64 >/dev/null || die 96 "no qemu-system-x86_64: run .ci/vm-deps.sh first"
if [[ -z "${VM_KERNEL:-}" ]]; then
    kernel_dir="$(guest_kernel_dir --offline)" || die 96 "no cached guest kernel: run .ci/vm-deps.sh first"
    VM_KERNEL="$(guest_kernel_image "$kernel_dir")" || die 96 "no kernel image in $kernel_dir"
fi
[[ -n "$VM_KERNEL" && -r "$VM_KERNEL" ]] || die 96 "cannot read the kernel $VM_KERNEL"
accel="$(guest_accel "$VM_KERNEL")" || die 96 "cannot choose an accelerator"
guest_python="$("$VM_PYTHON" -c 'import sys; print(sys.executable)')" \
    || die 96 "cannot run $VM_PYTHON"
[[ -x "$guest_python" ]] || die 96 "$VM_PYTHON reports sys.executable=$guest_python, not executable"
"$guest_python" -c 'import pytest' 2>/dev/null || die 96 "$guest_python cannot import pytest"
if ((coverage)); then
    "$guest_python" -c 'import coverage' 2>/dev/null || die 96 "$guest_python cannot import coverage"
fi

mkdir -p "$out"
exec 9>"$out/.lock"
flock -n 9 || die 96 "another tests/vm/run.sh is using $out"
rm -f "$out/status" "$out/booted" "$out/args" "$out/env" "$out/pytest.log"

# --- hand the arguments and environment to the guest through vm-out -----------------
# Arguments NUL-separated (any bytes survive); environment as bash-quoted assignments.
if (($#)); then printf '%s\0' "$@" >"$out/args"; else : >"$out/args"; fi
{
    printf 'VM_REPO=%q\n' "$repo"
    printf 'VM_OUT=%q\n' "$out"
    printf 'VM_GUEST_PYTHON=%q\n' "$guest_python"
    printf 'VM_WITH_COVERAGE=%q\n' "$coverage"
    printf 'VM_COVERAGE_SOURCE=%q\n' "${VM_COVERAGE_SOURCE:-}"
    printf 'VM_HOST_PATH=%q\n' "$PATH"
    printf 'VM_PYTEST_PLUGINS=%q\n' "${VM_PYTEST_PLUGINS:-pytest_twisted}"
    # Where the guest's Python reads its modules from: inside.sh remounts these with 9p page
    # and dentry caching (the default 9p root has none: every import is many round trips).
    "$guest_python" -c 'import site, sys; print("\n".join(sorted({sys.prefix, sys.base_prefix, *site.getsitepackages()})))' \
        | while IFS= read -r dir; do printf 'VM_PY_DIRS+=(%q)\n' "$dir"; done
    names=(PYTHONPATH PYTEST_ADDOPTS CI)
    read -r -a extra <<<"${VM_PASS_ENV:-}"
    names+=("${extra[@]}")
    while IFS= read -r name; do names+=("$name"); done < <(compgen -e | grep -E '^(SANDBOXD|HYPOTHESIS)_' || true)
    for name in "${names[@]}"; do
        if [[ -n "${!name+set}" ]]; then printf 'export %s=%q\n' "$name" "${!name}"; fi
    done
} >"$out/env"

# --- boot -----------------------------------------------------------------------
exec_cmd="$(printf '%q %q' "$here/inside.sh" "$out")"
vng_args=(
    --run "$VM_KERNEL"
    --user root
    --force-9p    # no usable virtiofsd on Debian 12; skip probing for one
    --cpus "$VM_CPUS"
    --memory "$VM_MEMORY"
    --rwdir="$out"
    # The same host root again, for inside.sh to mount with cache=loose (see VM_PY_DIRS).
    --qemu-opts="-fsdev local,id=vmhost,path=/,readonly=on,security_model=none,multidevs=remap -device virtio-9p-pci,fsdev=vmhost,mount_tag=vmhost"
    # mitigations=off: speculative-execution mitigations cost much under TCG and protect nothing
    # the tests check (they check uid/cgroup isolation, not side channels).
    --append "mitigations=off modprobe.blacklist=$VM_MODULE_BLACKLIST"
    --exec "$exec_cmd"
)
# virtme-ng uses /dev/kvm whenever it can open it (with -cpu host); the probe above decides.
if [[ "$accel" != kvm ]]; then vng_args+=(--disable-kvm); fi
printf 'tests/vm/run.sh: booting %s (%s CPUs, %s, %s, timeout %ss)\n' \
    "$VM_KERNEL" "$VM_CPUS" "$VM_MEMORY" "${accel^^}" "$VM_TIMEOUT" >&2
started=$SECONDS
cd "$repo"
# vng's stdout must be a pipe, never a file (qemu reopens it with O_TRUNC); no stdin in CI.
set +e
PATH="$(dirname "$VNG"):$PATH" timeout -s KILL "$VM_TIMEOUT" "$VNG" "${vng_args[@]}" </dev/null 2>&1 | cat
vng_rc=${PIPESTATUS[0]}
set -e
elapsed=$((SECONDS - started))

# --- the verdict comes from vm-out/status, not from vng's exit code -------------------
if [[ -s "$out/status" ]]; then
    status="$(tr -dc '0-9' <"$out/status")"
    [[ -n "$status" ]] || die 98 "guest wrote a malformed vm-out/status"
    printf 'tests/vm/run.sh: guest test run exited %s (VM %ss, %s, vng exit %s)\n' \
        "$status" "$elapsed" "${accel^^}" "$vng_rc" >&2
    exit "$status"
fi
if [[ "$vng_rc" -eq 137 ]]; then
    why="killed after the ${VM_TIMEOUT}s timeout"
else
    why="vng exited $vng_rc"
fi
if [[ -e "$out/booted" ]]; then
    die 98 "guest started tests but never reported a status ($why after ${elapsed}s; see the console output above)"
fi
die 97 "guest did not boot to tests/vm/inside.sh ($why after ${elapsed}s; see the console output above)"
