"""The egress proxy: where a sandbox's web traffic goes when its policy names hosts
(docs/isolation.rst, "Egress by name").

nftables redirects such a sandbox's TCP to ports 80 and 443 to this proxy's one listener
(:func:`sandboxd.isolation.network.egress_policy.policy_script`); the sandbox is known by the
source address of its veth (:meth:`Sandboxes.sandbox_at`), the address it meant to reach by
the connection's original destination (``SO_ORIGINAL_DST``). For each connection the proxy
(:class:`~sandboxd.isolation.network.egress_connection.SandboxSide`, one per connection)

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

import socket
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from attrs import define, field
from twisted.internet import protocol
from twisted.logger import Logger

from sandboxd.isolation.network.egress_connection import SandboxSide
from sandboxd.isolation.network.egress_plan import Address, Network
from sandboxd.isolation.network.egress_policy import EgressPolicy
from sandboxd.isolation.network.egress_resolve import NameCache
from sandboxd.isolation.network.egress_socks import SocksUpstream
from sandboxd.isolation.network.egress_tls import RuleTLS
from sandboxd.isolation.network.egress_upstream import Connector, PlainConnect

log = Logger()

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


ALL_INTERFACES = ("0.0.0.0", "::")


class Sandboxes(Protocol):
    """What the proxy asks of the egress mode."""

    def sandbox_at(self, address: str) -> tuple[str, EgressPolicy] | None:
        """The sandbox (its id and policy now) whose veth has ``address``, if any."""


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
    connector: Connector = PlainConnect
    """Connects the upstream of a connection that is relayed as it is."""
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

    def buildProtocol(self, addr: Any) -> SandboxSide:
        return SandboxSide(self.proxy)
