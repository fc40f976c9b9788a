"""Forwarding one HTTP request to a port inside a sandbox, its answer streamed back.

The request (its body already stored whole by the site, under ``SANDBOXD_MAX_BODY``) is sent
again by a Twisted ``Agent`` over a connection made inside the sandbox's network namespace
(:class:`NamespaceEndpoint`): its framing is the Agent's own (``Content-Length`` from the
stored body), never the client's, and the hop-by-hop headers (:data:`HOP_BY_HOP`) and the
front's credentials are dropped, so that neither a ``Content-Length``/``Transfer-Encoding``
pair nor a ``Connection`` header can smuggle a second request to the sandbox. The answer's body
is relayed as it comes, with the sandbox's side paused while the client's is full (the
upstream connection is the request's streaming producer): the daemon holds at most a socket
buffer of it.
"""

import re
import socket
from collections.abc import Iterable
from contextlib import suppress
from typing import Any, cast

from attrs import define, field
from twisted.internet.defer import AlreadyCalledError, Deferred
from twisted.internet.interfaces import IProtocol, IProtocolFactory, IReactorSocket
from twisted.internet.protocol import Protocol, ServerFactory
from twisted.python.failure import Failure
from twisted.web.client import Agent, FileBodyProducer, PotentialDataLoss, ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer, IRequest, IResponse

from sandboxd.ports.dial import dial
from sandboxd.ports.table import Closable, PortTable

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
    }
)
"""Headers of one hop that are never passed on (``Content-Length`` is the Agent's, from the
stored body, or twisted.web's, from the upstream's)."""


ANSWER_DONE = Failure(ResponseDone())


def passed_headers(headers: Headers, drop: Iterable[bytes] = ()) -> Headers:
    """``headers`` without the hop-by-hop ones, those a ``Connection`` header names, and
    ``drop`` (the front's credentials)."""
    dropped = set(HOP_BY_HOP) | {name.lower() for name in drop}
    for value in headers.getRawHeaders(b"connection", []):
        dropped.update(token.strip().lower() for token in value.split(b","))
    passed = Headers()
    for name, values in headers.getAllRawHeaders():
        if name.lower() not in dropped:
            passed.setRawHeaders(name, values)
    return passed


class _Adopting(ServerFactory):
    """Builds the wrapped factory's protocol and keeps it (``adoptStreamConnection`` does
    not return it)."""

    def __init__(self, inner: IProtocolFactory) -> None:
        self.inner = inner
        self.built: Any = None

    def buildProtocol(self, addr: Any) -> Any:
        self.built = self.inner.buildProtocol(addr)
        return self.built


def adopt(reactor: IReactorSocket, sock: socket.socket, factory: IProtocolFactory) -> IProtocol:
    """Hand the connected ``sock`` to the reactor, speaking ``factory``'s protocol (the
    reactor holds its own copy of the descriptor: ``sock`` is closed)."""
    adopting = _Adopting(factory)
    try:
        reactor.adoptStreamConnection(sock.fileno(), socket.AF_INET, adopting)
    finally:
        sock.close()
    built: IProtocol = adopting.built
    return built


@define
class NamespaceEndpoint:
    """An endpoint whose every connection goes to ``127.0.0.1:port`` inside the network
    namespace pinned at ``pin``, and nowhere else (whatever the URI the Agent was given)."""

    reactor: Any
    pin: str
    port: int

    def connect(self, factory: IProtocolFactory) -> Deferred[IProtocol]:
        made = dial(self.reactor, self.pin, self.port)
        return made.addCallback(lambda sock: adopt(self.reactor, sock, factory))

    def endpointForURI(self, uri: Any) -> "NamespaceEndpoint":
        return self


@define(eq=False)
class _Relay(Protocol, Closable):
    """Writes an upstream answer's body to the client's request as it comes; the upstream
    connection is the request's streaming producer. :attr:`done` fires with whether the
    answer came whole."""

    request: Any  # a twisted.web Request (a consumer)
    done: Deferred[bool] = field(factory=Deferred)

    def connectionMade(self) -> None:
        self.request.registerProducer(self.transport, True)

    def dataReceived(self, data: bytes) -> None:
        self.request.write(data)

    def connectionLost(self, reason: Failure = ANSWER_DONE) -> None:
        self.request.unregisterProducer()
        with suppress(AlreadyCalledError):  # cancelled already: the client went
            self.done.callback(bool(reason.check(ResponseDone, PotentialDataLoss)))

    def close(self) -> None:
        """Stop reading the answer (its connection to the sandbox is closed; once the answer
        has ended, nothing more happens). Before the answer began, the request to the sandbox
        is left to end on its own (its connection does not reach the answer's body)."""
        if self.transport is not None:
            cast(Any, self.transport).stopProducing()


def origin_form(uri: bytes) -> bytes:
    """The path and query of a request-line target (an absolute URI's scheme and host are
    dropped: they never choose where the proxy connects)."""
    if uri.startswith(b"/"):
        return uri
    found = re.match(rb"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*(.*)$", uri, re.S)
    rest = found.group(1) if found else b""
    return rest if rest.startswith(b"/") else b"/" + rest


def body_of(request: IRequest) -> IBodyProducer | None:
    """The stored body as a producer (``None``: there is none)."""
    content = request.content
    content.seek(0, 2)
    if not content.tell():
        return None
    content.seek(0)
    return FileBodyProducer(content)


async def forward(
    reactor: Any,
    table: PortTable,
    request: IRequest,
    rid: str,
    port: int,
    target: bytes,
    drop: Iterable[bytes] = (),
) -> None:
    """Send ``request`` to ``target`` (its path and query) on ``port`` inside ``rid`` and
    stream the answer back. Errors before the answer begins are raised (the front answers
    them: :class:`~sandboxd.ports.dial.PortClosed`, the cap's
    :class:`~sandboxd.errors.TooMany`, ...); the connection counts against the sandbox's
    cap until the answer ends or the client goes."""
    endpoint = NamespaceEndpoint(reactor, table.pin_of(rid), port)
    relay = _Relay(cast(Any, request))
    table.opened(rid, relay)
    try:
        agent = Agent.usingEndpointFactory(reactor, endpoint)
        headers = passed_headers(request.requestHeaders, drop)
        url = b"http://127.0.0.1:%d%s" % (port, target)
        response: IResponse = await agent.request(request.method, url, headers, body_of(request))
        request.setResponseCode(response.code, response.phrase)
        for name, values in passed_headers(response.headers).getAllRawHeaders():
            request.responseHeaders.setRawHeaders(name, values)
        if response.length is not None and isinstance(response.length, int):
            request.setHeader(b"content-length", b"%d" % response.length)
        response.deliverBody(relay)
        try:
            whole = await relay.done
        except BaseException:  # the client went: the sandbox's side is closed too
            relay.close()
            raise
        if not whole:  # the sandbox's side broke off: so does the client's, once what came
            cut = cast(Any, request)  # is sent, and the finish adds no last chunk
            cut.chunked = False
            cut.channel.transport.loseConnection()
    finally:
        table.closed(rid, relay)
