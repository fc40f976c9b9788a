"""What keeps one peer from starving the daemon: a connection cap with a reserve, deadlines for
the header section, a per-peer pace for refused tokens, and a log that speaks once per burst.

The HTTP channel (:class:`sandboxd.web.site.Channel`) reports each connection's state here:

- *waiting*: connected, or between two requests, and the next header section not yet complete.
  Only waiting connections are ever evicted, the one waiting longest first.
- *busy*: its headers are in and its request is being answered.
- *trusted*: it carried the token once. Trusted connections are never evicted, and may use the
  ``reserve`` slots that the others may not: once ``max_connections - reserve`` untrusted
  connections are open, a new one evicts the oldest waiting untrusted connection (or is
  refused when none is waiting), so that a peer holding idle connections cannot keep
  ``/healthz``, ``/readyz`` or an authenticated caller out.
"""

from collections import OrderedDict
from collections.abc import Callable
from enum import Enum
from typing import Protocol

from attrs import frozen
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.web.http_headers import Headers

log = Logger()


class Admission(Enum):
    """What a request's headers earn it, before its body is read."""

    TRUSTED = "trusted"
    """It carries the token (or no token is configured): served, its connection trusted."""
    OPEN = "open"
    """A route served without the token (``/healthz``, ``/readyz``): served."""
    REFUSED = "refused"
    """``401`` at once; the body is never read."""
    ABSENT = "absent"
    """It names what the front does not hold (a sandbox unknown to it): answered at once with
    the front's own answer for that, paced like a refusal; the body is never read."""


Admit = Callable[[bytes, bytes | None, Headers], Admission]
"""A front's rule: a request's path, ``authorization`` header and all its headers → what it
earns (judged as soon as the headers are in)."""

Refusal = Callable[[bytes, Admission, Headers], bytes]
"""A front's whole answer (status line to body, closing the connection) to a request its rule
refused or found absent: its path, the verdict, its headers."""


class Connection(Protocol):
    """What the gate needs of a connection."""

    def evict(self) -> None:
        """Close the connection now, without an answer."""


@frozen
class Limits:
    """The connection settings, in force (``None``: that protection is off)."""

    max_connections: int | None
    reserve: int
    header_timeout: float | None
    idle_timeout: float | None


