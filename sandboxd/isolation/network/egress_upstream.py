"""The egress proxy's connection to a sandbox's upstream (docs/isolation.rst, "Egress by
name"): made once the proxy let the connection pass, handed to the sandbox's side
(:class:`~sandboxd.isolation.network.egress_connection.SandboxSide`) as soon as it is up, or the
sandbox's connection refused when it cannot be made."""

import errno
import socket
from collections.abc import Callable
from typing import Any, Protocol, cast

from twisted.internet import protocol
from twisted.internet.interfaces import IDelayedCall, IHandshakeListener, IWriteDescriptor
from zope.interface import implementer

from sandboxd.isolation.network.egress_plan import Address


class Sandbox(Protocol):
    """What the upstream asks of the sandbox's side."""

    def relay_to(self, upstream: Any, answered: bytes = b"") -> None:
        """The upstream (its transport) is up."""

    def fail(self, reason: str, name: str) -> None:
        """Refuse the sandbox's connection for ``reason``."""


UPSTREAM_TLS = "upstream_tls"
"""The reason a connection is refused whose upstream's TLS did not complete: its certificate
did not verify for the name, or it spoke no TLS."""

UPSTREAM_TLS_TIMEOUT = "upstream_tls_timeout"
"""The reason a connection is refused whose upstream's TLS handshake did not complete within
:data:`HANDSHAKE_TIMEOUT` of its TCP connection (an upstream that accepts and stalls)."""

HANDSHAKE_TIMEOUT = 10.0
"""Seconds an upstream's TLS handshake may take (as its TCP connect may:
``egress_proxy.CONNECT_TIMEOUT``)."""


class UpstreamFactory(protocol.ClientFactory):
    """Connects the upstream of ``sandbox`` for ``name``; with ``tls``, the factory a TLS
    client factory wraps (:mod:`.egress_tls`), whose protocol waits for the handshake (at
    most :data:`HANDSHAKE_TIMEOUT` on ``clock``)."""

    noisy = False  # (no log line per connection)

    def __init__(
        self, sandbox: Sandbox, name: str, unreachable: str, tls: bool, clock: Any
    ) -> None:
        self.sandbox = sandbox
        self.name = name
        self.unreachable = unreachable
        self.tls = tls
        self.clock = clock

    def buildProtocol(self, addr: Any) -> "UpstreamSide":
        return UpstreamSide(self.sandbox, self.name, self.tls, self.clock)

    def clientConnectionFailed(self, connector: Any, reason: Any) -> None:
        self.sandbox.fail(self.unreachable, self.name)


@implementer(IHandshakeListener)
class UpstreamSide(protocol.Protocol):
    """The proxy's connection to the address the name resolved to, until it is relayed: at
    once over TCP; over TLS once the handshake verified the upstream, the connection being
    refused (:data:`UPSTREAM_TLS`) when it ends before, and aborted and refused
    (:data:`UPSTREAM_TLS_TIMEOUT`) when the handshake takes longer than
    :data:`HANDSHAKE_TIMEOUT` on ``clock``."""

    def __init__(self, sandbox: Sandbox, name: str, tls: bool, clock: Any) -> None:
        self.sandbox = sandbox
        self.name = name
        self.tls = tls
        self.clock = clock
        self.timer: IDelayedCall | None = None

    def connectionMade(self) -> None:
        if not self.tls:
            self.sandbox.relay_to(self.transport)
            return
        self.timer = self.clock.callLater(HANDSHAKE_TIMEOUT, self._stalled)

    def handshakeCompleted(self) -> None:
        self._stop_timer()
        self.sandbox.relay_to(self.transport)

    def _stalled(self) -> None:
        """The handshake stalled: refused for that (the loss that follows is not counted
        again), the upstream aborted."""
        self.timer = None
        self.sandbox.fail(UPSTREAM_TLS_TIMEOUT, self.name)
        cast(Any, self.transport).abortConnection()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def connectionLost(self, reason: Any = None) -> None:
        """Before the handshake (after it, the connection's reader has it): refused. A
        sandbox refused or gone already is not counted again (:meth:`Sandbox.fail`)."""
        self._stop_timer()
        self.sandbox.fail(UPSTREAM_TLS, self.name)


