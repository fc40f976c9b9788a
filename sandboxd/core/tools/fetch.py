"""Bounded HTTP downloads for tool resolution: size and time limited, streamed to a sink.

treq's own ``timeout=`` covers only the wait for response headers, and a buffered response
would keep the whole body in memory; :meth:`Fetcher.fetch` asks for an unbuffered response and
reads the body itself, counting bytes (past the limit: refused) against a deadline of its own.

Failures come in two kinds, because they are answered differently: :class:`StoreUnreachable`
(no connection, a reset, a timeout, a ``5xx``: the store may be back later, and the last good
resolution may be answered as stale) and :class:`ToolRefused` (the store answered, and the
answer is unusable: ``404``, too large, malformed).
"""

from collections.abc import Callable
from typing import Any, cast

from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse

SCHEMES = ("http://", "https://")


class ToolRefused(Exception):
    """This tool cannot be resolved; the message is the human-readable reason."""


class StoreUnreachable(ToolRefused):
    """The store could not be reached or did not answer in time (a remembered resolution may
    still be answered, as stale)."""


def check_url(url: object, what: str) -> str:
    """An ``http(s)`` URL as text, else :class:`ToolRefused`."""
    if not isinstance(url, str) or not url.lower().startswith(SCHEMES):
        raise ToolRefused(f"{what}: {url!r} is not an http or https URL")
    return url


@frozen
class Fetcher:
    """GETs URLs with ``http`` (a treq ``HTTPClient``), time from ``clock``."""

    http: Any
    clock: IReactorTime
    header_timeout: float = 30.0

    async def fetch(
        self, url: str, what: str, limit: int, timeout: float, sink: Callable[[bytes], None]
    ) -> None:
        """Stream the body of ``url`` into ``sink``: at most ``limit`` bytes, within
        ``timeout`` seconds of the headers. ``what`` names the download in reasons."""
        try:
            response: IResponse = await self.http.get(
                url, unbuffered=True, timeout=self.header_timeout, reactor=self.clock
            )
        except Exception as e:
            raise StoreUnreachable(f"{what}: {url} unreachable ({describe(e)})") from None
        if response.code >= 500:
            discard(response)
            raise StoreUnreachable(f"{what}: {url} answered HTTP {response.code}")
        if response.code != 200:
            discard(response)
            raise ToolRefused(f"{what}: {url} answered HTTP {response.code}")
        if response.length is not UNKNOWN_LENGTH and response.length > limit:
            discard(response)
            raise ToolRefused(f"{what}: {url} is {response.length} bytes, over {limit}")
        body = _BoundedBody(url, what, limit, sink)
        response.deliverBody(body)
        body.start_deadline(self.clock, timeout)
        await body.finished


def describe(error: BaseException) -> str:
    """A short text for a transport error (``ResponseNeverReceived`` wraps the real ones)."""
    reasons = getattr(error, "reasons", None)
    if reasons:
        error = reasons[0].value
    text = str(error).strip()
    name = type(error).__name__
    if not text or text == name:
        return name
    return f"{name}: {text}"


def discard(response: IResponse) -> None:
    """Drop a response's body without reading it (closes the connection)."""
    response.deliverBody(_Discard())


class _Discard(Protocol):
    def connectionMade(self) -> None:
        self.transport.stopProducing()  # type: ignore[union-attr]


class _BoundedBody(Protocol):
    """Feeds a response body to ``sink``; ``finished`` fires at its end or on the first fault."""

    def __init__(self, url: str, what: str, limit: int, sink: Callable[[bytes], None]) -> None:
        self.url = url
        self.what = what
        self.limit = limit
        self.sink = sink
        self.received = 0
        self.finished: Deferred[None] = Deferred()
        self._deadline: IDelayedCall | None = None

    def start_deadline(self, clock: IReactorTime, timeout: float) -> None:
        if not self.finished.called:
            self._deadline = clock.callLater(timeout, self._timed_out, timeout)

    def _timed_out(self, timeout: float) -> None:
        self._deadline = None
        self._stop(StoreUnreachable(f"{self.what}: {self.url} not received within {timeout} s"))

    def _stop(self, error: Exception) -> None:
        """End with ``error`` and close the connection. Only called unfinished: data after the
        end is ignored, and ending cancels the deadline; the body's transport is set by then
        (``deliverBody`` connects before it delivers, and the deadline starts after it)."""
        self._end(Failure(error))
        self.transport.stopProducing()  # type: ignore[union-attr]

    def _end(self, result: Failure | None) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None
        if isinstance(result, Failure):
            self.finished.errback(result)
        else:
            self.finished.callback(None)

    def dataReceived(self, data: bytes) -> None:
        if self.finished.called:
            return
        self.received += len(data)
        if self.received > self.limit:
            self._stop(ToolRefused(f"{self.what}: {self.url} is over {self.limit} bytes"))
            return
        try:
            self.sink(data)
        except Exception as e:
            self._stop(ToolRefused(f"{self.what}: cannot keep the download ({e})"))

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.finished.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self._end(None)
            return
        lost = cast(BaseException, reason.value)  # a Failure made from an error holds it
        cut = StoreUnreachable(f"{self.what}: {self.url} cut off ({describe(lost)})")
        self._end(Failure(cut))
