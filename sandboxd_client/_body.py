"""
Streaming request and response bodies with deadlines.

treq's ``timeout=`` only covers the wait for response headers (its ``treq.request``), so bodies are
timed here: ``IdleTimer`` is a ``callLater`` on the injected clock that is reset on every chunk,
so a transfer can take as long as it needs while bytes keep moving, and a stall of ``timeout``
seconds fails it with ``SandboxBusy``. ``read_body`` hands each received chunk to a sink as it
arrives (nothing is buffered here); ``ProgressProducer`` wraps a request body producer to report
every chunk written (for upload deadlines and progress bars).
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.abstract import FileDescriptor
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IConsumer, IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer, IResponse
from zope.interface import implementer

from ._twisted import response_connection
from ._types import SandboxBusy

READ_SIZE = 1 << 20
"""Bytes the connection reads at a time while a response body streams in. Twisted reads
64 KiB (``bufferSize``): a bulk exec stream or download then costs 16 times the reactor turns,
each a trip down the HTTP parser and the chunked decoder to the sink."""


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
        self._connection: FileDescriptor | None = None
        self._read_size = 0

    def connectionMade(self) -> None:
        """Read the body in chunks of up to :data:`READ_SIZE`, the connection's own size once
        it is read (a pooled connection goes on as it was).

        Only a plain TCP connection is tuned (see ``_twisted.response_connection``); anything
        else (a TLS wrapper, an in-memory transport) is left as it is.
        """
        connection = response_connection(self.transport)
        if connection is None:
            return
        # A later upload on this pooled connection is sent as many bytes at a time.
        connection.SEND_LIMIT = max(connection.SEND_LIMIT, READ_SIZE)
        if connection.bufferSize < READ_SIZE:
            self._connection, self._read_size = connection, connection.bufferSize
            connection.bufferSize = READ_SIZE

    def _finish(self, result: Failure | None) -> None:
        done, self._done = self._done, None
        self._timer.cancel()
        if self._connection is not None:
            self._connection.bufferSize, self._connection = self._read_size, None
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


SMALL_BODY = 1 << 16
"""Request bodies up to this size are written whole at once (:class:`BytesProducer`)."""


@implementer(IBodyProducer)
class BytesProducer:
    """A small request body already in memory (a JSON call), written whole as soon as the
    request goes out, in the same turn of the reactor: ``FileBodyProducer`` reads it on a
    later turn of its cooperator, one more trip through the reactor for every call."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self._data)
        return succeed(None)

    def pauseProducing(self) -> None:
        """Nothing to pause: the body was written whole."""

    def resumeProducing(self) -> None:
        """Nothing to resume: the body was written whole."""

    def stopProducing(self) -> None:
        """Nothing to stop: the body was written whole."""


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
        started: Deferred[None] = self._inner.startProducing(
            _CountingConsumer(consumer, self._progress)
        )
        return started

    def pauseProducing(self) -> None:
        self._inner.pauseProducing()

    def resumeProducing(self) -> None:
        self._inner.resumeProducing()

    def stopProducing(self) -> None:
        self._inner.stopProducing()