class Connecting(Protocol):
    """An upstream being connected for a relay (:class:`PlainConnect`)."""

    def start(self) -> None:
        """Begin connecting."""

    def cancel(self) -> None:
        """Give it up: neither callback follows."""


Connector = Callable[
    [Any, Address, int, float, Callable[[socket.socket], None], Callable[[], None]], Connecting
]
"""Makes a :class:`Connecting`: (reactor, address, port, timeout, connected, failed)."""


@implementer(IWriteDescriptor)
class PlainConnect:
    """A plain TCP upstream connected for a relay without a Twisted transport: a
    non-blocking ``connect(2)``, then, once the socket is writable, its ``SO_ERROR`` (a
    transport would connect, check with a second ``connect``, and then be taken apart for the
    relay, each a cost on every relayed connection: docs/performance.rst, "Egress by name").

    :meth:`start` it; ``connected`` is given the connected socket (which is then the
    caller's), or ``failed`` is called, once, when it cannot be made (refused, unreachable,
    out of descriptors, or not within ``timeout`` seconds on ``reactor``'s clock).
    :meth:`cancel` gives up (the sandbox's side went meanwhile): neither is called.
    """

    def __init__(
        self,
        reactor: Any,
        address: Address,
        port: int,
        timeout: float,
        connected: Callable[[socket.socket], None],
        failed: Callable[[], None],
    ) -> None:
        self.reactor = reactor
        self.address = address
        self.port = port
        self.timeout = timeout
        self.connected = connected
        self.failed = failed
        self.sock: socket.socket | None = None
        self.timer: IDelayedCall | None = None

    def start(self) -> None:
        family = socket.AF_INET6 if self.address.version == 6 else socket.AF_INET
        try:
            self.sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        except OSError:  # out of descriptors
            self.failed()
            return
        error = self.sock.connect_ex((str(self.address), self.port))
        if error == 0:
            self._done(0)
        elif error == errno.EINPROGRESS:
            self.reactor.addWriter(self)
            self.timer = self.reactor.callLater(self.timeout, self._done, errno.ETIMEDOUT)
        else:
            self._done(error)

    def doWrite(self) -> None:
        """The socket is writable: its connect is done, unless the event was not its own (the
        epoll reactor hands out one round's events by descriptor number, and a descriptor
        closed earlier in the round may have had this one's; the daemon's reactor drops such
        events, this check holds under any): then it goes on waiting."""
        assert self.sock is not None, "written only while connecting"
        error = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if not error and not _has_peer(self.sock):
            return
        self._done(error)

    def _done(self, error: int) -> None:
        self._stop()  # (while the descriptor is still the reactor's to look up)
        sock, self.sock = self.sock, None
        assert sock is not None
        if error:
            sock.close()
            self.failed()
        else:
            self.connected(sock)

    def cancel(self) -> None:
        """Give the connection up (closed; neither callback follows)."""
        self._stop()
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def _stop(self) -> None:
        self.reactor.removeWriter(self)
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.timer = None

    def fileno(self) -> int:
        return -1 if self.sock is None else self.sock.fileno()

    def connectionLost(self, reason: Any) -> None:
        """The reactor is stopping (or the socket failed under it): not connected."""
        if self.sock is not None:
            self._done(errno.ECONNABORTED)

    def logPrefix(self) -> str:
        return "egress upstream"


def _has_peer(sock: socket.socket) -> bool:
    """Whether ``sock``'s connect is complete (``getpeername`` fails while it is under way)."""
    try:
        sock.getpeername()
    except OSError:
        return False
    return True
