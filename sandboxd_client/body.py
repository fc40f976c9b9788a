"""
Streaming request and response bodies with deadlines.

treq's ``timeout=`` only covers the wait for response headers (twisted-facts.md), so bodies are
timed here: ``IdleTimer`` is a ``callLater`` on the injected clock that is reset on every chunk,
so a transfer can take as long as it needs while bytes keep moving, and a stall of ``timeout``
seconds fails it with ``SandboxBusy``. ``read_body`` hands each received chunk to a sink as it
arrives (nothing is buffered here); ``ProgressProducer`` wraps a request body producer to report
every chunk written (for upload deadlines and progress bars).
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IConsumer, IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer, IResponse
from zope.interface import implementer

from .types import SandboxBusy


class IdleTimer:
    """Calls ``on_timeout`` once no ``reset()`` happened for ``timeout`` seconds."""

    def __init__(self, clock: IReactorTime, timeout: float, on_timeout: Callable[[], object]):
        self._clock = clock
        self._timeout = timeout
        self._on_timeout = on_timeout
        self.fired = False
        self._call: IDelayedCall | None = clock.callLater(timeout, self._fire)

    def _fire(self) -> None:
        self._call = None
        self.fired = True
        self._on_timeout()

    def reset(self) -> None:
        """Restart the countdown (no effect once fired or cancelled)."""
        if self._call is not None and self._call.active():
            self._call.reset(self._timeout)

    def cancel(self) -> None:
        """Stop the countdown for good."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None


READ_SIZE = 1 << 20
"""Bytes a connection reads (and sends) at a time once it delivered a response body; Twisted's
defaults are 64 KiB reads and 128 KiB sends (a download of 1 GiB took 16 384 reads, each through
the whole HTTP client parser)."""


def read_in_large_pieces(transport: object) -> None:
    """Make the TCP connection under ``transport`` (what ``Response.deliverBody`` hands a
    protocol: a proxy of the connection) read and send :data:`READ_SIZE` bytes at a time.

    The proxy keeps the connection in ``_producer``; without one, nothing changes.
    """
    connection = getattr(transport, "_producer", None)
    if connection is not None:
        connection.bufferSize = READ_SIZE
        connection.SEND_LIMIT = READ_SIZE


class _SinkProtocol(Protocol):
    def __init__(
        self,
        clock: IReactorTime,
        timeout: float,
        sink: Callable[[bytes], object],
        done: Deferred[None],
    ) -> None:
        self._sink = sink
        self._done: Deferred[None] | None = done
        self._timer = IdleTimer(clock, timeout, self._timed_out)

    def _finish(self, result: Failure | None) -> None:
        done, self._done = self._done, None
        self._timer.cancel()
        if done is None:
            return
        if result is None:
            done.callback(None)
        else:
            done.errback(result)

    def abort(self, result: Failure) -> None:
        """Stop reading: drop the connection and fail with ``result``."""
        if self._done is None:
            return
        if self.transport is not None:
            self.transport.loseConnection()
        self._finish(result)

    def _timed_out(self) -> None:
        self.abort(Failure(SandboxBusy("the sandbox host stopped sending the response body")))

    def connectionMade(self) -> None:
        read_in_large_pieces(self.transport)

    def dataReceived(self, data: bytes) -> None:
        if self._done is None:
            return
        self._timer.reset()
        try:
            self._sink(data)
        except BaseException:
            self.abort(Failure())

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if reason.check(ResponseDone, PotentialDataLoss):
            self._finish(None)
        else:
            self._finish(reason)


def read_body(
    clock: IReactorTime, response: IResponse, sink: Callable[[bytes], object], timeout: float
) -> Deferred[None]:
    """
    Deliver ``response``'s body to ``sink`` chunk by chunk; fire when it is complete.

    Fails with ``SandboxBusy`` when no byte arrives for ``timeout`` seconds, with the sink's own
    exception if it raises, or with Twisted's transport failure (``ResponseFailed``…) if the
    connection breaks. In the first two cases, and on cancellation, the connection is dropped.
    """
    if response.length == 0:
        return succeed(None)
    holder: list[_SinkProtocol] = []

    def cancel(d: Deferred[None]) -> None:
        holder[0].abort(Failure(CancelledError()))

    done: Deferred[None] = Deferred(cancel)
    protocol = _SinkProtocol(clock, timeout, sink, done)
    holder.append(protocol)
    response.deliverBody(protocol)
    return done


@implementer(IConsumer)
class _CountingConsumer:
    def __init__(self, consumer: IConsumer, progress: Callable[[int], object]) -> None:
        self._consumer = consumer
        self._progress = progress

    def registerProducer(self, producer: object, streaming: bool) -> None:
        self._consumer.registerProducer(producer, streaming)  # type: ignore[arg-type]

    def unregisterProducer(self) -> None:
        self._consumer.unregisterProducer()

    def write(self, data: bytes) -> None:
        self._consumer.write(data)
        self._progress(len(data))


@implementer(IBodyProducer)
class ProgressProducer:
    """An ``IBodyProducer`` proxy that calls ``progress(n)`` after each chunk of ``n`` bytes."""

    def __init__(self, inner: IBodyProducer, progress: Callable[[int], object]) -> None:
        self._inner = inner
        self._progress = progress
        self.length: int = inner.length if inner.length is not UNKNOWN_LENGTH else UNKNOWN_LENGTH

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        return self._inner.startProducing(_CountingConsumer(consumer, self._progress))

    def pauseProducing(self) -> None:
        self._inner.pauseProducing()

    def resumeProducing(self) -> None:
        self._inner.resumeProducing()

    def stopProducing(self) -> None:
        self._inner.stopProducing()
