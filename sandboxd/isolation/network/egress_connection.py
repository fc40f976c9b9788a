"""One sandbox's connection through the egress proxy (docs/isolation.rst, "Egress by name"):
its name peeked, the name resolved and judged, then the connection relayed to its upstream,
rewritten under a header rule, or refused; the steps are those that
:mod:`~sandboxd.isolation.network.egress_proxy` lists, whose :class:`EgressProxy` holds the
limits and counts each connection is made with."""

import ipaddress
import socket
import struct
from typing import TYPE_CHECKING, Any

from twisted.internet import protocol
from twisted.internet.interfaces import IDelayedCall, IHalfCloseableProtocol
from twisted.protocols.tls import TLSMemoryBIOProtocol
from zope.interface import implementer

from sandboxd.isolation.network.egress_names import PEEK_MAX, peek_name
from sandboxd.isolation.network.egress_plan import Address
from sandboxd.isolation.network.egress_policy import PROXIED_PORTS
from sandboxd.isolation.network.egress_relay import Relay, take_socket
from sandboxd.isolation.network.egress_rewrite import RequestRewriter, RuleConnection
from sandboxd.isolation.network.egress_rules import rule_for
from sandboxd.isolation.network.egress_socks_tls import SocksTunnel, Unchanged
from sandboxd.isolation.network.egress_tls import rewritten
from sandboxd.isolation.network.egress_upstream import Connecting, UpstreamFactory
from sandboxd.isolation.network.egress_verdict import refusal

if TYPE_CHECKING:
    from sandboxd.isolation.network.egress_proxy import EgressProxy

SO_ORIGINAL_DST = 80
"""``getsockopt`` option (``SOL_IP``; ``IP6T_SO_ORIGINAL_DST`` at ``SOL_IPV6``, same value)."""

PEEK_TIMEOUT = 10.0
"""Longest a connection may take to send the bytes that carry its name (seconds)."""

CONNECT_TIMEOUT = 10.0

NO_NAME_REASON = "no_name"
MISMATCH = "mismatch"
UNRESOLVED = "unresolved"
TOO_MANY = "too_many"
UNREACHABLE = "unreachable"
RULE_OVER_TLS = "rule_over_tls"


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """Where a redirected connection was addressed before nftables redirected it."""
    if sock.family == socket.AF_INET6:
        raw = sock.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), struct.unpack("!H", raw[2:4])[0]
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    return socket.inet_ntop(socket.AF_INET, raw[4:8]), struct.unpack("!H", raw[2:4])[0]


