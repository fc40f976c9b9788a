"""The egress proxy: where a sandbox's web traffic goes when its policy names hosts
(docs/isolation.rst, "Egress by name").

nftables redirects such a sandbox's TCP to ports 80 and 443 to this proxy's one listener
(:func:`sandboxd.isolation.network.egress_policy.policy_script`); the sandbox is known by the
source address of its veth (:meth:`Sandboxes.sandbox_at`), the address it meant to reach by
the connection's original destination (``SO_ORIGINAL_DST``). For each connection the proxy

1. reads the first bytes until :func:`~sandboxd.isolation.network.egress_names.peek_name`
   gives the TLS SNI or HTTP ``Host`` (none: refused);
2. resolves that name itself, with its own resolver (``SANDBOXD_EGRESS_DNS``, else the host's
   nameservers), never the sandbox's ``/etc/hosts`` or DNS answers, its answers kept for
   their TTL (:mod:`~sandboxd.isolation.network.egress_resolve`);
3. refuses the connection when the original destination is not one of the name's addresses
   (a mismatch: a hard-coded address, an SNI that lies), or when
   :func:`~sandboxd.isolation.network.egress_verdict.refusal` refuses the name or address;
4. else connects to that address and hands both sockets to a relay
   (:mod:`~sandboxd.isolation.network.egress_relay`), which splices the bytes both ways in
   the kernel, with flow control (a side that cannot keep up stops the other being read).

When the sandbox's policy has a header rule for the name (:mod:`.egress_rules`), step 4
differs: an HTTP connection is not relayed but rewritten request by request
(:mod:`.egress_rewrite`); a TLS one too, once its TLS is terminated (:mod:`.egress_tls`),
its upstream verified first, or refused (``rule_over_tls``) where the proxy has no CA, or
sends through a SOCKS5 proxy.

With an operator's SOCKS5 proxy (:attr:`EgressProxy.socks`, ``SANDBOXD_EGRESS_SOCKS5``),
nftables redirects every TCP connection of every sandbox here (but DNS to the host's
nameservers), and step 4 asks that proxy instead (:mod:`.egress_socks`): a connection that
needs no name (its sandbox's policy names no host, or its port is not 80 or 443) is not
peeked but judged by its address alone, as the kernel would have judged it, then handed on.
Whatever the SOCKS5 proxy does but connect, the connection is refused: never sent directly.
A sandbox whose policy names a SOCKS5 proxy of its own (``socks5``, E2B's ``egressProxy``)
has all its TCP redirected here the same way, and its connections leave through that proxy
instead of the operator's (:meth:`EgressProxy.upstream_for`).

A refused connection is reset and counted per sandbox by reason (:attr:`EgressProxy.refused`,
``on_refused``): names and addresses go to the log, never any byte of the payload. At most
``per_sandbox`` connections of one sandbox, and ``total`` of all, are open at once (each
holds six of the daemon's descriptors once relayed, two sockets and two pipes, which its API
needs too: :func:`total_for` sizes ``total`` to the descriptor limit). Everything runs on
the reactor thread and nothing blocks it (the name lookups are Twisted's, asynchronous).
"""

import ipaddress
import socket
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from attrs import define, field
from twisted.internet import protocol
from twisted.internet.interfaces import IDelayedCall, IHalfCloseableProtocol
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol
from zope.interface import implementer

from sandboxd.isolation.network.egress_names import PEEK_MAX, peek_name
from sandboxd.isolation.network.egress_plan import Address, Network
from sandboxd.isolation.network.egress_policy import PROXIED_PORTS, EgressPolicy
from sandboxd.isolation.network.egress_relay import Relay, take_socket
from sandboxd.isolation.network.egress_resolve import NameCache
from sandboxd.isolation.network.egress_rewrite import RequestRewriter, RuleConnection
from sandboxd.isolation.network.egress_rules import rule_for
from sandboxd.isolation.network.egress_socks import SocksUpstream
from sandboxd.isolation.network.egress_tls import RuleTLS, rewritten
from sandboxd.isolation.network.egress_upstream import UpstreamFactory
from sandboxd.isolation.network.egress_verdict import refusal

log = Logger()

SO_ORIGINAL_DST = 80
"""``getsockopt`` option (``SOL_IP``; ``IP6T_SO_ORIGINAL_DST`` at ``SOL_IPV6``, same value)."""

PER_SANDBOX = 256
"""The default most connections one sandbox has open through the proxy at once."""

TOTAL = 4096
"""The default most connections open through the proxy at once, all sandboxes together."""

DESCRIPTORS_PER_CONNECTION = 6
"""A relayed connection's descriptors: its two sockets and a pipe (two ends) each way."""


