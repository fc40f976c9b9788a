#!/usr/bin/env bash
# Guest side of tests/vm/run.sh: prepare a delegated cgroup-v2 subtree, run pytest in it, and
# write pytest's exit code to vm-out/status. Runs as root under virtme-ng's init.
#
#   inside.sh <vm-out dir>      (arguments and environment come from <vm-out>/args and /env)
#
# The guest: host root filesystem read-only (9p), /tmp and a few others throw-away overlays,
# <vm-out> the only directory written back to the host. cgroup2 is mounted at /sys/fs/cgroup
# without nsdelegate; every process starts in the root cgroup.
#
# cgroup layout it prepares (the test run's view is that of a systemd service with
# Delegate=yes, which is what sandboxd expects on cgroup v2):
#
#   /sys/fs/cgroup                      subtree_control: cpu memory pids cpuset (+ what was there)
#   |                                   holds init, this script and the rest of the guest
#   `-- sandboxd-vm-tests/              = D, the delegated cgroup of the test run
#                                       cgroup.controllers: cpu memory pids cpuset (for D's
#                                       children once D enables them); subtree_control: EMPTY;
#                                       cgroup.procs: pytest and nothing else
#
# Why this shape. cgroup v2 lets only leaves hold processes once a cgroup enables controllers
# for its children ("no internal processes"). So D must start with processes and an empty
# subtree_control, exactly like a Delegate=yes unit: whoever wants child cgroups with limits
# (the daemon's cgroup v2 driver, or a test doing what it does) first moves every process of D
# into a leaf (sandboxd uses D/sandboxd-supervisor) and then enables memory/cpu/pids in D.
# This script therefore stays in the root cgroup (which is exempt from that rule) and starts
# pytest directly into D, so nothing but the test run has to be moved. After a daemon (or the
# smoke test) has prepared D, pytest lives in D/sandboxd-supervisor and D's subtree_control is
# "cpu memory pids cpuset"; a later daemon started from there takes D (the supervisor leaf's
# parent) as its delegated cgroup again.
#
# The test run also sees: SANDBOXD_VM=1, SANDBOXD_VM_CGROUP=/sys/fs/cgroup/sandboxd-vm-tests,
# HOME and TMPDIR under /tmp, PYTHONDONTWRITEBYTECODE=1, no pytest cache, Hypothesis' database
# under /tmp, COVERAGE_FILE=<vm-out>/.coverage.vm (same paths as on the host, so the host can
# combine it as is).
set -euo pipefail

out="${1:?usage: inside.sh <vm-out dir>}"
status_file="$out/status"
status=99 # what the host sees if this script dies before pytest ends

finish() {
    if [[ "$status" == 99 ]]; then
        printf 'inside.sh: stopped before pytest finished; reporting status 99\n' >&2
    fi
    printf '%s\n' "$status" >"$status_file.tmp" && mv -f "$status_file.tmp" "$status_file"
    sync
}
trap finish EXIT

fail() {
    printf 'inside.sh: %s\n' "$*" >&2
    exit 1 # finish() reports status 99
}

date +%s >"$out/booted"
printf 'inside.sh: guest up after %ss (kernel %s)\n' "$(cut -d' ' -f1 /proc/uptime)" "$(uname -r)" >&2

VM_PY_DIRS=()
# shellcheck source=/dev/null
source "$out/env"
args=()
while IFS= read -r -d '' arg; do args+=("$arg"); done <"$out/args"

# --- cgroup v2 -------------------------------------------------------------------------
cgroot=/sys/fs/cgroup
want=(memory cpu pids cpuset)
[[ "$(stat -f -c %T "$cgroot")" == cgroup2fs ]] || fail "$cgroot is not a cgroup2 mount"
available="$(cat "$cgroot/cgroup.controllers")"
for c in "${want[@]}"; do
    [[ " $available " == *" $c "* ]] || fail "controller $c missing from $cgroot ($available)"
done
echo "+memory +cpu +pids +cpuset" >"$cgroot/cgroup.subtree_control"

delegated="$cgroot/sandboxd-vm-tests"
mkdir -p "$delegated"
for c in "${want[@]}"; do
    grep -qw "$c" "$delegated/cgroup.controllers" || fail "controller $c not available in $delegated"
done
[[ -z "$(cat "$delegated/cgroup.subtree_control")" ]] || fail "$delegated already enables controllers"
printf 'inside.sh: root subtree_control: %s; test run in %s (controllers: %s)\n' \
    "$(cat "$cgroot/cgroup.subtree_control")" "$delegated" "$(cat "$delegated/cgroup.controllers")" >&2

# --- faster imports: the Python trees again over 9p with caching --------------------------
# virtme-ng mounts the host root without caching, so every stat/open/read of an import is a
# round trip to qemu. run.sh exports the host root a second time (tag vmhost); bind its
# cached view over the directories Python imports from. The host does not change them during
# the run, so loose caching is safe. Directories the guest overlays (/usr, /opt...) are left
# alone. Any failure here only costs speed.
if mkdir -p /run/vm-hostroot \
    && mount -t 9p -o trans=virtio,version=9p2000.L,cache=loose,msize=512000,ro vmhost /run/vm-hostroot; then
    for dir in "${VM_PY_DIRS[@]}"; do
        [[ -d "$dir" ]] || continue
        [[ "$(findmnt -n -o TARGET --target "$dir")" == / ]] || continue
        if mount --bind "/run/vm-hostroot$dir" "$dir"; then
            printf 'inside.sh: cached 9p view of %s\n' "$dir" >&2
        fi
    done
