"""Header rules over HTTPS (docs/isolation.rst, "Header rules over HTTPS"): the egress proxy
terminates the TLS of a connection whose name (its SNI) has a rule for its sandbox.

The upstream is connected first, as a TLS client (:meth:`RuleTLS.client_factory`): its
certificate must verify for the name against the host's trust store, or the operator's CA
bundle (``SANDBOXD_EGRESS_UPSTREAM_CA``, :func:`upstream_trust`); else the sandbox's
connection is refused (``upstream_tls``, :mod:`.egress_upstream`) before it is shown any
certificate. Then the sandbox's side is given a TLS server (:meth:`RuleTLS.server_for`) with
the leaf the daemon's CA (:mod:`.egress_ca`) signed for the name, fed the ClientHello the
proxy peeked first; what it decrypts goes through the same
:class:`~sandboxd.isolation.network.egress_rewrite.RuleConnection` as plain HTTP, and
only ``http/1.1`` is offered by ALPN on both sides (the rewriter speaks HTTP/1.1 alone).

Only sandboxes whose policy has a rule trust the CA (docs/isolation.rst); to any other, a
leaf of it is a stranger's certificate, and the rule's name never appears in its policy.
"""

from collections.abc import Callable
from typing import Any, cast

from attrs import frozen
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from twisted.internet import protocol
from twisted.internet.ssl import (
    Certificate,
    optionsForClientTLS,
    platformTrust,
    trustRootFromCertificates,
)
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol

from sandboxd.isolation.network.egress_ca import ALPN, EgressCA
from sandboxd.isolation.network.egress_rewrite import RequestRewriter, RuleConnection


def upstream_trust(bundle: str | None) -> Any:
    """What an upstream's certificate must chain to: the host's trust store (``bundle``
    ``None``), else the certificates of the PEM file ``bundle`` alone; ``ValueError`` when
    it holds none."""
    if bundle is None:
        return platformTrust()
    with open(bundle, "rb") as f:
        found = x509.load_pem_x509_certificates(f.read())
    return trustRootFromCertificates(
        [Certificate.loadPEM(cert.public_bytes(serialization.Encoding.PEM)) for cert in found]
    )


class PlainSide(protocol.Protocol):
    """What a sandbox's TLS carries, decrypted: given to ``received``, its end to ``lost``
    (set by the proxy once its rule connection is made)."""

    def __init__(self) -> None:
        self.received: Callable[[bytes], None] = lambda data: None
        self.lost: Callable[[Any], None] = lambda reason: None

    def dataReceived(self, data: bytes) -> None:
        self.received(data)

    def connectionLost(self, reason: Any = None) -> None:
        self.lost(reason)


@frozen
class RuleTLS:
    """The proxy's means to terminate TLS: the daemon's ``ca``, the upstreams' ``trust``
    (:func:`upstream_trust`), and the ``clock`` the TLS layers batch their writes on."""

    ca: EgressCA
    trust: Any
    clock: Any

    def client_factory(self, name: str, wrapped: protocol.ClientFactory) -> TLSMemoryBIOFactory:
        """``wrapped``'s connections made TLS clients of ``name``, verified (see the module)."""
        options = optionsForClientTLS(name, trustRoot=self.trust, acceptableProtocols=ALPN)
        return TLSMemoryBIOFactory(options, True, wrapped, clock=self.clock)

    def server_for(self, name: str, sandbox: Any) -> TLSMemoryBIOProtocol:
        """A TLS server with the leaf of ``name`` on the sandbox's TCP transport ``sandbox``;
        its plain side is a :class:`PlainSide` (``wrappedProtocol``). The transport's own
        protocol passes it what it reads, the peeked ClientHello first."""
        factory = TLSMemoryBIOFactory(
            self.ca.options_for(name), False, protocol.Factory(), clock=self.clock
        )
        tls = TLSMemoryBIOProtocol(factory, PlainSide())
        tls.makeConnection(sandbox)
        return tls


def rewritten(
    tls: RuleTLS | None, sandbox: Any, upstream: Any, rewriter: RequestRewriter, on_refused: Any
) -> tuple[RuleConnection, TLSMemoryBIOProtocol | None]:
    """The rule connection between the sandbox's TCP transport ``sandbox`` and ``upstream``:
    with ``tls``, between the TLS server :meth:`RuleTLS.server_for` puts on ``sandbox`` (also
    given, to be fed what the sandbox sends) and ``upstream``'s TLS layer."""
    if tls is None:
        return RuleConnection(sandbox, upstream, rewriter, on_refused), None
    server = tls.server_for(rewriter.name, sandbox)
    connection = RuleConnection(
        server,
        upstream,
        rewriter,
        on_refused,
        lambda reader: setattr(upstream, "wrappedProtocol", reader),
    )
    plain = cast(PlainSide, server.wrappedProtocol)
    plain.received, plain.lost = connection.from_sandbox, connection.sandbox_lost
    return connection, server
