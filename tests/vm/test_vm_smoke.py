"""Placeholder real-kernel test: cgroup v2 memory.max really OOM-kills a setpriv'd command.

Runs where the test process sits on a pure cgroup v2 hierarchy with memory, cpu and pids
available to its cgroup, as root: in the VM of ``tests/vm/run.sh``. Skipped anywhere else (on
the hybrid hosts, v1 enforces limits and the v1 tests cover it).

It does what sandboxd's cgroup v2 driver does with its delegated cgroup ``D`` (the test
process's own cgroup, read from /proc/self/cgroup): move every process of ``D`` into the leaf
``D/sandboxd-supervisor`` (same name as the daemon's, so the two compose in one test run), enable
``memory cpu pids`` in ``D``, then make a child cgroup for the "sandbox". The eviction is left
in place, as a daemon would leave it.
"""

import contextlib
import errno
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

CGROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "cpu", "pids")
SUPERVISOR = "sandboxd-supervisor"
SANDBOX_UID = 100000
JOIN_AND_DROP = (
    'echo $$ > "$1/cgroup.procs" && '
    f"exec setpriv --reuid={SANDBOX_UID} --regid={SANDBOX_UID} --clear-groups -- "
    '"$2" -c "bytearray(200 * 1024 * 1024)"'
)


def _own_cgroup() -> str | None:
    """The cgroup v2 path of this process when /proc/self/cgroup is pure v2, else None."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    if len(lines) != 1 or not lines[0].startswith("0::"):
        return None
    return lines[0][3:]


def _delegated() -> Path:
    """``D``: our own cgroup, or its parent when we already sit in the supervisor leaf."""
    own = _own_cgroup()
    assert own is not None
    path = CGROOT / own.lstrip("/")
    return path.parent if path.name == SUPERVISOR else path


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    try:
        if _own_cgroup() is None:
            return "not on a pure cgroup v2 hierarchy (/proc/self/cgroup has v1 lines)"
        if not any(
            line.split()[4] == str(CGROOT) and line.split(" - ")[1].startswith("cgroup2 ")
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
        ):
            return f"cgroup2 is not mounted at {CGROOT}"
        available = (_delegated() / "cgroup.controllers").read_text().split()
    except OSError as e:
        return f"cannot inspect cgroups: {e}"
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        return f"controllers {' '.join(missing)} not available to {_delegated()}"
    if shutil.which("setpriv") is None:
        return "no setpriv"
    return None


WHY_NOT = _why_not()
pytestmark = [pytest.mark.kernel, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]


def _prepare(delegated: Path) -> None:
    """Evict ``D`` into its supervisor leaf (unless ``D`` is the root) and enable controllers."""
    if delegated != CGROOT:
        leaf = delegated / SUPERVISOR
        leaf.mkdir(exist_ok=True)
        for _ in range(10):
            pids = (delegated / "cgroup.procs").read_text().split()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    (leaf / "cgroup.procs").write_text(pid)
        assert not (delegated / "cgroup.procs").read_text().split()
    enabled = (delegated / "cgroup.subtree_control").read_text().split()
    missing = [c for c in CONTROLLERS if c not in enabled]
    if missing:
        (delegated / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))


def _remove(cgroup: Path) -> None:
    for _ in range(100):
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            kill = cgroup / "cgroup.kill"
            if kill.exists():
                kill.write_text("1")
            time.sleep(0.1)
    cgroup.rmdir()


def _sandbox_python() -> str:
    """An interpreter the sandbox uid can reach (/root, home of pyenv, is 0700)."""
    for candidate in ("/usr/bin/python3", shutil.which("python3")):
        if candidate and os.access(candidate, os.X_OK) and not candidate.startswith("/root/"):
            return candidate
    pytest.skip("no python3 outside /root for the sandbox uid")


def test_memory_max_oom_kills_setpriv_command() -> None:
    delegated = _delegated()
    _prepare(delegated)
    assert set(CONTROLLERS) <= set((delegated / "cgroup.subtree_control").read_text().split())
    sandbox = delegated / f"vm-smoke-{os.getpid()}"
    sandbox.mkdir()
    try:
        (sandbox / "memory.max").write_text("50M")
        if (sandbox / "memory.swap.max").exists():
            (sandbox / "memory.swap.max").write_text("0")
        assert (sandbox / "memory.max").read_text().strip() == str(50 * 1024 * 1024)
        started = time.monotonic()
        proc = subprocess.run(
            ["sh", "-c", JOIN_AND_DROP, "sh", str(sandbox), _sandbox_python()],
            capture_output=True,
            text=True,
            timeout=300,
        )
        took = time.monotonic() - started
        # sh execs setpriv execs python: the child we waited for is the OOM-killed process.
        assert proc.returncode in (-9, 137), (proc.returncode, proc.stdout, proc.stderr, took)
        events = dict(line.split() for line in (sandbox / "memory.events").read_text().splitlines())
        assert events["oom_kill"] == "1", events
        assert not (sandbox / "cgroup.procs").read_text().split()
    finally:
        _remove(sandbox)
    assert not sandbox.exists()