def reserve_for(max_connections: int) -> int:
    """Slots kept for trusted connections: a tenth of the cap, at least 1 (when the cap leaves
    room for one untrusted connection besides)."""
    return max(1, max_connections // 10) if max_connections > 1 else 0


class BurstLog:
    """Logs the first event of a burst at once, and how many more followed at the end of the
    burst (``window`` seconds after its first), instead of one line per event."""

    def __init__(self, clock: IReactorTime, what: str, window: float = 10.0) -> None:
        self.clock = clock
        self.what = what
        self.window = window
        self.more = 0
        self._closing: IDelayedCall | None = None

    def event(self, detail: str) -> None:
        """Count one event; log it when it starts a burst."""
        if self._closing is not None:
            self.more += 1
            return
        log.warn("{what}: {detail}", what=self.what, detail=detail)
        self._closing = self.clock.callLater(self.window, self._close)

    def _close(self) -> None:
        if self.more:
            log.warn(
                "{what}: {more} more in the last {window:g} s",
                what=self.what,
                more=self.more,
                window=self.window,
            )
        self.more = 0
        self._closing = None


class PeerPace:
    """How long each refused token waits for its ``401``, per peer address.

    A peer gets ``burst`` refusals at once, then one each ``1 / rate`` seconds (a generic cell
    rate: the refusals are spaced, never the accepted calls). A refusal that would wait longer
    than ``max_wait`` is not answered at all (the connection is closed), so a peer cannot make
    the daemon hold more than ``max_wait * rate`` of its connections waiting.
    """

    def __init__(
        self,
        clock: IReactorTime,
        burst: int = 100,
        rate: float = 20.0,
        max_wait: float = 5.0,
        peers_max: int = 10_000,
    ) -> None:
        self.clock = clock
        self.burst = burst
        self.rate = rate
        self.max_wait = max_wait
        self.peers_max = peers_max
        self._due: dict[str, float] = {}

    def wait(self, peer: str) -> float | None:
        """Record a refusal from ``peer``: the seconds its answer waits, or ``None`` (drop it)."""
        now = self.clock.seconds()
        due = max(self._due.get(peer, now), now)
        wait = max(0.0, due - now - (self.burst - 1) / self.rate)
        if wait > self.max_wait:
            return None
        if len(self._due) >= self.peers_max and peer not in self._due:
            self._forget_idle(now)
        self._due[peer] = due + 1 / self.rate
        return wait

    def _forget_idle(self, now: float) -> None:
        self._due = {peer: due for peer, due in self._due.items() if due > now}

    @property
    def peers(self) -> int:
        """Peers remembered (each with refusals still counting against it)."""
        return len(self._due)


class ConnectionGate:
    """Counts the daemon's connections and decides which may stay (see the module's doc)."""

    def __init__(self, clock: IReactorTime, limits: Limits) -> None:
        self.clock = clock
        self.limits = limits
        self.pace = PeerPace(clock)
        self._open: set[Connection] = set()
        self._trusted: set[Connection] = set()
        self._waiting: OrderedDict[Connection, None] = OrderedDict()
        self.refusals = BurstLog(clock, "connections")
        self.late = BurstLog(clock, "header timeout")
        self.unauthorized = BurstLog(clock, "unauthenticated requests")

    @property
    def open(self) -> int:
        """Connections counted as open."""
        return len(self._open)

    @property
    def untrusted(self) -> int:
        """Open connections that never carried the token."""
        return len(self._open) - len(self._trusted)

    def opened(self, connection: Connection) -> bool:
        """A connection was accepted: whether it may stay (room made by evicting the
        longest-waiting untrusted connection if need be)."""
        cap = self.limits.max_connections
        if cap is not None:
            full = self.open >= cap or self.untrusted >= cap - self.limits.reserve
            if full and not self._evict_one():
                self.refusals.event(
                    f"refused a connection: {self.open} open, the cap is {cap} "
                    f"({self.limits.reserve} kept for authenticated callers)"
                )
                return False
        self._open.add(connection)
        self._waiting[connection] = None
        return True

    def _evict_one(self) -> bool:
        if not self._waiting:
            return False
        oldest, _ = self._waiting.popitem(last=False)
        self.refusals.event(
            f"closed the longest-waiting connection to make room ({self.open} open, "
            f"the cap is {self.limits.max_connections})"
        )
        self.closed(oldest)  # counted out now: its own closed() comes later, a no-op
        oldest.evict()
        return True

    def waiting(self, connection: Connection) -> None:
        """The connection awaits its next header section (evictable unless trusted)."""
        if connection in self._open and connection not in self._trusted:
            self._waiting[connection] = None

    def busy(self, connection: Connection) -> None:
        """The connection's headers are in."""
        self._waiting.pop(connection, None)

    def trust(self, connection: Connection) -> None:
        """The connection carried the token: never evicted from now on."""
        self._waiting.pop(connection, None)
        if connection in self._open:
            self._trusted.add(connection)

    def closed(self, connection: Connection) -> None:
        """The connection ended (a no-op for one already counted out by an eviction)."""
        self._open.discard(connection)
        self._trusted.discard(connection)
        self._waiting.pop(connection, None)


DESCRIPTORS_KEPT = 64
"""Descriptors a connection cap must leave for everything else the daemon opens (sandboxes'
pipes, cgroup files, spools, uploads)."""


def limits_for(
    max_connections: int | None,
    header_timeout: float | None,
    idle_timeout: float | None,
    descriptors: int,
) -> Limits:
    """The limits in force under a descriptor limit of ``descriptors``: a cap of ``None``
    (auto) is half the descriptors, ``0`` is no cap; a cap that leaves fewer than
    :data:`DESCRIPTORS_KEPT` descriptors free is refused (``ValueError``)."""
    cap: int | None
    if max_connections == 0:
        cap = None
    elif max_connections is None:
        cap = max(2, descriptors // 2)
    else:
        cap = max_connections
    if cap is not None and cap > descriptors - DESCRIPTORS_KEPT:
        raise ValueError(
            f"{cap} connections would leave fewer than {DESCRIPTORS_KEPT} of the "
            f"{descriptors} descriptors the daemon may open (RLIMIT_NOFILE)"
        )
    reserve = reserve_for(cap) if cap is not None else 0
    return Limits(cap, reserve, header_timeout, idle_timeout)


def capabilities(limits: Limits, auth_gate: bool, body_pace: bool) -> list[str]:
    """The ``/healthz`` capabilities of the protections in force (``body_pace``: request bodies
    are paced beside others' requests, :mod:`sandboxd.web.body_pace`)."""
    names = []
    if auth_gate:
        names += ["http.auth_at_headers", "http.token_pace"]
    if limits.max_connections is not None:
        names.append("http.connection_cap")
    if limits.header_timeout is not None:
        names.append("http.header_timeout")
    if limits.idle_timeout is not None:
        names.append("http.idle_timeout")
    if body_pace:
        names.append("http.body_pace")
    return names
