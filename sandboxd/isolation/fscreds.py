"""File work under a sandbox's own filesystem credentials (per-thread ``setfsuid``/``setfsgid``).

Linux keeps the filesystem uid and gid per thread, and the daemon runs as root: a worker thread
that sets them to a sandbox's identity gets exactly the sandbox's access to every path it opens,
whatever symlink, hardlink or swapped component the path meets, while the reactor thread keeps
root's. Each call switches, runs the work, and always switches back (pool threads are reused).

The thread pool belongs to whoever created it (the daemon's service starts and stops it);
:meth:`FsCredentialThreads.start` and :meth:`FsCredentialThreads.stop` are there for callers that
hand that job to this object instead.
"""

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from sandboxd.isolation.base import Identity

T = TypeVar("T")

QUERY = -1
"""An invalid id: ``setfsuid(-1)`` changes nothing, returns the current fsuid (man 2 setfsuid)."""


ROOT = Identity(0, 0)
"""Where the daemon's threads return after each call."""


class FsCredentialsError(Exception):
    """The kernel refused a filesystem-credential switch (the work was not run)."""


class FsIds(Protocol):
    """The two libc calls, each returning the thread's previous filesystem id."""

    def setfsuid(self, uid: int) -> int: ...

    def setfsgid(self, gid: int) -> int: ...


class LibcFsIds:
    """``setfsuid``/``setfsgid`` of the C library, through ctypes."""

    def __init__(self, libc: Any = None) -> None:
        """Use ``libc`` (a ``ctypes.CDLL``), else the process's own C library."""
        if libc is None:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._setfsuid = libc.setfsuid
        self._setfsgid = libc.setfsgid
        for call in (self._setfsuid, self._setfsgid):
            call.argtypes = [ctypes.c_uint]
            call.restype = ctypes.c_int

    def setfsuid(self, uid: int) -> int:
        """Set the calling thread's fsuid; return the previous one (``-1`` only queries)."""
        return int(self._setfsuid(uid & 0xFFFFFFFF))

    def setfsgid(self, gid: int) -> int:
        """Set the calling thread's fsgid; return the previous one (``-1`` only queries)."""
        return int(self._setfsgid(gid & 0xFFFFFFFF))


def switch_to(ids: FsIds, identity: Identity) -> None:
    """Set the thread's fsgid then fsuid, checking each took (the calls report no error)."""
    ids.setfsgid(identity.gid)
    if ids.setfsgid(QUERY) != identity.gid:
        raise FsCredentialsError(f"setfsgid({identity.gid}) was refused")
    ids.setfsuid(identity.uid)
    if ids.setfsuid(QUERY) != identity.uid:
        raise FsCredentialsError(f"setfsuid({identity.uid}) was refused")


def call_as(ids: FsIds, identity: Identity, home: Identity, work: Callable[[], T]) -> T:
    """``work()`` with the thread's filesystem ids set to ``identity``, then back to ``home``.

    The switch back happens whatever ``work`` did; if even that is refused the thread cannot be
    trusted again, and :class:`FsCredentialsError` replaces whatever ``work`` returned or raised.
    """
    try:
        switch_to(ids, identity)
        return work()
    finally:
        ids.setfsuid(home.uid)
        ids.setfsgid(home.gid)
        if ids.setfsuid(QUERY) != home.uid or ids.setfsgid(QUERY) != home.gid:
            raise FsCredentialsError(f"could not restore fsuid/fsgid {home.uid}/{home.gid}")


class FsCredentialThreads:
    """``FsCredentials``: each call in a pool thread with the sandbox's fsuid/fsgid.

    ``home`` is what the threads return to after every call: root's ``0/0`` in the daemon.
    Identity 0 is refused: work as root needs no switch and must not look as if it had one.
    """

    def __init__(
        self,
        reactor: IReactorFromThreads,
        pool: ThreadPool,
        ids: FsIds,
        home: Identity = ROOT,
    ) -> None:
        self.reactor = reactor
        self.pool = pool
        self.ids = ids
        self.home = home

    def run(self, identity: Identity, work: Callable[[], T]) -> Deferred[T]:
        """Call ``work()`` in a pool thread as ``identity``; fire with its result or failure."""
        if identity.uid == 0 or identity.gid == 0:
            raise ValueError(f"refusing file work as root identity {identity}")
        return deferToThreadPool(
            self.reactor, self.pool, call_as, self.ids, identity, self.home, work
        )

    def start(self) -> None:
        """Start the pool's threads (for a caller that leaves the pool to this object)."""
        if not self.pool.started:
            self.pool.start()

    def stop(self) -> None:
        """Stop the pool, waiting for the running calls (no-op when not started)."""
        if self.pool.started:
            self.pool.stop()


def drop_supplementary_groups(setgroups: Callable[[list[int]], None] = os.setgroups) -> None:
    """Clear the daemon's supplementary groups (process-wide), which fsgid does not replace.

    Without this, file work "as the sandbox" would still carry root's groups (e.g. ``shadow``).
    """
    setgroups([])
