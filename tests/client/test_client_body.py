"""Response bodies with an idle deadline and request bodies that report progress
(``sandboxd_client._body``), on a ``Clock`` and a ``StringTransport``: no network, no waiting."""

from __future__ import annotations

import io
from typing import Any

import pytest
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock, Cooperator
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseDone, ResponseFailed
from twisted.web.client import FileBodyProducer
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import UNKNOWN_LENGTH

from sandboxd_client import SandboxBusy
from sandboxd_client._body import IdleTimer, ProgressProducer, read_body


class Response:
    """The part of ``IResponse`` that ``read_body`` uses; ``connect`` says whether delivering
    the body connects the protocol at once (as Twisted's does) or later."""

    def __init__(self, length: object = UNKNOWN_LENGTH, connect: bool = True) -> None:
        self.length = length
        self.transport = StringTransport()
        self.protocol: Any = None
        self._connect = connect

    def deliverBody(self, protocol: Any) -> None:
        self.protocol = protocol
        if self._connect:
            protocol.makeConnection(self.transport)


def test_the_idle_timer_fires_once_after_a_quiet_timeout_and_not_after_cancel() -> None:
    clock = Clock()
    fired: list[bool] = []
    timer = IdleTimer(clock, 5.0, lambda: fired.append(True))
    clock.advance(4)
    timer.reset()  # a chunk: the countdown starts again
    clock.advance(4)
    assert fired == [] and not timer.fired
    clock.advance(1)
    assert fired == [True] and timer.fired
    timer.reset()  # once fired: no effect, no second call
    timer.cancel()
    clock.advance(10)
    assert fired == [True] and clock.getDelayedCalls() == []

    quiet = IdleTimer(clock, 5.0, lambda: fired.append(False))
    quiet.cancel()
    quiet.reset()
    clock.advance(10)
    assert fired == [True] and not quiet.fired


def test_a_body_arrives_chunk_by_chunk_and_an_empty_one_is_done_at_once() -> None:
    clock = Clock()
    response = Response()
    got: list[bytes] = []
    done = read_body(clock, response, got.append, 5.0)  # type: ignore[arg-type]
    response.protocol.dataReceived(b"a")
    clock.advance(4)
    response.protocol.dataReceived(b"b")
    clock.advance(4)  # 8 s in all, never 5 without a byte
    response.protocol.connectionLost(Failure(PotentialDataLoss()))
    assert got == [b"a", b"b"] and done.called and clock.getDelayedCalls() == []
    # An abort once the body is in leaves the (pooled) connection alone.
    response.protocol.abort(Failure(CancelledError()))
    assert not response.transport.disconnecting and done.result is None
    assert read_body(clock, Response(length=0), got.append, 5.0).called  # type: ignore[arg-type]


def test_a_stalled_body_fails_busy_drops_the_connection_and_ignores_what_comes_later() -> None:
    clock = Clock()
    response = Response()
    got: list[bytes] = []
    done = read_body(clock, response, got.append, 5.0)  # type: ignore[arg-type]
    response.protocol.dataReceived(b"a")
    clock.advance(5)
    failures: list[Failure] = []
    done.addErrback(failures.append)
    assert failures[0].check(SandboxBusy) and "stopped sending" in str(failures[0].value)
    assert response.transport.disconnecting
    response.protocol.dataReceived(b"late")  # after the failure: not handed on
    response.protocol.connectionLost(Failure(ResponseFailed([])))
    done.cancel()  # already failed: nothing more happens
    assert got == [b"a"] and len(failures) == 1


def test_a_sink_that_raises_fails_the_read_with_its_own_exception() -> None:
    response = Response()

    def sink(data: bytes) -> None:
        raise OSError(28, "No space left on device")

    done = read_body(Clock(), response, sink, 5.0)  # type: ignore[arg-type]
    response.protocol.dataReceived(b"x")
    with pytest.raises(OSError, match="No space"):
        done.result.raiseException()
    done.addErrback(lambda _: None)
    assert response.transport.disconnecting


