"""The egress proxy's connection to a sandbox's upstream (docs/isolation.rst, "Egress by
name"): made once the proxy let the connection pass, handed to the sandbox's side
(:class:`~sandboxd.isolation.network.egress_connection.SandboxSide`) as soon as it is up, or the
sandbox's connection refused when it cannot be made."""

from typing import Any, Protocol, cast

from twisted.internet import protocol
from twisted.internet.interfaces import IDelayedCall, IHandshakeListener
from zope.interface import implementer


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