else
    printf 'inside.sh: no cached 9p view (mount vmhost failed); imports will be slower\n' >&2
fi

# --- kernel modules ------------------------------------------------------------------------
# virtme-ng links /lib/modules/<version> to the cached kernel's modules by their host path,
# which the guest's /var overlay hides; point the link at the same tree through the vmhost
# mount, so explicit loads and the kernel's own autoloads (veth for the egress pairs, the
# nf_tables expressions of its ruleset, loop for the disk-limit images) find them.
kver="$(uname -r)"
link="/lib/modules/$kver"
if [[ -L "$link" && ! -e "$link" && -d "/run/vm-hostroot$(readlink "$link")" ]]; then
    target="/run/vm-hostroot$(readlink "$link")"
    rm -f "$link" && ln -s "$target" "$link"
fi
for mod in veth nf_tables loop btrfs; do
    modprobe -q "$mod" || printf 'inside.sh: module %s cannot be loaded\n' "$mod" >&2
done

# --- environment -----------------------------------------------------------------------
export HOME=/tmp/vm-home
export TMPDIR=/tmp
export XDG_CACHE_HOME="$HOME/.cache"
export PYTHONDONTWRITEBYTECODE=1
export HYPOTHESIS_STORAGE_DIRECTORY=/tmp/hypothesis
export COVERAGE_FILE="$VM_OUT/.coverage.vm"
export SANDBOXD_VM=1
export SANDBOXD_VM_CGROUP="$delegated"
# `python3` in the tests is the interpreter run.sh resolved (its venv, if any), then the host's PATH.
PATH="${VM_GUEST_PYTHON%/*}:$VM_HOST_PATH:/usr/sbin:/usr/bin:/sbin:/bin"
export PATH
mkdir -p "$HOME" "$HYPOTHESIS_STORAGE_DIRECTORY"
cd "$VM_REPO"

cmd=("$VM_GUEST_PYTHON")
if [[ "$VM_WITH_COVERAGE" == 1 ]]; then
    cmd+=(-m coverage run)
    if [[ -n "${VM_COVERAGE_SOURCE:-}" ]]; then
        # pyproject's settings, with only the paths asked for measured (absolute: the daemons
        # the tests start run elsewhere); subprocesses inherit this configuration.
        rc=/tmp/vm-coverage.toml
        {
            printf '[tool.coverage.run]\nbranch = true\nparallel = true\npatch = ["subprocess"]\n'
            printf 'disable_warnings = ["no-data-collected", "module-not-imported", "module-not-measured"]\n'
            printf 'source = ['
            for path in $VM_COVERAGE_SOURCE; do printf '"%s/%s", ' "$VM_REPO" "$path"; done
            printf ']\n'
        } >"$rc"
        cmd+=("--rcfile=$rc")
    fi
fi
cmd+=(-m pytest -p no:cacheprovider)
if [[ "$VM_PYTEST_PLUGINS" != auto ]]; then
    # Load only the plugins named (importing all installed ones costs minutes under TCG).
    export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
    read -r -a plugins <<<"$VM_PYTEST_PLUGINS"
    for arg in "${args[@]}"; do
        if [[ "$arg" == --cov* ]]; then plugins+=(pytest_cov); break; fi
    done
    for plugin in "${plugins[@]}"; do cmd+=(-p "$plugin"); done
fi
cmd+=("${args[@]}")
printf 'inside.sh: %s\n' "${cmd[*]}" >&2

# --- run pytest as the only process of the delegated cgroup ---------------------------
# pytest gets a session and process group of its own (reaper.py's setsid), so a test or
# daemon that signals "its" process group by mistake cannot take this script or tee down with
# it and lose the status. For the same reason this script only
# notes SIGTERM/SIGHUP/SIGINT while it waits, and tee ignores them (tee stays in the root
# cgroup; its copy of the output goes to vm-out/pytest.log).
for sig in TERM HUP INT; do
    # shellcheck disable=SC2064 # expand $sig now
    trap "printf 'inside.sh: got SIG%s; still waiting for pytest\\n' $sig >&2" "$sig"
done
set +e
# tests/vm/reaper.py starts pytest into the delegated cgroup and reaps the orphans below it
# (virtme-ng's init, PID 1 here, does not; see that file), staying in the root cgroup itself.
"$VM_GUEST_PYTHON" "$VM_REPO/tests/vm/reaper.py" "$delegated/cgroup.procs" "${cmd[@]}" 2>&1 | (
    trap '' TERM HUP INT
    exec tee "$out/pytest.log"
)
status=${PIPESTATUS[0]}
set -e
printf 'inside.sh: pytest exited %s after %ss of guest uptime\n' "$status" "$(cut -d' ' -f1 /proc/uptime)" >&2

# Anything the tests left running dies with the VM anyway; kill it first so no writer races
# the status file.
if [[ -e "$delegated/cgroup.kill" ]]; then echo 1 >"$delegated/cgroup.kill" || true; fi
