"""Request bodies paced while other connections' requests come in.

A request body's bytes cross the reactor thread, the spool's thread and the kernel's copies
(the socket's, the page cache's), which no sandbox's CPU quota or placement covers: an upload
at full speed takes most of both CPUs of a small host, and every other sandbox's requests
wait for one (docs/performance.rst, "Uploads beside other requests"). :class:`BodyPace` lets a
body be read at full speed while no other connection has begun a request within its
``window``; while one has, at most ``rate`` bytes a second, with ``burst`` seconds of it in
hand. A lone upload is never slowed. :class:`ReadHolds` keeps a connection's reading paused
while any of its reasons holds (the pace, the spool's back-pressure).
"""

import math
from typing import Any

from attrs import define, field
from twisted.internet.interfaces import IReactorTime

WINDOW = 0.25
"""Seconds after another connection began a request during which a body is paced."""

BURST = 0.05
"""Seconds of ``rate`` a paced body may read ahead of its pace."""


@define
class BodyPace:
    """The host's pace of request bodies (one for every front: their requests count alike).

    ``rate`` is in bytes a second; ``None`` never paces. Only requests that were admitted
    count as others' (:meth:`began`): a caller without the token cannot slow anyone's upload.
    """

    clock: IReactorTime
    rate: int | None
    window: float = WINDOW
    burst: float = BURST
    _latest: int | None = field(default=None, init=False)
    """``id`` of the connection that began a request last."""
    _latest_at: float = field(default=-math.inf, init=False)
    _other_at: float = field(default=-math.inf, init=False)
    """When a connection other than the latest began one last."""

    def began(self, connection: object) -> None:
        """``connection`` began a request now."""
        if id(connection) != self._latest:
            self._other_at = self._latest_at
            self._latest = id(connection)
        self._latest_at = self.clock.seconds()

    def others_lately(self, connection: object) -> bool:
        """Whether a connection other than ``connection`` began a request within the window."""
        last = self._other_at if id(connection) == self._latest else self._latest_at
        return self.clock.seconds() - last <= self.window

    def meter(self, connection: object) -> "BodyMeter":
        """The meter of ``connection``'s body bytes."""
        return BodyMeter(self, connection)


@define
class BodyMeter:
    """One connection's body bytes against its :class:`BodyPace`."""

    pace: BodyPace
    connection: object
    _paid_until: float = field(default=-math.inf, init=False)
    """The time by which the bytes read so far are within the pace."""

    def received(self, size: int) -> float:
        """``size`` more bytes of body were read: the seconds to stop reading for (0: none)."""
        pace = self.pace
        now = pace.clock.seconds()
        if pace.rate is None or not pace.others_lately(self.connection):
            self._paid_until = now
            return 0.0
        start = max(self._paid_until, now - pace.burst)
        self._paid_until = start + size / pace.rate
        return self.owed()

    def owed(self) -> float:
        """Seconds until the bytes read so far are within the pace (0: they are)."""
        return max(0.0, self._paid_until - self.pace.clock.seconds())


@define
class ReadHolds:
    """The reasons a connection's reading is paused; ``transport`` reads while there are none.

    Each reason pauses and resumes through here, so that one's end does not resume what
    another still holds (twisted's transports do not count pauses)."""

    transport: Any
    _held: set[str] = field(factory=set, init=False)

    def hold(self, reason: str) -> None:
        """Stop reading for ``reason`` (again: nothing more)."""
        if not self._held:
            self.transport.pauseProducing()
        self._held.add(reason)

    def release(self, reason: str) -> None:
        """``reason`` no longer holds: reading resumes if nothing else does."""
        if reason not in self._held:
            return
        self._held.discard(reason)
        if not self._held:
            self.transport.resumeProducing()

    def forget(self, reason: str) -> None:
        """``reason`` no longer holds, and the reading is left as it is: paused, it is resumed
        by whoever pauses it next (twisted.web, once the request it holds is answered)."""
        self._held.discard(reason)

    @property
    def held(self) -> frozenset[str]:
        """The reasons holding it now."""
        return frozenset(self._held)
