"""A fake cgroup filesystem with the kernel's semantics, over a temporary directory.

Directories and files are real (the drivers read them with ordinary file calls); what the
kernel would do on a write, ``mkdir`` or signal goes through :class:`FakeKernel`, whose methods
are injected as the drivers' :class:`~sandboxd.isolation.cgroups.cgfiles.Kernel`:

- ``mkdir`` creates a cgroup's control files (v2: depending on the parent's
  ``cgroup.subtree_control``; v1: depending on the hierarchy's controllers);
- writing a pid to ``cgroup.procs`` moves that process (``ESRCH`` if there is none);
- ``cgroup.kill``, ``cgroup.freeze``, ``freezer.state`` and ``cgroup.subtree_control`` behave
  as documented (``EBUSY`` when enabling controllers in a non-root cgroup with processes);
- a killed process leaves its cgroups after ``death_delay`` seconds of the clock, or when its
  frozen cgroup is thawed; ``rmdir`` of a cgroup with processes is ``EBUSY``.
"""

import errno
import os
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from attrs import define, field
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from sandboxd.isolation.cgroups.cgfiles import Kernel

T = TypeVar("T")

V2_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc"

V2_FILES = {
    "": {"cgroup.procs": "", "cgroup.subtree_control": "", "cgroup.type": "domain"},
    "memory": {
        "memory.max": "max",
        "memory.current": "0",
        "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0",
    },
    "cpu": {"cpu.max": "max 100000", "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0"},
    "pids": {"pids.max": "max", "pids.current": "0"},
    "cpuset": {"cpuset.cpus": "", "cpuset.cpus.effective": "0-3"},
}

V1_FILES = {
    "": {"cgroup.procs": "", "tasks": "", "notify_on_release": "0"},
    "memory": {
        "memory.limit_in_bytes": "9223372036854771712",
        "memory.usage_in_bytes": "0",
        "memory.max_usage_in_bytes": "0",
        "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0",
    },
    "cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1", "cpu.shares": "1024"},
    "cpuacct": {"cpuacct.usage": "0"},
    "pids": {"pids.max": "max", "pids.current": "0"},
    "freezer": {"freezer.state": "THAWED"},
    "cpuset": {
        "cpuset.cpus": "",
        "cpuset.mems": "",
        "cpuset.effective_cpus": "0-3",
        "cpuset.effective_mems": "0",
    },
}


def write(path: Path | str, text: str) -> None:
    Path(path).write_text(text)


