"""``sandboxd.web.follow.FollowStream``: the push producer of a followed stream, on a
``Clock`` with a request that records what is written and who produces for it."""

from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from sandboxd.http.wire import STREAM_KEEPALIVE_FRAME
from sandboxd.web.follow import FollowStream


class Request:
    """The part of a twisted.web request a stream uses; ``channel`` is None once the client
    went (as twisted.web sets it)."""

    def __init__(self, connected: bool = True) -> None:
        self.written: list[bytes] = []
        self.producer: Any = None
        self.channel: object | None = object() if connected else None

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        assert streaming and self.producer is None
        self.producer = producer

    def unregisterProducer(self) -> None:
        self.producer = None

    def write(self, data: bytes) -> None:
        self.written.append(data)


class Source:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


def stream(request: Request, clock: Clock, source: Source) -> FollowStream:
    return FollowStream(request, clock, 5.0, source.pause, source.resume)  # type: ignore[arg-type]


def test_flow_control_reaches_the_source_and_a_stop_ends_the_stream() -> None:
    request, clock, source = Request(), Clock(), Source()
    follow = stream(request, clock, source)
    follow.start()
    assert request.producer is follow and source.calls == ["resume"]
    request.producer.pauseProducing()  # the client reads slowly
    request.producer.resumeProducing()
    assert source.calls == ["resume", "pause", "resume"]
    request.producer.stopProducing()  # the client went
    assert follow.ended.called
    follow.end()  # the source's own end after that: nothing more


def test_silence_is_filled_with_keepalives_and_nothing_follows_the_end() -> None:
    request, clock = Request(), Clock()
    follow = stream(request, clock, Source())
    follow.start()
    clock.advance(4)
    follow.write(b'{"o":"eA=="}\n')
    follow.write(b"")  # nothing to write: no line, and the silence goes on
    clock.advance(4)
    assert request.written == [b'{"o":"eA=="}\n'], "each line restarts the wait"
    clock.advance(1)
    assert request.written[-1] == STREAM_KEEPALIVE_FRAME
    clock.advance(5)
    assert request.written.count(STREAM_KEEPALIVE_FRAME) == 2
    follow.end()
    follow.write(b'{"late":1}\n')
    clock.advance(60)
    assert request.written.count(STREAM_KEEPALIVE_FRAME) == 2 and b'{"late":1}\n' not in (
        request.written
    )


@pytest_twisted.ensureDeferred
async def test_wait_lets_the_producer_go_unless_the_client_already_went() -> None:
    for connected in (True, False):
        request, clock = Request(connected), Clock()
        follow = stream(request, clock, Source())
        follow.start()
        waiting = Deferred.fromCoroutine(follow.wait())
        assert not waiting.called
        follow.end()
        await waiting
        assert clock.getDelayedCalls() == [], "no keepalive left behind"
        assert (request.producer is None) is connected


def test_a_source_that_ended_before_the_start_schedules_no_keepalive() -> None:
    request, clock, source = Request(), Clock(), Source()
    follow = stream(request, clock, source)
    follow.end()
    follow.start()
    assert clock.getDelayedCalls() == [] and request.written == []
