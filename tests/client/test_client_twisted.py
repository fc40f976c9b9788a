"""
Pins for each use of Twisted's private API (``sandboxd_client._twisted``), over real TCP.

If a Twisted upgrade moves one of them, the test named after it fails here (and not a
distant behaviour test in a way that hides the cause).
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from treq.client import HTTPClient
from twisted.internet import reactor, tcp
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import Agent, ResponseFailed, ResponseNeverReceived
from twisted.web.static import Data

from sandboxd_client import _twisted

from .client_hostile import garbage_factory
from .servers import listen, url_of


class _Probe(Protocol):
    """Records what ``response_connection`` finds under a response body's transport."""

    def __init__(self, done: Deferred[Any]) -> None:
        self.done = done
        self.found: object = "not called"

    def connectionMade(self) -> None:
        self.found = _twisted.response_connection(self.transport)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.done.callback(self.found)


@pytest_twisted.ensureDeferred
async def test_response_connection_is_the_tcp_connection_under_a_response_body() -> None:
    port = listen(Data(b"x" * 10_000, "application/octet-stream"))
    client = HTTPClient(Agent(reactor))
    try:
        response = await client.get(url_of(port), unbuffered=True)
        done: Deferred[Any] = Deferred()
        response.deliverBody(_Probe(done))
        found = await done
        assert isinstance(found, tcp.Client), found
    finally:
        await port.stopListening()


def test_response_connection_is_none_for_anything_else() -> None:
    class Proxy:
        _producer = object()

    assert _twisted.response_connection(object()) is None
    assert _twisted.response_connection(Proxy()) is None


@pytest_twisted.ensureDeferred
async def test_parse_error_is_what_the_http_parser_raises_for_non_http_bytes() -> None:
    port = reactor.listenTCP(0, garbage_factory(), interface="127.0.0.1")  # type: ignore[attr-defined]
    client = HTTPClient(Agent(reactor))
    try:
        with pytest.raises((ResponseFailed, ResponseNeverReceived)) as info:
            await client.get(url_of(port))
        leaves = [r.value for r in info.value.reasons]
        assert any(isinstance(leaf, _twisted.ParseError) for leaf in leaves), leaves
    finally:
        await port.stopListening()
