"""``--isolation=none``: development mode, no cgroup, namespace or system call filter.

Started as a user, every sandbox runs as the daemon's own user: the only separation is the
per-sandbox directory and a process group per exec; the pool still bounds how many sandboxes
live at once, so capacity behaves as it does when isolated. Started as root, commands never run
as root: each sandbox still gets a uid of the pool (``select.uid_only``), whose processes
:class:`SweptUidPool` kills when the sandbox goes.
"""

import contextlib
import os
import shutil
import signal
from collections.abc import Callable, Sequence
from typing import TypeVar

from attrs import define, field
from twisted.internet.defer import Deferred, succeed
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from sandboxd.isolation.base import (
    CD_AND_EXEC,
    CgroupStats,
    Identity,
    Isolation,
    IsolationUnavailable,
    Limits,
    NoFreeUid,
    Wrap,
)
from sandboxd.isolation.exec.helper import DEFAULT_UMASK, HelperSession
from sandboxd.isolation.layers import UMASK, umask_isolates
from sandboxd.isolation.uids import NumericUidPool

T = TypeVar("T")


@define
class CountingPool:
    """A pool of ``total`` slots that all hand out the same identity (the daemon's own)."""

    identity: Identity
    total: int
    _used: int = field(default=0, init=False)

    @property
    def free(self) -> int:
        return self.total - self._used

    def allocate(self) -> Identity:
        if self._used >= self.total:
            raise NoFreeUid(f"all {self.total} sandbox slots are in use")
        self._used += 1
        return self.identity

    def release(self, identity: Identity) -> None:
        self._used = max(0, self._used - 1)


@define
class NoCgroups:
    """A cgroup driver that creates nothing and reports zero usage."""

    name: str = "none"

    def problem(self) -> None:
        """Always possible."""

    def preflight(self) -> None:
        """Always possible."""

    def unprepare(self) -> None:
        """Nothing was made."""

    def create(self, rid: str, limits: Limits) -> None:
        """No cgroup: limits are not enforced in this mode."""

    def join_files(self, rid: str) -> Sequence[str]:
        return ()

    def kill(self, rid: str) -> Deferred[None]:
        """Nothing to sweep: the manager kills each exec's process group itself."""
        return succeed(None)

    def remove(self, rid: str) -> None:
        """Nothing was created."""

    def freeze(self, rid: str, frozen: bool) -> Deferred[bool]:
        """No cgroup: nothing is frozen."""
        return succeed(False)

    def stats(self, rid: str) -> CgroupStats:
        return CgroupStats(memory_bytes=0, memory_peak_bytes=0, cpu_usec=0, pids=0, oom_kills=0)

    def oom_kills(self, rid: str) -> int:
        """No memory limit, no OOM kill of its own."""
        return 0

    def leftovers(self) -> list[str]:
        return []

    def remove_instance(self) -> None:
        """Nothing was created."""


@define
class ThreadedFiles:
    """Runs file work in a thread pool with the daemon's own credentials."""

    reactor: object
    pool: ThreadPool

    def run(self, identity: Identity, work: Callable[[], T]) -> Deferred[T]:
        return deferToThreadPool(self.reactor, self.pool, work)  # type: ignore[arg-type]


def session_wrapper(setsid: str, umask: int = DEFAULT_UMASK) -> Wrap:
    """Wrap a command so it starts a session (its own process group) in ``cwd`` with ``umask``,
    and nothing else (the shell chain, where the helper was not built)."""
    script = f"umask {umask:03o} && {CD_AND_EXEC}"

    def wrap(
        identity: Identity, join_files: Sequence[str], cwd: str, argv: Sequence[str]
    ) -> list[str]:
        return [setsid, "--", "/bin/sh", "-c", script, "sh", cwd, *argv]

    return wrap


def live_processes_of(uid: int, proc: str = "/proc") -> list[int]:
    """The pids of the live (not zombie) processes whose real uid is ``uid``."""
    found = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "status")) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue  # gone while looked at
        if fields["Uid"].split()[0] == str(uid) and not fields["State"].strip().startswith("Z"):
            found.append(int(name))
    return found


class SweptUidPool(NumericUidPool):
    """The pool of ``--isolation=none`` started as root: with no cgroup to kill a sandbox's
    processes by, a released uid's processes are killed (``SIGKILL``, until none is left)
    before it returns to the queue, so that nothing a sandbox started in the background meets
    the next one."""

    def __init__(
        self,
        uid_min: int,
        uid_max: int,
        processes_of: Callable[[int], list[int]] = live_processes_of,
        kill: Callable[[int, int], None] = os.kill,
    ) -> None:
        super().__init__(uid_min, uid_max)
        self._processes_of = processes_of
        self._kill = kill

    def release(self, identity: Identity) -> None:
        for _ in range(SWEEPS):
            pids = self._processes_of(identity.uid)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    self._kill(pid, signal.SIGKILL)
        else:
            raise OSError(f"uid {identity.uid} still runs processes after {SWEEPS} sweeps")
        super().release(identity)


SWEEPS = 100
"""Rounds of killing a released uid's processes (one that forks between the listing and the
kill needs another) before the uid is kept out of the pool."""


def find_program(name: str) -> str:
    """The absolute path of a program the daemon relies on, or a one-line refusal."""
    path = shutil.which(name, path=os.defpath + ":/usr/sbin:/sbin")
    if path is None:
        raise IsolationUnavailable(f"{name} not found (install util-linux)")
    return path


def no_isolation(
    reactor: object,
    pool: ThreadPool,
    capacity: int,
    helper: str | None,
    umask: int = DEFAULT_UMASK,
) -> Isolation:
    """The development bundle: the daemon's own uid, no cgroups, no system call filter, a
    session per exec with ``umask`` (through the exec ``helper`` when there is one)."""
    wrap: Wrap
    if helper is None:
        wrap = session_wrapper(find_program("setsid"), umask)
    else:
        wrap = HelperSession(helper, umask)
    return Isolation(
        name="none",
        uids=CountingPool(Identity(os.getuid(), os.getgid()), capacity),
        cgroups=NoCgroups(),
        fs=ThreadedFiles(reactor, pool),
        wrap=wrap,
        owns_files=False,
        exec_chain="shell" if helper is None else f"helper {helper}",
        layers=(UMASK,) if umask_isolates(umask) else (),
    )
