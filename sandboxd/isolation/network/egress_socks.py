"""The operator's SOCKS5 proxy as the egress proxy's way out (docs/isolation.rst, "Egress
through a SOCKS5 proxy").

With ``SANDBOXD_EGRESS_SOCKS5`` set, the egress proxy connects nothing itself: for each
allowed connection it opens one to the SOCKS5 proxy and asks it to ``CONNECT`` (RFC 1928) to
the address the proxy checked (never by name: the name's check holds for what is reached,
and the SOCKS5 proxy's own resolver cannot send the connection elsewhere), authenticating
with a user name and password (RFC 1929) when ``SANDBOXD_EGRESS_SOCKS5_USER`` and
``SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE`` are set (then that method alone is offered).

:class:`SocksClient` is a Twisted protocol: the handshake never blocks the reactor, takes at
most :data:`HANDSHAKE_TIMEOUT` seconds, connect included, and keeps no more than its
messages (the longest, the ``CONNECT``'s answer, is 262 bytes). What
comes after that answer is the upstream's first bytes, handed on with the connection. With
TLS to the proxy (a sandbox's own, :mod:`.egress_socks_tls`) all of it runs inside a
verified TLS session. It **fails closed**: a SOCKS5 proxy that cannot be reached, refuses,
or answers anything but the protocol ends the attempt with a reason (:data:`UNREACHABLE`,
:data:`AUTH`, :data:`REFUSED`, :data:`PROTOCOL`, :data:`TIMEOUT`, :data:`TLS`), which the
egress proxy counts and resets the sandbox's connection for; nothing is ever sent another
way.
"""

import ipaddress
import struct
from collections.abc import Callable
from typing import Any

from attrs import define, field, frozen
from OpenSSL import SSL
from twisted.internet import protocol
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

from sandboxd.isolation.network.egress_plan import Address
from sandboxd.isolation.network.egress_socks_tls import SocksTLS

log = Logger()

HANDSHAKE_TIMEOUT = 10.0
"""Longest the connect to the SOCKS5 proxy and its handshake may take together (seconds)."""

UNREACHABLE = "socks_unreachable"
"""The SOCKS5 proxy could not be connected to."""
AUTH = "socks_auth"
"""It took none of the methods offered, refused the user and password, or hung up on them."""
REFUSED = "socks_refused"
"""It answered the ``CONNECT`` with a failure (the destination refused, unreachable, ...)."""
PROTOCOL = "socks_protocol"
"""It answered something that is not SOCKS5, or hung up before answering."""
TIMEOUT = "socks_timeout"
"""It did not finish within :data:`HANDSHAKE_TIMEOUT`."""
TLS = "socks_tls"
"""The TLS to it failed: its certificate did not verify, or its TLS is not TLS 1.2 or newer."""

NO_AUTH, USER_PASSWORD, NO_METHOD = 0x00, 0x02, 0xFF
CONNECT = 0x01
ATYP_IPV4, ATYP_NAME, ATYP_IPV6 = 0x01, 0x03, 0x04


@frozen
class SocksAddress:
    """``SANDBOXD_EGRESS_SOCKS5``: where the SOCKS5 proxy listens."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_socks_address(text: str) -> SocksAddress:
    """``HOST:PORT`` (a name or an IPv4 address) or ``[IPV6]:PORT``; ``ValueError`` saying
    why not."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        ipaddress.IPv6Address(host)  # (its ValueError names the address)
        number = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, number = text.rpartition(":")
        if not host or ":" in host:
            raise ValueError(f"{text!r} is not HOST:PORT (an IPv6 address goes in brackets)")
    if not number.isdigit() or not 0 < int(number) < 65536:
        raise ValueError(f"{text!r}: the port is not a port number")
    return SocksAddress(host, int(number))


@frozen
class SocksUpstream:
    """The SOCKS5 proxy and, when both are set, the user and password it is sent."""

    address: SocksAddress
    user: bytes | None = None
    password: bytes | None = field(default=None, repr=False)
    """A secret: never shown (not in the ``repr`` either)."""
    tls: SocksTLS | None = None
    """TLS to the proxy, when on (:mod:`.egress_socks_tls`)."""

    def __attrs_post_init__(self) -> None:
        for what, value in (("user", self.user), ("password", self.password)):
            if value is not None and not 0 < len(value) < 256:
                raise ValueError(f"the SOCKS5 {what} must be 1 to 255 bytes (RFC 1929)")

    @property
    def methods(self) -> bytes:
        """The methods offered: user and password when set, else none."""
        return bytes([USER_PASSWORD if self.user is not None else NO_AUTH])

    def connect(
        self,
        reactor: Any,
        address: Address,
        port: int,
        on_connected: Callable[[Any, bytes], None],
        on_failed: Callable[[str], None],
    ) -> "SocksAttempt":
        """Ask the SOCKS5 proxy for a connection to ``address:port``: then
        ``on_connected(transport, first_bytes)`` (the transport Twisted's TCP one, or with
        :attr:`tls` its TLS layer, its protocol done with it), or ``on_failed(reason)``;
        exactly one of them, once."""
        attempt = SocksAttempt(self, address, port, on_connected, on_failed)
        attempt.timer = reactor.callLater(HANDSHAKE_TIMEOUT, attempt.fail, TIMEOUT)
        factory: Any = SocksFactory(attempt)
        if self.tls is not None:
            factory = self.tls.client_factory(self.address.host, factory, reactor)
        attempt.connector = reactor.connectTCP(
            self.address.host, self.address.port, factory, timeout=HANDSHAKE_TIMEOUT
        )
        return attempt


