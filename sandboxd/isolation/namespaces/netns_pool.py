"""Network namespaces made and wired ahead of need (``SANDBOXD_NETNS_POOL``; docs/operating.rst,
"A pool of network namespaces").

Only the ``egress`` mode is pooled: its set-up (a veth, its addresses and routes, under the
kernel's RTNL lock) is most of a create's cost, while a ``none`` namespace (its loopback up) is
made in the same ``unshare`` as the sandbox's other namespaces for next to nothing. A pooled
namespace is wired for ``egress`` and nothing else, so a sandbox of another mode never gets
one (:meth:`sandboxd.isolation.namespaces.pins.Namespaces.create` asks the pool only for the
mode it belongs to).

:class:`NetnsPool` keeps up to ``size`` namespaces ready, each pinned at
``{root}/.ns/.pool/N`` (out of every sandbox's sight, as the sandboxes' pins are) and wired by
the mode with a slot of its own (:meth:`AheadMode.wire_ahead`). One thread of its own refills
it, one namespace at a time, never the reactor's. A create takes one (:meth:`NetnsPool.take`),
moves its pin to the sandbox's (:meth:`NetnsPool.hand_over`: one ``mount`` call) and the mode
binds the slot to the sandbox (:meth:`AheadMode.adopt`); an empty pool leaves the create to
today's path. A namespace is used once: the sandbox's end removes it as any other's, it never
comes back to the pool. At stop, the namespaces not handed out are unpinned (the kernel deletes
each one's veth with it) and their slots given back; at start-up, a crashed predecessor's pool
directory is emptied the same way (:meth:`NetnsPool.reclaim`).
"""

import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Protocol, runtime_checkable

from attrs import define, field, frozen
from twisted.logger import Logger

from sandboxd.isolation.namespaces.mounts import MountCalls
from sandboxd.isolation.network.modes import NetworkUnavailable
from sandboxd.isolation.network.netns_calls import in_a_thread_of_its_own, unshare_net

log = Logger()

POOL_DIR = ".pool"
"""The pool's directory in ``{root}/.ns`` (not a sandbox id: never taken for a leftover)."""
RETRY = 1.0
"""Seconds the refill waits after a failure before it tries again (doubled after each further
failure in a row, up to :data:`RETRY_MAX`: another daemon holding the host's egress layer for
long costs a line a minute, not one a second)."""
RETRY_MAX = 60.0


@runtime_checkable
class AheadMode(Protocol):
    """What the pool asks of the network mode it wires namespaces for."""

    def wire_ahead(self, netns: str) -> int:
        """Wire the namespace pinned at ``netns`` for no sandbox yet; the slot it took."""

    def adopt(self, rid: str, slot: int) -> None:
        """Give the slot wired ahead to sandbox ``rid``, whose pin its namespace now is."""

    def release_ahead(self, slot: int) -> None:
        """Give back a slot wired ahead whose namespace was removed unused."""


def build_pool(
    size: int, kinds: frozenset[str], offered: Mapping[str, object], nsroot: str
) -> "NetnsPool | None":
    """The pool of ``SANDBOXD_NETNS_POOL`` (``size``) for the ``egress`` mode among the
    ``offered`` modes, its pins in ``nsroot``; ``None`` when ``size`` is 0, or (logged) when
    network namespaces are off or egress is not offered."""
    if size == 0:
        return None
    mode = offered.get("egress")
    if "net" not in kinds or not isinstance(mode, AheadMode):
        log.warn(
            "netns pool: SANDBOXD_NETNS_POOL={size} ignored: only the egress mode is pooled,"
            " and it is not offered here",
            size=size,
        )
        return None
    return NetnsPool(os.path.join(nsroot, POOL_DIR), size, mode)


@frozen
class PooledNetns:
    """One namespace ready: where it is pinned, and the mode's slot wired into it."""

    pin: str
    slot: int


def make_netns(pin: str, mounts: MountCalls) -> None:
    """A new network namespace pinned on the (existing, empty) file ``pin``: made by a thread of
    its own that unshares it and binds its ``/proc/thread-self/ns/net`` there, then ends (the
    caller's thread never leaves its own namespace); ``OSError`` when the kernel refuses."""

    def work() -> None:
        unshare_net()
        mounts.bind("/proc/thread-self/ns/net", pin)

    in_a_thread_of_its_own(work, "sandboxd-netns-pool-unshare")


