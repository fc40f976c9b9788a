"""The client's transport (``sandboxd_client._transport``) against a twisted.web resource over
treq's in-memory agent, on a ``Clock``: oversized replies and error bodies, a caller's own
cancellation, and whose connection pool ``close`` closes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hyperlink import DecodedURL
from treq.testing import RequestTraversalAgent
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool
from twisted.web.error import SchemeNotSupported
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from sandboxd_client import ProtocolError, SandboxNotFound
from sandboxd_client import _transport as transport_module
from sandboxd_client._transport import ERROR_BODY_LIMIT, Transport

URL = DecodedURL.from_text("http://sandboxd.invalid:8080/reply")


class Replies(Resource):
    """Answers every request with ``status`` and ``body``; ``hang`` answers nothing, ever."""

    isLeaf = True

    def __init__(self, status: int = 200, body: bytes = b"", hang: bool = False) -> None:
        super().__init__()
        self.status, self.body, self.hang = status, body, hang
        self.requests: list[Request] = []

    def render(self, request: Request) -> Any:
        self.requests.append(request)
        if self.hang:
            return NOT_DONE_YET
        request.setResponseCode(self.status)
        request.setHeader(b"content-type", b"application/json")
        return self.body


def transport_for(agent: Any, clock: Clock, pool: HTTPConnectionPool | None = None) -> Transport:
    return Transport(
        clock,
        clock=clock,
        token="t",
        pool=pool,
        agent=agent,
        connect_timeout=None,
        max_persistent_per_host=1,
        cached_connection_timeout=1.0,
    )


def settled(d: Deferred[Any], agent: RequestTraversalAgent, clock: Clock) -> Any:
    """Move the in-memory bytes until ``d`` has a result; that result (raised if a failure)."""
    for _ in range(1000):
        if d.called:
            break
        agent.flush()
        clock.advance(0)
    results: list[Any] = []
    d.addBoth(results.append)
    assert results, "the call never ended"
    if isinstance(results[0], Failure):
        results[0].raiseException()
    return results[0]


def call(transport: Transport, **kwargs: Any) -> Deferred[Any]:
    return Deferred.fromCoroutine(transport.call("GET", URL, timeout=30.0, service=False, **kwargs))


def test_a_reply_over_the_json_limit_is_a_protocol_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "JSON_LIMIT", 1000)
    clock = Clock()
    agent = RequestTraversalAgent(Replies(body=json.dumps({"x": "y" * 2000}).encode()))
    with pytest.raises(ProtocolError, match="reply larger than 1000 bytes"):
        settled(call(transport_for(agent, clock)), agent, clock)
    agent = RequestTraversalAgent(Replies(body=json.dumps({"x": "y" * 900}).encode()))
    assert settled(call(transport_for(agent, clock)), agent, clock) == {"x": "y" * 900}


def test_an_error_body_is_read_up_to_its_limit_and_still_maps_by_status() -> None:
    clock = Clock()
    detail = "d" * (2 * ERROR_BODY_LIMIT)
    body = json.dumps({"error": "SandboxNotFound", "detail": detail}).encode()
    agent = RequestTraversalAgent(Replies(status=404, body=body))
    with pytest.raises(SandboxNotFound) as raised:
        settled(call(transport_for(agent, clock)), agent, clock)
    # Cut at the limit, the body is no longer JSON: the status decides, with its first bytes.
    assert str(raised.value).startswith('HTTP 404: {"error": "SandboxNotFound", "detail": "ddd')
    assert len(str(raised.value)) < 300


def test_a_callers_own_cancel_is_a_cancellation_not_a_timeout() -> None:
    clock = Clock()
    resource = Replies(hang=True)
    agent = RequestTraversalAgent(resource)
    sending = Deferred.fromCoroutine(
        transport_for(agent, clock).send("GET", URL, timeout=30.0, service=False)
    )
    for _ in range(10):
        agent.flush()
    assert len(resource.requests) == 1 and not sending.called
    sending.cancel()
    with pytest.raises(CancelledError):
        settled(sending, agent, clock)
    assert clock.getDelayedCalls() == [], "its deadline is cancelled too"


class CountingPool(HTTPConnectionPool):
    """A connection pool that counts the calls to close its cached connections."""

    def __init__(self, reactor: Any) -> None:
        super().__init__(reactor, persistent=True)
        self.closed = 0

    def closeCachedConnections(self) -> Deferred[None]:
        self.closed += 1
        done: Deferred[None] = super().closeCachedConnections()
        return done


def test_close_closes_the_pool_only_when_the_transport_made_it() -> None:
    clock = Clock()
    given = CountingPool(clock)
    done = transport_for(None, clock, pool=given).close()
    assert done.called and given.closed == 0, "the caller's pool stays open"
    own = transport_for(None, clock)
    assert isinstance(own._pool, HTTPConnectionPool) and own._pool is not given
    assert own.close().called  # its own pool, with no connection cached: closed at once
    agent = RequestTraversalAgent(Replies(body=b"{}"))
    assert transport_for(agent, clock).close().called  # an agent of its own: no pool to close


def test_a_failure_that_is_no_transport_failure_is_raised_as_itself() -> None:
    clock = Clock()
    sending = Deferred.fromCoroutine(
        transport_for(None, clock).send(
            "GET", DecodedURL.from_text("ftp://sandboxd.invalid/x"), timeout=30.0, service=False
        )
    )
    with pytest.raises(SchemeNotSupported):
        settled(sending, RequestTraversalAgent(Replies()), clock)
    assert clock.getDelayedCalls() == []
