"""The request of the sites: a body over the limit is discarded, a large one spooled.

twisted.web reads a whole request body before the handler runs (under 100 000 bytes in memory,
larger in a file the site gives). A body declared or found to be larger than ``max_body`` is
discarded as it arrives instead, so nothing over the limit is stored anywhere, and the handler
answers ``413 TooLarge``. A body that cannot be stored (disk full) is discarded from then on,
and the failure kept for the handler (:attr:`LimitedRequest.content_error`).

A large body of a request whose headers name a sandbox (the site's ``spool_place``) is spooled
in that sandbox's place (:class:`~sandboxd.web.spool.SpoolPlace`), under its disk limits: a
body over what the sandbox has left fails as a full disk does (``507``), and the sandbox's end
aborts its connection.
"""

import io
from contextlib import suppress
from typing import Any

from twisted.web.server import Request

from sandboxd import _twisted
from sandboxd.web.spool import SPOOL_MIN, Spool, SpoolPlace, SpoolThreads, SpoolWriter, uncharged

SPOOL = "spool"
"""The reason a connection's reading is held while its body's writes catch up."""


class _Discard:
    """A content file that drops what it is given."""

    def write(self, data: bytes) -> None:
        """Drop the data."""

    def seek(self, *args: Any) -> int:
        return 0

    def tell(self) -> int:
        return 0  # twisted.web asks for the body's length once it has all arrived

    def read(self, *args: Any) -> bytes:
        return b""

    def close(self) -> None:
        """Nothing to close."""


class LimitedRequest(Request):
    """A request that keeps at most ``max_body`` bytes of body; ``too_large`` says it had more.

    ``content_error`` is the error that stopped the body from being stored (then discarded).
    On a site with ``spool_threads``, a spooled body is written by a
    :class:`~sandboxd.web.spool.SpoolWriter`, and the request handled once all of it is
    written; a request whose connection is lost before that is never handled.
    """

    max_body: int = 1 << 62
    too_large: bool = False
    content_error: OSError | None = None
    _received: int = 0
    _place: SpoolPlace | None = None
    """The sandbox's place its body is spooled in, while it arrives (``None``: none)."""

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > self.max_body:
            self._refuse()
            return
        site = getattr(self.channel, "site", None)
        place = self._place_of(site) if length is None or length >= SPOOL_MIN else None
        try:
            if place is None:
                super().gotLength(length)
            else:
                self.content = Spool(place.directory, place.charged)
        except OSError as e:
            self._failed(e)
            return
        threads: SpoolThreads | None = getattr(site, "spool_threads", None)
        content: Any = self.content
        charge = uncharged if place is None else place.charged
        if threads is not None and not isinstance(content, io.BytesIO):
            self.content = threads.writer(content, self._failed, self._pause, self._resume, charge)
        if place is not None:
            self._place = place
            place.bodies.add(self._abort)

    def _place_of(self, site: Any) -> SpoolPlace | None:
        """The place of the sandbox the request names, where the site spools in unnamed
        files (``None``: none, or spooled where the site spools)."""
        spool_place = getattr(site, "spool_place", None)
        if spool_place is None or getattr(site, "spool_dir", None) is None:
            return None
        _, path = _twisted.request_line(self.channel)
        place: SpoolPlace | None = spool_place(path, self.requestHeaders)
        return place

    def _abort(self) -> None:
        """The sandbox is going: its body's connection is closed (its spool given back)."""
        if self.channel is not None:
            transport: Any = self.channel.transport
            transport.abortConnection()

    def _arrived(self) -> None:
        """The body is stored (or the connection lost): the sandbox's end no longer aborts it."""
        if self._place is not None:
            self._place.bodies.discard(self._abort)
            self._place = None

    def connectionLost(self, reason: Any) -> None:
        self._arrived()
        super().connectionLost(reason)

    def handleContentChunk(self, data: bytes) -> None:
        if self.too_large or self.content_error is not None:
            return
        self._received += len(data)
        if self._received > self.max_body:
            if self.content is not None:
                self.content.close()
            self._refuse()
            return
        try:
            super().handleContentChunk(data)
        except OSError as e:
            self._failed(e)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        """The whole body is in: handled once it is all written (see :class:`SpoolWriter`)."""
        writer = self.content
        if not isinstance(writer, SpoolWriter):
            self._arrived()
            super().requestReceived(command, path, version)
            return
        written = writer.written()
        written.addCallback(lambda _: self._written(writer, command, path, version))

    def _written(self, writer: SpoolWriter, command: bytes, path: bytes, version: bytes) -> None:
        self._arrived()
        if self.channel is None:
            return  # the connection was lost meanwhile: the spool is closed (connectionLost)
        if self.content is writer:
            writer.release()
            self.content = writer.file  # else it failed: discarded, the error kept
        super().requestReceived(command, path, version)

    def _pause(self) -> None:
        channel: Any = self.channel  # the sites' Channel: the spool is one of its holds
        channel.hold(SPOOL)  # while the body's writes catch up

    def _resume(self) -> None:
        channel: Any = self.channel
        if channel is not None:  # None: the connection is lost
            channel.release(SPOOL)

    def _refuse(self) -> None:
        self.too_large = True
        self.content = _Discard()

    def _failed(self, error: OSError) -> None:
        content, self.content = self.content, _Discard()
        self.content_error = error  # both before the close: it may let the request be handled
        if content is not None:
            with suppress(OSError):
                content.close()  # a spool's space is given back
