"""TLS to a sandbox's own SOCKS5 proxy, without a kernel: the ``tls`` object and its bounds,
the listing, and the egress proxy tunnelling a sandbox's connection through a SOCKS5 server
over real TLS in memory (Twisted's ``iosim``), verified against a CA the test makes, or
failing closed. The real thing (the unmodified E2B SDK, a real ``pproxy`` over TLS):
``tests/kernel/test_egress_socks_tls.py``.
"""

import datetime
import ipaddress
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import protocol
from twisted.internet.ssl import PrivateCertificate
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.test.iosim import FakeTransport, connect

from sandboxd.isolation.network.egress_policy import EgressPolicy, parse_policy
from sandboxd.isolation.network.egress_socks import (
    HANDSHAKE_TIMEOUT,
    SocksAddress,
    SocksUpstream,
)
from sandboxd.isolation.network.egress_socks_own import own_socks_json, parse_own_socks
from sandboxd.isolation.network.egress_socks_tls import (
    CA_CERT_MAX,
    E2B_NAMES,
    SocksTLS,
    parse_socks_tls,
)
from tests.isolation.test_isolation_egress_proxy import SandboxSide, proxy_for
from tests.isolation.test_isolation_egress_socks import OK_V4, redirected

SOCKS = "192.0.2.80"
SERVER_NAME = "socks.test"
Authority = tuple[ec.EllipticCurvePrivateKey, x509.Certificate]


def certificate(subject: str, issuer: Authority | None, sans: list[Any]) -> Authority:
    """A key and its certificate: a CA of its own (``issuer`` ``None``), else a leaf for
    ``sans`` signed by ``issuer``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    signer, issued_by = (key, name) if issuer is None else (issuer[0], issuer[1].subject)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issued_by)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(True, None), critical=True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(signer, hashes.SHA256())


def pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def proxy_leaf(ca: Authority, address: str) -> Authority:
    """The SOCKS5 proxy's certificate: for ``SERVER_NAME`` and the IP address ``address``."""
    sans = [x509.DNSName(SERVER_NAME), x509.IPAddress(ipaddress.ip_address(address))]
    return certificate(SERVER_NAME, ca, sans)


def leaf_pem(leaf: Authority) -> bytes:
    """The leaf's key and certificate, as one PEM."""
    key = leaf[0].private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key + leaf[1].public_bytes(serialization.Encoding.PEM)


NO_LISTS = parse_policy(None, None)
CA = certificate("test proxy CA", None, [])
OTHER_CA = certificate("someone else's CA", None, [])
TLS_ON = {"address": f"{SOCKS}:1080", "tls": {"ca_cert": pem(CA[1])}}


