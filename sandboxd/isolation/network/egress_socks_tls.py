"""TLS to a sandbox's own SOCKS5 proxy (docs/isolation.rst, "A sandbox's own SOCKS5 proxy"),
E2B's ``egressProxy.tls``.

``tls: true``, or an object ``{"enabled": true, "server_name": ..., "ca_cert": ...}``
(E2B's spelling: ``serverName``, ``caCert``, :data:`E2B_NAMES`), makes
the connection to the proxy a TLS client (:meth:`SocksTLS.client_factory`): the SOCKS5
handshake, the user name and password, and the tunnel all run inside it. The proxy's
certificate is always verified, TLS 1.2 or newer, for ``server_name`` (also sent as SNI), or
when it is absent for the address's IP address (an IP SAN; no SNI). ``ca_cert`` (PEM, at
most :data:`CA_CERT_MAX` bytes) replaces the host's trust store. A proxy whose certificate
does not verify fails the attempt (``socks_tls``): nothing is ever sent in the clear.

The tunnel's bytes cannot be spliced in the kernel (they cross the TLS layer): it is a
:class:`SocksTunnel`, the two Twisted transports each the producer of the other, so at most
a transport's buffer and one read are held each way. A sandbox's half-close reaches the proxy
as a TLS ``close_notify``; the proxy's answers are read on until it closes.
"""

import ipaddress
from typing import Any

from attrs import field, frozen
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from twisted.internet.ssl import (
    Certificate,
    TLSVersion,
    optionsForClientTLS,
    platformTrust,
    trustRootFromCertificates,
)
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol

from sandboxd.isolation.network.egress_names import normal_name
from sandboxd.isolation.network.egress_rewrite import RequestRewriter, RuleConnection

NAMES = ("server_name", "ca_cert")
"""The object's fields, as the native API spells them."""

E2B_NAMES = ("serverName", "caCert")
"""The same, as E2B's API spells them."""

SERVER_NAME_MAX = 253
"""The longest ``server_name`` (a DNS name's most)."""

CA_CERT_MAX = 8192
"""The longest ``ca_cert``, in bytes of PEM."""


@frozen
class SocksTLS:
    """TLS to the SOCKS5 proxy: the name its certificate must have (``None``: its address)
    and the PEM certificates it must chain to (``None``: the host's trust store)."""

    server_name: str | None = None
    ca_cert: str | None = field(default=None, repr=False)
    _options: dict[str, Any] = field(factory=dict, init=False, eq=False, repr=False)
    """The client options made, by proxy host (one per policy's proxy: its address)."""

    def trust(self) -> Any:
        """What the proxy's certificate must chain to."""
        if self.ca_cert is None:
            return platformTrust()
        return trustRootFromCertificates(
            [Certificate.loadPEM(pem) for pem in certificates(self.ca_cert)]
        )

    def options(self, host: str) -> Any:
        """The client options of a verified connection to the proxy at ``host``: made at its
        first connection (the trust store read, the context made), then kept for the next."""
        made = self._options.get(host)
        if made is None:
            made = self._options[host] = optionsForClientTLS(
                self.server_name or host,
                trustRoot=self.trust(),
                extraCertificateOptions={"raiseMinimumTo": TLSVersion.TLSv1_2},
            )
        return made

    def client_factory(self, host: str, wrapped: Any, clock: Any) -> TLSMemoryBIOFactory:
        """``wrapped``'s connections to the proxy at ``host`` made verified TLS clients."""
        return TLSMemoryBIOFactory(self.options(host), True, wrapped, clock=clock)


def certificates(pem: str) -> list[bytes]:
    """The certificates of ``pem``, each as PEM; ``ValueError`` when it holds none."""
    found = x509.load_pem_x509_certificates(pem.encode())
    return [cert.public_bytes(serialization.Encoding.PEM) for cert in found]


def parse_socks_tls(value: object, where: str, names: tuple[str, str] = NAMES) -> SocksTLS | None:
    """A request's ``tls``: ``None`` when off (absent, ``false``, ``{"enabled": false}``),
    else its :class:`SocksTLS`; ``ValueError`` naming the field (``where`` is ``tls``'s,
    ``names`` how the server name and CA fields are spelt)."""
    if value is None or isinstance(value, bool):
        return SocksTLS() if value else None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: must be true, false or an object")
    unknown = sorted(set(value) - {"enabled", *names})
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}")
    enabled = value.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"{where}.enabled: must be true or false")
    name, ca = value.get(names[0]), value.get(names[1])
    if not enabled:
        if name is not None or ca is not None:
            raise ValueError(f"{where}: takes no other field when enabled is false")
        return None
    return SocksTLS(_server_name(name, f"{where}.{names[0]}"), _ca_cert(ca, f"{where}.{names[1]}"))


def _server_name(name: object, where: str) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not 0 < len(name) <= SERVER_NAME_MAX:
        raise ValueError(f"{where}: must be a string of 1 to {SERVER_NAME_MAX} characters")
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    try:
        return normal_name(name)
    except ValueError:
        raise ValueError(f"{where}: not a host name or an IP address") from None


def _ca_cert(ca: object, where: str) -> str | None:
    if ca is None:
        return None
    if not isinstance(ca, str) or not 0 < len(ca.encode()) <= CA_CERT_MAX:
        raise ValueError(f"{where}: must be PEM of 1 to {CA_CERT_MAX} bytes")
    try:
        certificates(ca)
    except ValueError:
        raise ValueError(f"{where}: holds no PEM certificate") from None
    return ca


def socks_tls_json(tls: SocksTLS, names: tuple[str, str] = NAMES) -> dict[str, Any]:
    """``tls`` as a listing shows it (as E2B's ``SandboxEgressProxyTLSInfo``): on, and its
    server name when given; never the CA."""
    shown: dict[str, Any] = {"enabled": True}
    if tls.server_name is not None:
        shown[names[0]] = tls.server_name
    return shown


class Unchanged(RequestRewriter):
    """A tunnel's bytes, passed on as they are (no header rule applies)."""

    def __init__(self) -> None:
        super().__init__("", ())

    def feed(self, data: bytes) -> bytes:
        return data


class SocksTunnel(RuleConnection):
    """A sandbox's connection and its tunnel through a SOCKS5 proxy over TLS (see the
    module): ``upstream`` is the TLS layer, the SOCKS5 handshake done; its bytes pass
    through ``rewriter`` (:class:`Unchanged` without a header rule)."""

    def __init__(
        self, sandbox: Any, upstream: TLSMemoryBIOProtocol, rewriter: Any, on_refused: Any
    ) -> None:
        super().__init__(
            sandbox,
            upstream,
            rewriter,
            on_refused,
            lambda reader: setattr(upstream, "wrappedProtocol", reader),
        )

    def sandbox_ended(self) -> None:
        """The sandbox said all it will: a ``close_notify`` to the proxy (the TLS layer
        sends it once its producer is gone), which is still read until it closes."""
        if not self.refused:
            self.upstream.unregisterProducer()
            self.upstream.loseConnection()
