"""A WebSocket upgrade to a port inside a sandbox: a byte tunnel.

The upgrade request is sent to the sandbox's port (over a connection made inside its network
namespace, :mod:`sandboxd.ports.dial`) with its hop-by-hop headers dropped but for the
``Upgrade`` it asks for; from then on the client's connection and the sandbox's are joined
(the client's is taken over from twisted.web, :func:`sandboxd._twisted.take_over_channel`),
and every byte is passed on both ways as it comes, each side the other's streaming producer
(a full side pauses the reading of the other: no unbounded buffering). The sandbox's answer
(``101``, or a refusal) reaches the client as the sandbox wrote it; the tunnel stays joined to
that port of that sandbox only. When either side closes, the other is closed.
"""

from typing import Any, cast

from attrs import define, field
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import ITransport
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest

from sandboxd import _twisted
from sandboxd.errors import BadRequest
from sandboxd.ports.dial import dial
from sandboxd.ports.forward import adopt, passed_headers
from sandboxd.ports.table import Closable, PortTable


def wants_upgrade(request: IRequest) -> bool:
    """Whether ``request`` asks for a WebSocket upgrade (``Upgrade: websocket`` and a
    ``Connection`` naming ``upgrade``)."""
    upgrade = (request.getHeader(b"upgrade") or b"").strip().lower()
    tokens = {
        token.strip().lower()
        for value in request.requestHeaders.getRawHeaders(b"connection", [])
        for token in value.split(b",")
    }
    return upgrade == b"websocket" and b"upgrade" in tokens


def upgrade_head(request: IRequest, target: bytes, drop: tuple[bytes, ...]) -> bytes:
    """The upgrade request as sent to the sandbox: its method, ``target``, its end-to-end
    headers (less ``drop``), and the upgrade it asks for."""
    lines = [b"%s %s HTTP/1.1" % (request.method, target)]
    for name, values in passed_headers(request.requestHeaders, drop).getAllRawHeaders():
        lines.extend(b"%s: %s" % (name, value) for value in values)
    lines += [b"Upgrade: websocket", b"Connection: Upgrade"]
    return b"\r\n".join(lines) + b"\r\n\r\n"


class _Side(Protocol):
    """One side of a :class:`Tunnel`: what it reads is written to the other side."""

    def __init__(self, tunnel: "Tunnel") -> None:
        self.tunnel = tunnel

    def dataReceived(self, data: bytes) -> None:
        self.tunnel.other(self).write(data)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.tunnel.side_lost(self)


@define(eq=False)
class Tunnel(Closable):
    """The two joined connections of one upgrade (counted against ``rid``'s cap until both
    are closed). Both sides are connected before either can be told anything (no reactor
    turn between them)."""

    table: PortTable
    rid: str
    client: _Side = field(init=False)
    upstream: _Side = field(init=False)
    _open: int = 2

    def __attrs_post_init__(self) -> None:
        self.client = _Side(self)
        self.upstream = _Side(self)

    def other(self, side: _Side) -> ITransport:
        """The transport of the side across from ``side``."""
        return cast(ITransport, (self.upstream if side is self.client else self.client).transport)

    def side_lost(self, side: _Side) -> None:
        self._open -= 1
        self.other(side).loseConnection()
        if not self._open:
            self.table.closed(self.rid, self)

    def close(self) -> None:
        for side in (self.client, self.upstream):
            cast(Any, side.transport).abortConnection()

    def join(self) -> None:
        """Each side the other's streaming producer; the client's read again."""
        client, upstream = cast(Any, self.client.transport), cast(Any, self.upstream.transport)
        client.unregisterProducer()  # the channel's own
        upstream.registerProducer(client, True)
        client.registerProducer(upstream, True)
        client.resumeProducing()


async def tunnel(
    reactor: Any,
    table: PortTable,
    request: IRequest,
    rid: str,
    port: int,
    target: bytes,
    drop: tuple[bytes, ...] = (),
) -> None:
    """Join ``request``'s connection to ``port`` inside ``rid`` (see the module's doc). Errors
    before the join are raised for the front to answer; after it, this waits until the client's
    connection is lost (the route is then cancelled)."""
    pin = table.pin_of(rid)
    content = request.content
    content.seek(0, 2)
    if content.tell():
        raise BadRequest("a WebSocket upgrade request carries no body")
    joined = Tunnel(table, rid)
    table.opened(rid, joined)
    try:
        sock = await dial(reactor, pin, port)
    except BaseException:
        table.closed(rid, joined)
        raise
    adopt(reactor, sock, Factory.forProtocol(lambda: joined.upstream))
    upstream = cast(ITransport, joined.upstream.transport)
    upstream.write(upgrade_head(request, target, drop))
    buffered = _twisted.take_over_channel(cast(Any, request).channel, joined.client)
    upstream.write(buffered)  # what the client sent past its request (b"": nothing)
    joined.join()
    ended: Deferred[None] = Deferred()
    await ended  # cancelled once the client's connection is lost
