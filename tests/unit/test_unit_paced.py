"""``sandboxd.web.paced.PacedWriter``: parts wait while the client is behind."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred

from sandboxd.web.paced import PacedWriter


class Request:
    """What the writer uses of a twisted.web request: write and the producer hooks."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.producer: Any = None
        self.channel: object | None = object()

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        assert streaming
        self.producer = producer

    def unregisterProducer(self) -> None:
        self.producer = None


def test_a_part_waits_while_paused_and_goes_on_when_resumed() -> None:
    request = Request()
    writer = PacedWriter(request)  # type: ignore[arg-type]
    assert request.producer is writer
    first = Deferred.fromCoroutine(writer.write(b"a"))
    assert first.called
    writer.pauseProducing()
    second = Deferred.fromCoroutine(writer.write(b"b"))
    assert not second.called and request.written == [b"a", b"b"]
    writer.resumeProducing()
    assert second.called
    writer.close()
    assert request.producer is None


def test_a_stopped_response_releases_the_writer() -> None:
    request = Request()
    writer = PacedWriter(request)  # type: ignore[arg-type]
    writer.pauseProducing()
    waiting = Deferred.fromCoroutine(writer.write(b"a"))
    writer.stopProducing()
    assert waiting.called and writer.stopped
    assert Deferred.fromCoroutine(writer.write(b"b")).called  # no waiting once stopped
    request.channel = None  # the client is gone: nothing to unregister from
    writer.close()
    assert request.producer is writer


def test_a_cancelled_write_is_not_released_twice() -> None:
    """Klein cancels the route when the client goes: the waiting part's Deferred is then
    already fired when the response stops the producer."""
    request = Request()
    writer = PacedWriter(request)  # type: ignore[arg-type]
    writer.pauseProducing()
    cancelled = Deferred.fromCoroutine(writer.write(b"a"))
    waiting = Deferred.fromCoroutine(writer.write(b"b"))
    failures: list[Any] = []
    cancelled.addErrback(failures.append)
    cancelled.cancel()
    assert len(failures) == 1 and not waiting.called
    writer.stopProducing()  # no AlreadyCalledError from the cancelled one
    assert waiting.called
