"""Bounded downloads (``sandboxd.core.tools.fetch``) against a scripted response and a Clock:
each way a body can end (whole at once, over the limit while streaming, a sink that fails, a
cut connection, the deadline) and the text each transport error is reported with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.error import ConnectionLost
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseNeverReceived
from twisted.web.client import ResponseDone
from twisted.web.iweb import UNKNOWN_LENGTH

from sandboxd.core.tools.fetch import Fetcher, StoreUnreachable, ToolRefused, describe

URL = "http://store.test/t/tool.tar.gz"


class Transport:
    """The body's transport: records that the download was stopped."""

    def __init__(self) -> None:
        self.stopped = 0

    def stopProducing(self) -> None:
        self.stopped += 1


class Response:
    """A 200 response whose body the test feeds by hand (or all of it at once on delivery)."""

    def __init__(self, length: object = UNKNOWN_LENGTH, at_once: list[bytes] | None = None):
        self.code = 200
        self.length = length
        self.transport = Transport()
        self.at_once = at_once
        self.body: Protocol | None = None

    def deliverBody(self, protocol: Protocol) -> None:
        self.body = protocol
        protocol.makeConnection(self.transport)
        if self.at_once is not None:  # the body was received before it was asked for
            for chunk in self.at_once:
                protocol.dataReceived(chunk)
            protocol.connectionLost(Failure(ResponseDone()))

    def feed(self, data: bytes) -> None:
        assert self.body is not None
        self.body.dataReceived(data)

    def lose(self, reason: BaseException) -> None:
        assert self.body is not None
        self.body.connectionLost(Failure(reason))


class Http:
    """treq's ``get``: answers ``response``, or fails with ``error``."""

    def __init__(self, response: Response | None = None, error: Exception | None = None):
        self.response = response
        self.error = error

    def get(self, url: str, **_: Any) -> Deferred[Response]:
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return succeed(self.response)


def start(
    http: Http, clock: Clock, sink: Callable[[bytes], None], limit: int = 10, timeout: float = 5
) -> Deferred[None]:
    fetcher = Fetcher(http, clock)
    return Deferred.fromCoroutine(fetcher.fetch(URL, "artifact", limit, timeout, sink))


def failure_of(d: Deferred[None]) -> BaseException:
    failures: list[Failure] = []
    d.addErrback(failures.append)
    assert len(failures) == 1
    assert failures[0].value is not None
    return failures[0].value


def test_a_body_received_before_it_is_asked_for_ends_without_a_deadline() -> None:
    clock = Clock()
    got: list[bytes] = []
    done = start(Http(Response(at_once=[b"abc", b"de"])), clock, got.append)
    assert done.called
    assert got == [b"abc", b"de"]
    assert clock.getDelayedCalls() == []


def test_a_body_of_unknown_length_is_stopped_at_the_limit_and_later_data_is_ignored() -> None:
    clock = Clock()
    response = Response()
    got: list[bytes] = []
    done = start(Http(response), clock, got.append, limit=10)
    response.feed(b"123456")
    response.feed(b"789012")  # 12 bytes now: over 10
    response.feed(b"more")
    response.lose(ConnectionLost())
    error = failure_of(done)
    assert type(error) is ToolRefused
    assert str(error) == f"artifact: {URL} is over 10 bytes"
    assert got == [b"123456"]
    assert response.transport.stopped == 1
    assert clock.getDelayedCalls() == []


def test_a_sink_that_cannot_keep_the_data_refuses_the_download() -> None:
    clock = Clock()
    response = Response()

    def full_disk(_: bytes) -> None:
        raise OSError(28, "No space left on device")

    done = start(Http(response), clock, full_disk)
    response.feed(b"x")
    error = failure_of(done)
    assert type(error) is ToolRefused
    assert "cannot keep the download" in str(error)
    assert "No space left on device" in str(error)
    assert response.transport.stopped == 1
    assert clock.getDelayedCalls() == []


def test_a_connection_cut_mid_body_is_the_store_unreachable() -> None:
    clock = Clock()
    response = Response(length=8)
    got: list[bytes] = []
    done = start(Http(response), clock, got.append)
    response.feed(b"half")
    response.lose(ConnectionLost("reset by peer"))
    error = failure_of(done)
    assert type(error) is StoreUnreachable
    lost = str(ConnectionLost("reset by peer"))
    assert str(error) == f"artifact: {URL} cut off (ConnectionLost: {lost})"
    assert clock.getDelayedCalls() == []


def test_a_body_not_whole_by_the_deadline_is_stopped() -> None:
    clock = Clock()
    response = Response(length=8)
    done = start(Http(response), clock, lambda _: None, timeout=5)
    response.feed(b"half")
    clock.advance(4.9)
    assert not done.called
    clock.advance(0.1)
    error = failure_of(done)
    assert type(error) is StoreUnreachable
    assert str(error) == f"artifact: {URL} not received within 5 s"
    assert response.transport.stopped == 1
    response.lose(ConnectionLost())  # the stop's own connection loss changes nothing


def test_no_answer_at_all_is_reported_with_the_wrapped_reason() -> None:
    never = ResponseNeverReceived([Failure(ConnectionLost("reset by peer"))])
    error = failure_of(start(Http(error=never), Clock(), lambda _: None))
    assert type(error) is StoreUnreachable
    lost = str(ConnectionLost("reset by peer"))
    assert str(error) == f"artifact: {URL} unreachable (ConnectionLost: {lost})"


@pytest.mark.parametrize(
    ("code", "length", "kind", "reason"),
    [
        (503, UNKNOWN_LENGTH, StoreUnreachable, "answered HTTP 503"),
        (404, UNKNOWN_LENGTH, ToolRefused, "answered HTTP 404"),
        (200, 11, ToolRefused, "is 11 bytes, over 10"),
    ],
)
def test_an_unusable_answer_is_refused_unread(
    code: int, length: object, kind: type[ToolRefused], reason: str
) -> None:
    response = Response(length=length)
    response.code = code
    got: list[bytes] = []
    error = failure_of(start(Http(response), Clock(), got.append, limit=10))
    assert type(error) is kind
    assert str(error) == f"artifact: {URL} {reason}"
    assert response.transport.stopped == 1  # the body is dropped, the connection closed
    assert got == []


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (CancelledError(), "CancelledError"),  # treq's header timeout: no message
        (ValueError("ValueError"), "ValueError"),
        (ValueError("  bad  "), "ValueError: bad"),
        (ResponseNeverReceived([Failure(CancelledError())]), "CancelledError"),
    ],
)
def test_transport_errors_are_described_by_name_and_message(
    error: BaseException, text: str
) -> None:
    assert describe(error) == text