@define
class NetnsPool:
    """Up to ``size`` network namespaces wired ahead by ``mode`` (see the module docstring)."""

    directory: str
    """Where the pins are (``{root}/.ns/.pool``)."""
    size: int
    mode: AheadMode
    mounts: MountCalls = field(factory=MountCalls)
    make: Callable[[str, MountCalls], None] = make_netns
    retry: float = RETRY
    retry_max: float = RETRY_MAX
    made: int = 0
    """How many namespaces the pool has made so far (each is handed out at most once)."""
    taken: int = 0
    """How many creates took one."""
    _ready: deque[PooledNetns] = field(factory=deque)
    _wake: threading.Condition = field(factory=threading.Condition)
    _thread: threading.Thread | None = None
    _closing: bool = False

    def reclaim(self) -> int:
        """Unpin and remove whatever the pool's directory holds (a crashed predecessor's pool:
        the kernel deletes each namespace's veth with it); how many pins went."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        for name in names:
            path = os.path.join(self.directory, name)
            self.mounts.unmount_all(path)
            os.unlink(path)
        os.rmdir(self.directory)
        if names:
            log.info("netns pool: removed {n} namespaces of a predecessor", n=len(names))
        return len(names)

    def start(self) -> None:
        """Make the pool's directory and start the refill thread."""
        os.mkdir(self.directory, 0o700)
        self._closing = False
        self._thread = threading.Thread(target=self._refill, name="sandboxd-netns-pool")
        self._thread.daemon = True
        self._thread.start()

    def serves(self, mode: object) -> bool:
        """Whether the pool's namespaces are wired for ``mode`` (no other mode may get one)."""
        return mode is self.mode

    def take(self) -> PooledNetns | None:
        """A namespace ready for a create (the refill is woken to replace it); ``None`` when
        the pool is empty (the create makes its own, as without a pool)."""
        with self._wake:
            if not self._ready:
                return None
            pooled = self._ready.popleft()
            self.taken += 1
            self._wake.notify()
        return pooled

    def hand_over(self, pooled: PooledNetns, rid: str, pin: str) -> None:
        """Move ``pooled``'s namespace to the sandbox's ``pin`` (an empty file) and give its
        slot to sandbox ``rid``; on ``OSError`` the namespace is removed and its slot given
        back (the create goes on failing: nothing of it is left)."""
        try:
            self.mounts.move(pooled.pin, pin)
        except OSError:
            self._destroy(pooled)
            raise
        os.unlink(pooled.pin)
        self.mode.adopt(rid, pooled.slot)

    def ready(self) -> int:
        """How many namespaces are ready now."""
        with self._wake:
            return len(self._ready)

    def close(self) -> None:
        """Stop the refill (waiting for the namespace it is making), remove every namespace not
        handed out and the pool's directory."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        while self._ready:
            self._destroy(self._ready.popleft())
        with suppress(FileNotFoundError):
            os.rmdir(self.directory)

    def _refill(self) -> None:
        """The refill thread: one namespace at a time while the pool holds fewer than ``size``."""
        wait = self.retry
        while True:
            with self._wake:
                while not self._closing and len(self._ready) >= self.size:
                    self._wake.wait()
                if self._closing:
                    return
            try:
                pooled = self._fill_one()
            except (OSError, NetworkUnavailable) as e:
                log.warn(
                    "netns pool: cannot make a namespace ahead: {why} (again in {s:g} s)",
                    why=e,
                    s=wait,
                )
                with self._wake:
                    self._wake.wait_for(lambda: self._closing, wait)
                wait = min(wait * 2, self.retry_max)
                continue
            wait = self.retry
            with self._wake:
                self._ready.append(pooled)

    def _fill_one(self) -> PooledNetns:
        pin = os.path.join(self.directory, str(self.made))
        self.made += 1
        os.close(os.open(pin, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400))
        try:
            self.make(pin, self.mounts)
            slot = self.mode.wire_ahead(pin)
        except BaseException:
            self._unpin(pin)
            raise
        return PooledNetns(pin, slot)

    def _destroy(self, pooled: PooledNetns) -> None:
        self._unpin(pooled.pin)
        self.mode.release_ahead(pooled.slot)

    def _unpin(self, pin: str) -> None:
        self.mounts.unmount_all(pin)
        os.unlink(pin)