@define
class FakeKernel:
    """The kernel side of a fake cgroup tree rooted at ``base`` (v2: ``base`` is the mount)."""

    base: Path
    version: int
    clock: Clock = field(factory=Clock)
    euid: int = 0
    pid: int = 4242
    death_delay: float = 0.0
    has_kill: bool = True
    has_swap: bool = True
    has_peak: bool = True
    has_memsw: bool = True
    has_kmem_tcp: bool = True
    sticky_freeze: bool = False
    """Freezing never completes (a process stuck in the kernel)."""
    immortal: set[int] = field(factory=set)
    """Pids that ignore SIGKILL (to test the grace period)."""
    respawn: int = 0
    """How many times a killed process forks a replacement first (a fork race)."""
    pidfd: bool = True
    fail: dict[str, OSError] = field(factory=dict)
    """Writes, mkdirs and rmdirs of these paths raise the error."""
    members: dict[int, dict[str, str]] = field(factory=dict)
    """pid → {hierarchy directory: cgroup directory}."""
    writes: list[tuple[str, str]] = field(factory=list)
    signalled: list[int] = field(factory=list)
    doomed: set[int] = field(factory=set)
    """Killed while frozen: they die when thawed."""
    open_fds: set[int] = field(factory=set)
    _next_pid: int = 1000

    # Set-up helpers

    def make_root(self, *hierarchies: str) -> None:
        """Create the v2 mount (real root, all controllers) or the named v1 hierarchies."""
        if self.version == 2:
            self.base.mkdir(parents=True, exist_ok=True)
            write(self.base / "cgroup.controllers", V2_CONTROLLERS)
            write(self.base / "cgroup.subtree_control", "")
            write(self.base / "cgroup.procs", "")
            write(self.base / "cpuset.cpus.effective", "0-3")
            return
        for name in hierarchies:
            root = self.base / name
            root.mkdir(parents=True)
            self._populate(root, name.split(","), v1=True)

    def make_cgroup(self, path: Path, controllers: str = "memory cpu pids") -> None:
        """A pre-existing cgroup (not made through the driver), with ``controllers`` available."""
        path.mkdir(parents=True)
        if self.version == 2:
            self._populate(path, controllers.split(), v1=False)
            write(path / "cgroup.controllers", controllers)
        else:
            self._populate(path, self._hierarchy(str(path)).name.split(","), v1=True)

    def spawn(self, *cgroups: Path | str) -> int:
        """A new live process in the given cgroups (one per hierarchy)."""
        pid = self._next_pid
        self._next_pid += 1
        self.members[pid] = {}
        for cgroup in cgroups:
            self._move(pid, str(cgroup))
        return pid

    def alive(self, pid: int) -> bool:
        return pid in self.members

    # Kernel methods

    def kernel(self) -> Kernel:
        return Kernel(
            write=self.write,
            mkdir=self.mkdir,
            rmdir=self.rmdir,
            kill=self.kill,
            pidfd_open=self.pidfd_open,
            pidfd_sigkill=self.pidfd_sigkill,
            close=self.close,
            geteuid=lambda: self.euid,
            getpid=lambda: self.pid,
        )

    def _check(self, path: str) -> None:
        if path in self.fail:
            raise self.fail[path]

    def mkdir(self, path: str) -> None:
        self._check(path)
        os.mkdir(path)
        if self.version == 2:
            parent = Path(path).parent
            enabled = (parent / "cgroup.subtree_control").read_text().split()
            self._populate(Path(path), enabled, v1=False)
            write(Path(path) / "cgroup.controllers", " ".join(enabled))
        else:
            self._populate(Path(path), self._hierarchy(path).name.split(","), v1=True)

    def rmdir(self, path: str) -> None:
        self._check(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if any(path in where.values() for where in self.members.values()):
            raise OSError(errno.EBUSY, "Device or resource busy", path)
        children = [p for p in Path(path).iterdir() if p.is_dir()]
        if children:
            raise OSError(errno.EBUSY, "Device or resource busy", path)
        for item in Path(path).iterdir():
            item.unlink()
        os.rmdir(path)

    def write(self, path: str, text: str) -> None:
        self._check(path)
        self.writes.append((path, text))
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        cgroup = os.path.dirname(path)
        name = os.path.basename(path)
        if name == "cgroup.procs":
            pid = int(text)
            if pid not in self.members:
                raise ProcessLookupError(errno.ESRCH, "No such process", path)
            self._move(pid, cgroup)
        elif name == "cgroup.kill":
            for pid in self._in(cgroup):
                self._doom(pid)
        elif name == "cgroup.freeze":
            write(path, text)
            self._render(cgroup)
            if text == "0":
                self._release_frozen(cgroup)
        elif name == "freezer.state":
            write(path, "FREEZING" if text == "FROZEN" and self.sticky_freeze else text)
            if text == "THAWED":
                self._release_frozen(cgroup)
        elif name == "cgroup.subtree_control":
            self._subtree_control(path, text)
        else:
            write(path, text)

    def kill(self, pid: int, sig: int) -> None:
        assert sig == signal.SIGKILL
        if pid not in self.members:
            raise ProcessLookupError(errno.ESRCH, "No such process")
        self._doom(pid)

    def pidfd_open(self, pid: int) -> int:
        if not self.pidfd:
            raise OSError(errno.ENOSYS, "Function not implemented")
        if pid not in self.members:
            raise ProcessLookupError(errno.ESRCH, "No such process")
        fd = 100_000 + pid
        self.open_fds.add(fd)
        return fd

    def pidfd_sigkill(self, fd: int) -> None:
        assert fd in self.open_fds
        self.kill(fd - 100_000, signal.SIGKILL)

    def close(self, fd: int) -> None:
        self.open_fds.remove(fd)

    # Internals

    def _hierarchy(self, path: str) -> Path:
        relative = Path(path).relative_to(self.base)
        return self.base / relative.parts[0]

    def _populate(self, path: Path, controllers: Iterable[str], v1: bool) -> None:
        table = V1_FILES if v1 else V2_FILES
        files = dict(table[""])
        for controller in controllers:
            files.update(table.get(controller, {}))
        if not v1:
            files["cgroup.events"] = "populated 0\nfrozen 0"
            files["cgroup.freeze"] = "0"
            if self.has_kill:
                files["cgroup.kill"] = ""
            if "memory" in controllers:
                if self.has_swap:
                    files["memory.swap.max"] = "max"
                if self.has_peak:
                    files["memory.peak"] = "0"
        elif "memory" in controllers:
            if self.has_memsw:
                files["memory.memsw.limit_in_bytes"] = "9223372036854771712"
            if self.has_kmem_tcp:
                files["memory.kmem.tcp.limit_in_bytes"] = "9223372036854771712"
        for name, text in files.items():
            write(path / name, text)

    def _subtree_control(self, path: str, text: str) -> None:
        cgroup = Path(path).parent
        enabled = Path(path).read_text().split()
        available = (cgroup / "cgroup.controllers").read_text().split()
        real_root = not (cgroup / "cgroup.type").exists()
        for word in text.split():
            sign, controller = word[0], word[1:]
            if controller not in available:
                raise OSError(errno.ENOENT, "No such file or directory", path)
            if sign == "+" and controller not in enabled:
                if self._in(str(cgroup)) and not real_root:
                    raise OSError(errno.EBUSY, "Device or resource busy", path)
                enabled.append(controller)
            elif sign == "-" and controller in enabled:
                enabled.remove(controller)
        write(path, " ".join(enabled))

    def _in(self, cgroup: str) -> list[int]:
        return sorted(pid for pid, where in self.members.items() if cgroup in where.values())

    def _move(self, pid: int, cgroup: str) -> None:
        hierarchy = str(self._hierarchy(cgroup)) if self.version == 1 else str(self.base)
        old = self.members[pid].get(hierarchy)
        self.members[pid][hierarchy] = cgroup
        for where in {old, cgroup} - {None}:
            assert where is not None
            self._render(where)

    def _render(self, cgroup: str) -> None:
        if not os.path.isdir(cgroup):
            return
        pids = self._in(cgroup)
        write(os.path.join(cgroup, "cgroup.procs"), "".join(f"{p}\n" for p in pids))
        if self.version == 2 and os.path.exists(os.path.join(cgroup, "cgroup.events")):
            frozen = Path(cgroup, "cgroup.freeze").read_text().strip() == "1"
            events = f"populated {int(bool(pids))}\nfrozen {int(frozen)}"
            write(os.path.join(cgroup, "cgroup.events"), events)

    def _frozen(self, pid: int) -> bool:
        for cgroup in self.members[pid].values():
            freeze = os.path.join(cgroup, "cgroup.freeze")
            state = os.path.join(cgroup, "freezer.state")
            if os.path.exists(freeze) and Path(freeze).read_text().strip() == "1":
                return True
            if os.path.exists(state) and Path(state).read_text().strip() != "THAWED":
                return True
        return False

    def _doom(self, pid: int) -> None:
        self.signalled.append(pid)
        if pid in self.immortal:
            return
        if self.respawn > 0:
            self.respawn -= 1
            self.spawn(*self.members[pid].values())
        if self._frozen(pid):
            self.doomed.add(pid)
            return
        self.clock.callLater(self.death_delay, self._die, pid)

    def _release_frozen(self, cgroup: str) -> None:
        for pid in self._in(cgroup):
            if pid in self.doomed and not self._frozen(pid):
                self.doomed.discard(pid)
                self.clock.callLater(self.death_delay, self._die, pid)

    def _die(self, pid: int) -> None:
        where = self.members.pop(pid, None)
        if where is None:
            return
        for cgroup in where.values():
            self._render(cgroup)


def settle(clock: Clock, d: "Deferred[T]", step: float = 0.01, limit: float = 120.0) -> T:
    """Advance ``clock`` until ``d`` fires; return its result or raise its failure."""
    results: list[object] = []
    d.addBoth(results.append)
    waited = 0.0
    while not results:
        assert waited < limit, "the Deferred never fired"
        clock.advance(step)
        waited += step
    result = results[0]
    if isinstance(result, Failure):
        result.raiseException()
    return result  # type: ignore[return-value]