def connect_request(address: Address, port: int) -> bytes:
    """The ``CONNECT`` request for ``address:port``."""
    atyp = ATYP_IPV4 if address.version == 4 else ATYP_IPV6
    return bytes([5, CONNECT, 0, atyp]) + address.packed + struct.pack("!H", port)


@define(eq=False)
class SocksAttempt:
    """One connection asked of the SOCKS5 proxy, until it is handed on or fails."""

    upstream: SocksUpstream
    address: Address
    port: int
    on_connected: Callable[[Any, bytes], None]
    on_failed: Callable[[str], None]
    timer: IDelayedCall | None = None
    connector: Any = None
    client: "SocksClient | None" = None
    done: bool = False

    def succeed(self, transport: Any, first: bytes) -> None:
        if self._end():
            self.on_connected(transport, first)

    def fail(self, reason: str) -> None:
        """End the attempt (once): its connection, if any, aborted; ``on_failed`` told."""
        if not self._end():
            return
        if self.client is not None and self.client.transport is not None:
            self.client.transport.abortConnection()  # type: ignore[attr-defined]
        elif self.connector is not None:
            self.connector.stopConnecting()
        log.info(
            "egress proxy: SOCKS5 {socks} did not connect {address} port {port}: {reason}",
            socks=str(self.upstream.address),
            address=str(self.address),
            port=self.port,
            reason=reason,
        )
        self.on_failed(reason)

    def _end(self) -> bool:
        """Whether this ends the attempt (it had not ended)."""
        if self.done:
            return False
        self.done = True
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        return True


class SocksFactory(protocol.ClientFactory):
    noisy = False  # (no log line per connection)

    def __init__(self, attempt: SocksAttempt) -> None:
        self.attempt = attempt

    def buildProtocol(self, addr: Any) -> "SocksClient":
        client = SocksClient(self.attempt)
        self.attempt.client = client
        self.attempt.connector = None  # (connected: nothing to stop)
        return client

    def clientConnectionFailed(self, connector: Any, reason: Any) -> None:
        self.attempt.connector = None  # (no longer connecting: nothing to stop)
        self.attempt.fail(UNREACHABLE)


class SocksClient(protocol.Protocol):
    """The client's side of a SOCKS5 handshake (see the module): method, then user and
    password when chosen, then ``CONNECT``."""

    def __init__(self, attempt: SocksAttempt) -> None:
        self.attempt = attempt
        self.stage = "method"
        self.buffer = b""

    def connectionMade(self) -> None:
        methods = self.attempt.upstream.methods
        self.transport.write(bytes([5, len(methods)]) + methods)  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        if self.stage == "method":
            self._method()
        elif self.stage == "auth":
            self._auth()
        else:
            self._reply()

    def _method(self) -> None:
        if len(self.buffer) < 2:
            return
        version, method = self.buffer[0], self.buffer[1]
        if version != 5 or len(self.buffer) > 2:
            self.attempt.fail(PROTOCOL)
        elif method not in self.attempt.upstream.methods:  # (NO_METHOD: none acceptable)
            self.attempt.fail(AUTH)
        elif method == USER_PASSWORD:
            self.buffer, self.stage = b"", "auth"
            upstream = self.attempt.upstream
            user, password = upstream.user or b"", upstream.password or b""
            message = bytes([1, len(user)]) + user + bytes([len(password)]) + password
            self.transport.write(message)  # type: ignore[union-attr]
        else:
            self._request()

    def _auth(self) -> None:
        if len(self.buffer) < 2:
            return
        if self.buffer[0] != 1 or len(self.buffer) > 2:
            self.attempt.fail(PROTOCOL)
        elif self.buffer[1] != 0:
            self.attempt.fail(AUTH)
        else:
            self._request()

    def _request(self) -> None:
        self.buffer, self.stage = b"", "reply"
        request = connect_request(self.attempt.address, self.attempt.port)
        self.transport.write(request)  # type: ignore[union-attr]

    def _reply(self) -> None:
        if len(self.buffer) < 5:
            return
        version, code, reserved, atyp = self.buffer[:4]
        if version != 5 or reserved != 0 or atyp not in (ATYP_IPV4, ATYP_NAME, ATYP_IPV6):
            self.attempt.fail(PROTOCOL)
            return
        if code != 0:
            log.info("egress proxy: the SOCKS5 proxy answered CONNECT with {code}", code=code)
            self.attempt.fail(REFUSED)
            return
        bound = {ATYP_IPV4: 4, ATYP_IPV6: 16}.get(atyp, 1 + self.buffer[4])
        size = 4 + bound + 2
        if len(self.buffer) >= size:
            self.stage = "done"
            self.attempt.succeed(self.transport, self.buffer[size:])

    def connectionLost(self, reason: Any = None) -> None:
        self.attempt.client = None  # (nothing left to abort)
        if reason is not None and reason.check(SSL.Error) is not None:
            self.attempt.fail(TLS)
        else:
            self.attempt.fail(AUTH if self.stage == "auth" else PROTOCOL)