def test_tls_parses_from_both_spellings_and_lists_without_its_ca() -> None:
    assert parse_socks_tls(None, "t") is None and parse_socks_tls(False, "t") is None
    assert parse_socks_tls({"enabled": False}, "t") is None
    assert parse_socks_tls(True, "t") == SocksTLS()
    named = {"enabled": True, "server_name": "Socks.Test.", "ca_cert": pem(CA[1])}
    assert parse_socks_tls(named, "t") == SocksTLS(SERVER_NAME, pem(CA[1]))
    assert parse_socks_tls({"serverName": "2001:DB8::1"}, "t", E2B_NAMES) == SocksTLS("2001:db8::1")
    upstream = parse_own_socks({**TLS_ON, "tls": named}, "p")
    assert own_socks_json(upstream) == {
        "address": f"{SOCKS}:1080",
        "tls": {"enabled": True, "server_name": SERVER_NAME},
    }
    e2b = parse_own_socks(
        {"address": f"{SOCKS}:1080", "tls": {"caCert": pem(CA[1])}}, "p", E2B_NAMES
    )
    assert own_socks_json(e2b, E2B_NAMES) == {"address": f"{SOCKS}:1080", "tls": {"enabled": True}}
    assert "BEGIN" not in repr(e2b)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("yes", "t: must be true, false or an object"),
        ({"serverName": "x"}, "t: unknown field 'serverName'"),
        ({"enabled": "yes"}, "t.enabled: must be true or false"),
        ({"enabled": False, "server_name": "a.test"}, "t: takes no other field"),
        ({"server_name": ""}, "t.server_name: must be a string of 1 to 253"),
        ({"server_name": "a" * 254}, "t.server_name: must be a string of 1 to 253"),
        ({"server_name": 7}, "t.server_name: must be a string"),
        ({"server_name": "not a name"}, "t.server_name: not a host name or an IP address"),
        ({"ca_cert": 7}, "t.ca_cert: must be PEM of 1 to 8192 bytes"),
        ({"ca_cert": "x" * (CA_CERT_MAX + 1)}, "t.ca_cert: must be PEM of 1 to 8192 bytes"),
        ({"ca_cert": "not PEM"}, "t.ca_cert: holds no PEM certificate"),
    ],
)
def test_what_tls_cannot_be_is_named(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_socks_tls(value, "t")


def test_without_a_ca_the_hosts_trust_store_is_used() -> None:
    assert SocksTLS().trust() is not None
    factory = SocksTLS(SERVER_NAME).client_factory(SOCKS, protocol.ClientFactory(), None)
    assert isinstance(factory, TLSMemoryBIOFactory)


def test_a_proxys_client_options_are_made_once() -> None:
    """The trust store read and the context made at the first connection serve the next."""
    tls = SocksTLS(SERVER_NAME, pem(CA[1]))
    assert tls.options(SOCKS) is tls.options(SOCKS)
    assert tls == SocksTLS(SERVER_NAME, pem(CA[1]))  # (what was made is not its value)


class FakeSocksServer(protocol.Protocol):
    """A SOCKS5 server: no method asked, every ``CONNECT`` succeeds; then it answers each
    chunk upper-cased, and records whether its client closed."""

    def __init__(self) -> None:
        self.stage = 0
        self.received = b""
        self.tunnelled = b""
        self.closed = False

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        if self.stage < 2:
            self.stage += 1
            self.transport.write(b"\x05\x00" if self.stage == 1 else OK_V4 + b"hi ")  # type: ignore[union-attr]
            return
        self.tunnelled += data
        self.transport.write(data.upper())  # type: ignore[union-attr]

    def connectionLost(self, reason: Any = None) -> None:
        self.closed = True


@attrs.define
class Tunnel:
    """A sandbox's connection through a SOCKS5 server (see :func:`tunnel`)."""

    side: SandboxSide
    transport: Any
    """The sandbox's connection (a ``StringTransport``)."""
    server: FakeSocksServer
    proxy: Any
    wire: Any
    """The daemon's connection to the SOCKS5 server (iosim's ``FakeTransport``)."""
    flush: Callable[[], None]
    """Move what can move between the daemon and the server, with the TLS layers' writes."""
    reactor: Any


def tunnel(
    ca: Authority | None, tls: SocksTLS, policy: EgressPolicy = NO_LISTS, first: bytes = b""
) -> Tunnel:
    """A sandbox's connection to 203.0.113.1 (port 22; 80 when it sends ``first``, which
    carries its name) through a SOCKS5 server over TLS whose certificate ``ca`` signed
    (``None``: a server speaking SOCKS5 in the clear), the sandbox's ``policy`` asking
    ``tls``."""
    policy = attrs.evolve(policy, socks5=SocksUpstream(SocksAddress(SOCKS, 1080), tls=tls))
    proxy, reactor = proxy_for(policy)
    side, transport = redirected(proxy, "203.0.113.1", 80 if first else 22)
    if first:
        side.dataReceived(first)
    host, port, factory, _, _ = reactor.tcpClients[-1]
    assert (host, port) == (SOCKS, 1080)
    server = FakeSocksServer()
    server_side: Any = server
    if ca is not None:
        options = PrivateCertificate.loadPEM(leaf_pem(proxy_leaf(ca, SOCKS))).options()
        server_tls = TLSMemoryBIOFactory(
            options, False, protocol.Factory.forProtocol(lambda: server), clock=reactor
        )
        server_side = server_tls.buildProtocol(None)
    client = factory.buildProtocol(None)
    wire = FakeTransport(client, False)
    pump = connect(
        server_side, FakeTransport(server_side, True), client, wire, greet=False, clock=reactor
    )

    def flush() -> None:
        for _ in range(10):
            reactor.advance(0)
            pump.flush()

    flush()
    return Tunnel(side, transport, server, proxy, wire, flush, reactor)


@pytest.mark.parametrize("server_name", [SERVER_NAME, None])
def test_a_connection_is_tunnelled_inside_verified_tls(server_name: str | None) -> None:
    t = tunnel(CA, SocksTLS(server_name, pem(CA[1])))
    assert not t.proxy.refused and t.side.rule_connection is not None
    assert t.transport.value() == b"hi "  # what came with the answer goes first
    t.side.dataReceived(b"ping")
    t.flush()
    assert t.server.tunnelled == b"ping" and t.transport.value() == b"hi PING"
    t.side.readConnectionLost()  # the sandbox's half-close: a close_notify, which ends the
    t.flush()  # server's side, then the sandbox's
    assert t.server.closed and t.transport.disconnecting
    assert not t.proxy.refused
    t.side.connectionLost(None)
    assert not t.proxy.open


def test_a_header_rule_applies_inside_the_tunnel() -> None:
    rules = {"good.example": [{"headers": {"X-Key": "k"}}]}
    request = b"GET / HTTP/1.1\r\nHost: good.example\r\n\r\n"
    t = tunnel(CA, SocksTLS(None, pem(CA[1])), parse_policy(["good.example"], None, rules), request)
    assert not t.proxy.refused
    assert t.server.tunnelled == b"GET / HTTP/1.1\r\nHost: good.example\r\nX-Key: k\r\n\r\n"
    t.side.dataReceived(b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n")
    assert t.proxy.refused == {("a", "host_changed"): 1} and t.transport.aborted


def test_a_side_that_cannot_keep_up_pauses_the_other() -> None:
    t = tunnel(CA, SocksTLS(None, pem(CA[1])))
    t.wire.producer.pauseProducing()  # the upstream's socket is full
    assert t.transport.producerState == "paused"  # the sandbox's is no longer read
    t.wire.producer.resumeProducing()
    assert t.transport.producerState == "producing"
    wire: list[str] = []
    t.wire.pauseProducing = lambda: wire.append("paused")
    t.wire.resumeProducing = lambda: wire.append("resumed")
    t.transport.producer.pauseProducing()  # the sandbox's socket is full: the proxy's is
    t.transport.producer.resumeProducing()  # no longer read, until it has room again
    assert wire == ["paused", "resumed"]


def test_another_cas_certificate_fails_closed() -> None:
    t = tunnel(OTHER_CA, SocksTLS(None, pem(CA[1])))
    assert t.transport.aborted and t.side.rule_connection is None
    assert t.proxy.refused == {("a", "socks_tls"): 1}
    assert t.server.stage == 0  # no SOCKS5 byte, no credential, ever reached it


def test_a_proxy_without_tls_is_never_spoken_to_in_the_clear() -> None:
    t = tunnel(None, SocksTLS(None, pem(CA[1])))
    t.reactor.advance(HANDSHAKE_TIMEOUT)  # its SOCKS5 answer is no TLS: never a handshake
    assert t.transport.aborted and t.side.rule_connection is None
    assert t.proxy.refused == {("a", "socks_timeout"): 1}
    assert t.server.received[:1] == b"\x16"  # a TLS handshake, never SOCKS5's greeting
    assert b"\x05\x01\x00" not in t.server.received


def test_a_refused_tunnel_sends_no_close() -> None:
    t = tunnel(CA, SocksTLS(None, pem(CA[1])))
    assert t.side.rule_connection is not None
    t.side.rule_connection.refused = True
    t.side.rule_connection.sandbox_ended()
    t.flush()
    assert not t.server.closed