def test_a_broken_connection_fails_the_read_with_twisteds_reason() -> None:
    response = Response()
    done = read_body(Clock(), response, lambda data: None, 5.0)  # type: ignore[arg-type]
    response.protocol.connectionLost(Failure(ResponseFailed([Failure(ResponseDone())])))
    failures: list[Failure] = []
    done.addErrback(failures.append)
    assert failures[0].check(ResponseFailed)


def test_a_read_cancelled_before_the_body_connects_fails_cancelled() -> None:
    clock = Clock()
    response = Response(connect=False)
    got: list[bytes] = []
    done = read_body(clock, response, got.append, 5.0)  # type: ignore[arg-type]
    done.cancel()
    failures: list[Failure] = []
    done.addErrback(failures.append)
    assert failures[0].check(CancelledError) and clock.getDelayedCalls() == []
    # A body that connects after that is over before it starts: nothing reaches the sink.
    response.protocol.makeConnection(response.transport)
    response.protocol.dataReceived(b"x")
    assert got == [] and len(failures) == 1


class NotSeekable:
    """A stream whose size cannot be known in advance (no ``seek``, as Twisted asks)."""

    def read(self, size: int = -1) -> bytes:
        return b""

    def close(self) -> None:
        """Nothing to release."""


class Consumer:
    """An ``IConsumer`` that keeps what it is given and who registered with it."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.producers: list[tuple[object, bool]] = []

    def registerProducer(self, producer: object, streaming: bool) -> None:
        self.producers.append((producer, streaming))

    def unregisterProducer(self) -> None:
        self.producers.pop()

    def write(self, data: bytes) -> None:
        self.written.append(data)


class StreamingProducer:
    """A streaming body producer that registers itself with its consumer, as a push producer
    does, and records the calls passed on to it."""

    length = 3

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.consumer: Any = None

    def startProducing(self, consumer: Any) -> Deferred[None]:
        self.consumer = consumer
        consumer.registerProducer(self, True)
        consumer.write(b"abc")
        self.finished: Deferred[None] = Deferred()
        return self.finished

    def pauseProducing(self) -> None:
        self.calls.append("pause")

    def resumeProducing(self) -> None:
        self.calls.append("resume")

    def stopProducing(self) -> None:
        self.calls.append("stop")


def test_progress_is_reported_for_every_chunk_written() -> None:
    clock = Clock()
    cooperator = Cooperator(scheduler=lambda work: clock.callLater(0, work), started=True)
    inner = FileBodyProducer(io.BytesIO(b"x" * 10), cooperator=cooperator, readSize=4)
    sent: list[int] = []
    producer = ProgressProducer(inner, sent.append)
    assert producer.length == 10
    consumer = Consumer()
    done = producer.startProducing(consumer)  # type: ignore[arg-type]
    while not done.called:
        clock.advance(0)
    assert sent == [4, 4, 2] and b"".join(consumer.written) == b"x" * 10
    unknown = FileBodyProducer(NotSeekable(), cooperator=cooperator)
    assert ProgressProducer(unknown, sent.append).length is UNKNOWN_LENGTH


def test_the_progress_proxy_passes_registration_and_flow_control_through() -> None:
    inner = StreamingProducer()
    sent: list[int] = []
    producer = ProgressProducer(inner, sent.append)  # type: ignore[arg-type]
    consumer = Consumer()
    producer.startProducing(consumer)  # type: ignore[arg-type]
    assert consumer.producers == [(inner, True)] and consumer.written == [b"abc"] and sent == [3]
    producer.pauseProducing()
    producer.resumeProducing()
    producer.stopProducing()  # an upload abandoned midway
    assert inner.calls == ["pause", "resume", "stop"]
    inner.consumer.unregisterProducer()
    assert consumer.producers == []