def total_for(descriptors: int) -> int:
    """The most connections open through the proxy at once for a daemon that may open
    ``descriptors``: :data:`TOTAL`, or fewer so that they hold at most a quarter of them
    (half is the HTTP connections', see docs/operating.rst, "Connections")."""
    return max(1, min(TOTAL, descriptors // (4 * DESCRIPTORS_PER_CONNECTION)))


PEEK_TIMEOUT = 10.0
"""Longest a connection may take to send the bytes that carry its name (seconds)."""

CONNECT_TIMEOUT = 10.0

ALL_INTERFACES = ("0.0.0.0", "::")

NO_NAME_REASON = "no_name"
MISMATCH = "mismatch"
UNRESOLVED = "unresolved"
TOO_MANY = "too_many"
UNREACHABLE = "unreachable"
RULE_OVER_TLS = "rule_over_tls"


class Sandboxes(Protocol):
    """What the proxy asks of the egress mode."""

    def sandbox_at(self, address: str) -> tuple[str, EgressPolicy] | None:
        """The sandbox (its id and policy now) whose veth has ``address``, if any."""


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """Where a redirected connection was addressed before nftables redirected it."""
    if sock.family == socket.AF_INET6:
        raw = sock.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), struct.unpack("!H", raw[2:4])[0]
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    return socket.inet_ntop(socket.AF_INET, raw[4:8]), struct.unpack("!H", raw[2:4])[0]


@define
class EgressProxy:
    """The proxy's state: its sandboxes, resolver, deny list and counts (see the module)."""

    reactor: Any
    sandboxes: Sandboxes
    resolver: Any
    """A Twisted ``IResolver`` (``lookupAddress``, ``lookupIPV6Address``)."""
    denied: list[Network]
    """The operator's denied ranges (see :func:`.egress_verdict.operator_denied`)."""
    is_host: Callable[[Address], bool]
    per_sandbox: int = PER_SANDBOX
    total: int = TOTAL
    on_refused: Callable[[str, str], None] = lambda rid, reason: None
    on_forget: Callable[[str, str], None] = lambda rid, reason: None
    """Called for each (sandbox, reason) counted when :meth:`forget` drops its counts."""
    refused: Counter[tuple[str, str]] = field(factory=Counter)
    """Refused connections by (sandbox id, reason)."""
    open: Counter[str] = field(factory=Counter)
    """Connections open now, by sandbox id."""
    interfaces: Sequence[str] = ALL_INTERFACES
    """Where it listens: every IPv4 address, and every IPv6 one when the pool has IPv6."""
    socks: SocksUpstream | None = None
    """The operator's SOCKS5 proxy, the only way out when set (see the module)."""
    tls: RuleTLS | None = None
    """The CA and upstream trust that header rules over TLS need (none: refused)."""
    _ports: list[Any] = field(factory=list)
    names: NameCache = field(init=False)
    """The names resolved lately (by :attr:`resolver`) and their addresses."""

    def __attrs_post_init__(self) -> None:
        self.names = NameCache(self.reactor, self.resolver)

    def listen(self) -> int:
        """Start listening on :attr:`interfaces`, all on one port; that port.

        Only redirected connections from sandbox veths reach it: the egress table refuses
        the rest from sandboxes, and anyone else's (the egress mode listens only while its
        table is loaded, which names the port); anyone else that got through would not be a
        sandbox and is closed at once."""
        port = 0
        factory = ProxyFactory(self)
        for address in self.interfaces:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                if family == socket.AF_INET6:  # the IPv4 listener has IPv4's
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, port))
                port = sock.getsockname()[1]
                sock.listen(128)
                sock.setblocking(False)
                self._ports.append(self.reactor.adoptStreamPort(sock.fileno(), family, factory))
        log.info("egress proxy: listening on port {port}", port=port)
        return port

    def close(self) -> None:
        """Stop listening (open connections stay until they end)."""
        for port in self._ports:
            port.stopListening()
        self._ports.clear()

    def refuse(self, rid: str, reason: str, name: str, address: str) -> None:
        """Count and log a refused connection."""
        self.refused[(rid, reason)] += 1
        self.on_refused(rid, reason)
        log.info(
            "egress proxy: refused {rid} to {name} at {address}: {reason}",
            rid=rid,
            name=name or "(no name)",
            address=address,
            reason=reason,
        )

    def upstream_for(self, policy: EgressPolicy) -> SocksUpstream | None:
        """The SOCKS5 proxy a sandbox with ``policy`` goes out through: its own, else the
        operator's (``None``: neither, its connections are made directly)."""
        return policy.socks5 or self.socks

    def forget(self, rid: str) -> None:
        """Drop the counts of a sandbox that went (so that they do not pile up forever)."""
        for key in [key for key in self.refused if key[0] == rid]:
            del self.refused[key]
            self.on_forget(*key)


class ProxyFactory(protocol.Factory):
    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy

    noisy = False

    def buildProtocol(self, addr: Any) -> "SandboxSide":
        return SandboxSide(self.proxy)


@implementer(IHalfCloseableProtocol)
class SandboxSide(protocol.Protocol):
    """A sandbox's connection: peeked, checked, then relayed to its upstream (both sockets
    are taken out of Twisted then: :mod:`.egress_relay`)."""

    def __init__(self, proxy: EgressProxy) -> None:
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
        if self.rewriter is not None:
            self._rewrite(upstream, answered)
            return
        self.relay = Relay.start(
            self.proxy.reactor,
            take_socket(self.transport),
            take_socket(upstream),
            self.buffer,
            self.read_done,
            self.release,
            answered,
        )
        self.buffer = b""

    def _rewrite(self, upstream: Any, answered: bytes) -> None:
        """The rule's path: the sandbox's requests rewritten on their way to ``upstream``,
        once decrypted when its connection is TLS (the upstream's then, too)."""
        assert self.rewriter is not None
        name, address = self.rewriter.name, self.destination[0]
        self.rule_connection, self.tls = rewritten(
            self.proxy.tls if self.terminate else None,
            self.tcp,
            upstream,
            self.rewriter,
            lambda reason: self.proxy.refuse(self.rid, reason, name, address),
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
        if self.tls is not None:  # (its plain side tells the rule connection)
            self.tls.connectionLost(reason)
        elif self.rule_connection is not None:
            self.rule_connection.sandbox_lost(reason)
        self.release()