@implementer(IHalfCloseableProtocol)
class SandboxSide(protocol.Protocol):
    """A sandbox's connection: peeked, checked, then relayed to its upstream (both sockets
    are taken out of Twisted then: :mod:`.egress_relay`)."""

    def __init__(self, proxy: "EgressProxy") -> None:
        self.proxy = proxy
        self.rid = ""
        self.buffer = b""
        self.destination: tuple[str, int] = ("", 0)
        self.relay: Relay | None = None
        self.deciding = False
        self.read_done = False
        """The sandbox's end was read while its name was resolved."""
        self.gone = False
        """Closed, refused or relayed: nothing more is done for it here."""
        self.timer: IDelayedCall | None = None
        self.rewriter: RequestRewriter | None = None
        """The name's header rule applies: the requests go through it, not a relay."""
        self.rule_connection: RuleConnection | None = None
        self.terminate = False
        """The rule's connection is TLS: terminated (:mod:`.egress_tls`)."""
        self.tls: TLSMemoryBIOProtocol | None = None
        """Then the TLS server on the sandbox's connection, which reads what it sends."""
        self.connecting: Connecting | None = None
        """A plain upstream being connected for a relay."""

    @property
    def tcp(self) -> Any:
        """The TCP transport (``abortConnection``, ``pauseProducing``, ``getHandle``)."""
        return self.transport

    def connectionMade(self) -> None:
        peer = self.tcp.getPeer().host
        found = self.proxy.sandboxes.sandbox_at(peer)
        if found is None:
            self.tcp.abortConnection()
            return
        rid, _ = found
        try:
            self.destination = original_destination(self.tcp.getHandle())
        except OSError:  # a connection nftables did not redirect (none such passes its rules)
            self.tcp.abortConnection()
            return
        if (
            self.proxy.open[rid] >= self.proxy.per_sandbox
            or sum(self.proxy.open.values()) >= self.proxy.total
        ):
            self.proxy.refuse(rid, TOO_MANY, "", self.destination[0])
            self.tcp.abortConnection()
            return
        self.rid = rid
        self.proxy.open[rid] += 1
        _, policy = found
        if self.proxy.upstream_for(policy) is not None and not (
            policy.by_name and self.destination[1] in PROXIED_PORTS
        ):  # no name to read: the sandbox's first bytes wait in its socket for the relay
            self.deciding = True
            self.tcp.pauseProducing()
            self.decide({ipaddress.ip_address(self.destination[0])}, "")
            return
        self.timer = self.proxy.reactor.callLater(PEEK_TIMEOUT, self.fail, NO_NAME_REASON, "")

    def readConnectionLost(self) -> None:
        if self.rule_connection is not None:
            self.rule_connection.sandbox_ended()
            return
        if not self.deciding:  # its name can never be complete now
            self.fail(NO_NAME_REASON, "")
            return
        self.read_done = True  # (the upstream is half-closed once the peeked bytes are sent)

    def writeConnectionLost(self) -> None:
        """Never called: the proxy half-closes no sandbox's connection while Twisted has it
        (the relay does, once it holds the socket)."""

    def dataReceived(self, data: bytes) -> None:
        if self.tls is not None:
            self.tls.dataReceived(data)
            return
        if self.rule_connection is not None:
            self.rule_connection.from_sandbox(data)
            return
        self.buffer += data
        if self.deciding:  # (bytes read before the pause took hold)
            return
        name = peek_name(self.buffer[: PEEK_MAX + 5])
        if name is None and len(self.buffer) <= PEEK_MAX + 5:
            return
        if not name:
            self.fail(NO_NAME_REASON, "")
            return
        self.deciding = True
        self.tcp.pauseProducing()
        self.proxy.names.resolve(name).addCallback(self.decide, name)

    def decide(self, addresses: set[Address], name: str) -> None:
        """Connect upstream, or refuse, once the name's addresses are known (``name``
        empty: a connection judged by its address alone, which is all of ``addresses``)."""
        self._stop_timer()
        if self.gone:  # hung up, or timed out, while the name was resolved
            return
        found = self.proxy.sandboxes.sandbox_at(self.tcp.getPeer().host)
        if found is None:  # the sandbox went meanwhile
            self.tcp.abortConnection()
            return
        _, policy = found  # the policy now: a change applies to the next connection
        address = ipaddress.ip_address(self.destination[0])
        if not addresses:
            self.fail(UNRESOLVED, name)
            return
        if address not in addresses:
            self.fail(MISMATCH, name)
            return
        reason = refusal(policy, name, address, self.proxy.denied, self.proxy.is_host)
        if reason is not None:
            self.fail(reason, name)
            return
        rule = rule_for(policy.rules, name) if name else None
        socks = self.proxy.upstream_for(policy)
        if rule is not None:
            self.terminate = self.buffer[:1] == b"\x16"
            if self.terminate and (self.proxy.tls is None or socks is not None):
                self.fail(RULE_OVER_TLS, name)  # its headers cannot be set inside TLS
                return
            self.rewriter = RequestRewriter(name, rule.headers)
        if socks is not None:
            socks.connect(
                self.proxy.reactor,
                address,
                self.destination[1],
                self.relay_to,
                lambda reason: self.fail(reason, name),
            )
            return
        if rule is None:
            self.connecting = self.proxy.connector(
                self.proxy.reactor,
                address,
                self.destination[1],
                CONNECT_TIMEOUT,
                self.relay_socket,
                lambda: self.fail(UNREACHABLE, name),
            )
            self.connecting.start()
            return
        factory: Any = UpstreamFactory(self, name, UNREACHABLE, self.terminate, self.proxy.reactor)
        if self.terminate:
            assert self.proxy.tls is not None
            factory = self.proxy.tls.client_factory(name, factory)
        self.proxy.reactor.connectTCP(
            str(address), self.destination[1], factory, timeout=CONNECT_TIMEOUT
        )

    def relay_to(self, upstream: Any, answered: bytes = b"") -> None:
        """The upstream (a TCP transport) is connected: both sockets leave Twisted for a
        :class:`~.egress_relay.Relay`, which sends what was peeked upstream first, and
        ``answered`` (what the upstream sent with the SOCKS5 proxy's answer) to the sandbox
        first; the connection stays counted until the relay ends. A sandbox that hung up, or
        timed out, meanwhile: the upstream is closed."""
        if self.gone:
            upstream.loseConnection()
            return
        self.gone = True
        if self.rewriter is not None or isinstance(upstream, TLSMemoryBIOProtocol):
            self._rewrite(upstream, answered)  # (a TLS tunnel to a SOCKS5 proxy: not spliced)
            return
        self._relay(take_socket(upstream), answered)

    def relay_socket(self, upstream: socket.socket) -> None:
        """A plain upstream is connected (:attr:`EgressProxy.connector`): both
        sockets go to a :class:`~.egress_relay.Relay` (see :meth:`relay_to`)."""
        self.connecting = None
        if self.gone:
            upstream.close()
            return
        self.gone = True
        self._relay(upstream, b"")

    def _relay(self, upstream: socket.socket, answered: bytes) -> None:
        self.relay = Relay.start(
            self.proxy.reactor,
            take_socket(self.transport),
            upstream,
            self.buffer,
            self.read_done,
            self.release,
            answered,
        )
        self.buffer = b""

    def _rewrite(self, upstream: Any, answered: bytes) -> None:
        """The rule's path: the sandbox's requests rewritten on their way to ``upstream``,
        once decrypted when its connection is TLS (the upstream's then, too); and a TLS
        tunnel to a sandbox's own SOCKS5 proxy, which cannot be spliced: its bytes pass
        through Twisted's transports (:class:`~.egress_socks_tls.SocksTunnel`), rewritten
        where a rule says so, else unchanged."""
        rewriter = self.rewriter or Unchanged()
        name, address = rewriter.name, self.destination[0]
        refused = lambda reason: self.proxy.refuse(self.rid, reason, name, address)  # noqa: E731
        if isinstance(upstream, TLSMemoryBIOProtocol) and not self.terminate:
            self.rule_connection = SocksTunnel(self.tcp, upstream, rewriter, refused)
        else:
            self.rule_connection, self.tls = rewritten(
                self.proxy.tls if self.terminate else None,
                self.tcp,
                upstream,
                rewriter,
                refused,
            )
        peeked, self.buffer = self.buffer, b""
        if self.tls is None:
            self.rule_connection.start(peeked, self.read_done, answered)
            return
        self.rule_connection.start(b"", self.read_done, answered)
        self.tls.dataReceived(peeked)  # (the ClientHello)

    def fail(self, reason: str, name: str) -> None:
        """Refuse the connection (once): count it, reset it."""
        self._stop_timer()
        if not self.gone:
            self.gone = True
            self.proxy.refuse(self.rid, reason, name, self.destination[0])
            self.tcp.abortConnection()

    def _stop_timer(self) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.timer = None

    def release(self) -> None:
        """The connection no longer counts against its sandbox's (once)."""
        if self.rid:
            self.proxy.open[self.rid] -= 1
            if not self.proxy.open[self.rid]:
                del self.proxy.open[self.rid]
            self.rid = ""

    def connectionLost(self, reason: Any = None) -> None:
        self.gone = True
        self._stop_timer()
        if self.connecting is not None:
            self.connecting.cancel()
            self.connecting = None
        if self.tls is not None:  # (its plain side tells the rule connection)
            self.tls.connectionLost(reason)
        elif self.rule_connection is not None:
            self.rule_connection.sandbox_lost(reason)
        self.release()
