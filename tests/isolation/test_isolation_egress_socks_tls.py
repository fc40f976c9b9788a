"""TLS to a sandbox's own SOCKS5 proxy, without a kernel: the ``tls`` object and its bounds,
the listing, and the egress proxy tunnelling a sandbox's connection through a SOCKS5 server
over real TLS in memory (Twisted's ``iosim``), verified against a CA the test makes, or
failing closed. The real thing (the unmodified E2B SDK, a real ``pproxy`` over TLS):
``tests/kernel/test_egress_socks_tls.py``.
"""

import datetime
import ipaddress
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

from sandboxd.isolation.network.egress_policy import parse_policy
from sandboxd.isolation.network.egress_socks import SocksAddress, SocksUpstream
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


class FakeSocksServer(protocol.Protocol):
    """A SOCKS5 server: no method asked, every ``CONNECT`` succeeds; then it answers each
    chunk upper-cased, and records whether its client closed."""

    def __init__(self) -> None:
        self.stage = 0
        self.tunnelled = b""
        self.closed = False

    def dataReceived(self, data: bytes) -> None:
        if self.stage < 2:
            self.stage += 1
            self.transport.write(b"\x05\x00" if self.stage == 1 else OK_V4 + b"hi ")  # type: ignore[union-attr]
            return
        self.tunnelled += data
        self.transport.write(data.upper())  # type: ignore[union-attr]

    def connectionLost(self, reason: Any = None) -> None:
        self.closed = True


def tunnel(ca: Authority, tls: SocksTLS) -> tuple[SandboxSide, Any, FakeSocksServer, Any]:
    """A sandbox's connection to 203.0.113.1:22 through a SOCKS5 server over TLS whose
    certificate ``ca`` signed, the sandbox's policy asking ``tls``: its side, transport, the
    server, and a pump that moves the bytes between the daemon and the server."""
    policy = attrs.evolve(
        parse_policy(None, None), socks5=SocksUpstream(SocksAddress(SOCKS, 1080), tls=tls)
    )
    proxy, reactor = proxy_for(policy)
    side, transport = redirected(proxy, "203.0.113.1", 22)
    host, port, factory, _, _ = reactor.tcpClients[-1]
    assert (host, port) == (SOCKS, 1080)
    server = FakeSocksServer()
    options = PrivateCertificate.loadPEM(leaf_pem(proxy_leaf(ca, SOCKS))).options()
    server_tls = TLSMemoryBIOFactory(
        options, False, protocol.Factory.forProtocol(lambda: server), clock=reactor
    )
    server_side = server_tls.buildProtocol(None)
    client = factory.buildProtocol(None)
    pump = connect(
        server_side,
        FakeTransport(server_side, True),
        client,
        FakeTransport(client, False),
        greet=False,
        clock=reactor,
    )

    def flush() -> None:
        for _ in range(10):
            reactor.advance(0)
            pump.flush()

    flush()
    return side, transport, server, (proxy, flush)


@pytest.mark.parametrize("server_name", [SERVER_NAME, None])
def test_a_connection_is_tunnelled_inside_verified_tls(server_name: str | None) -> None:
    side, transport, server, (proxy, flush) = tunnel(CA, SocksTLS(server_name, pem(CA[1])))
    assert not proxy.refused and side.rule_connection is not None
    assert transport.value() == b"hi "  # what came with the answer goes first
    side.dataReceived(b"ping")
    flush()
    assert server.tunnelled == b"ping" and transport.value() == b"hi PING"
    side.readConnectionLost()  # the sandbox's half-close: a close_notify, which ends the
    flush()  # server's side, then the sandbox's
    assert server.closed and transport.disconnecting
    assert not proxy.refused
    side.connectionLost(None)
    assert not proxy.open


def test_another_cas_certificate_fails_closed() -> None:
    side, transport, server, (proxy, _) = tunnel(OTHER_CA, SocksTLS(None, pem(CA[1])))
    assert transport.aborted and side.rule_connection is None
    assert proxy.refused == {("a", "socks_tls"): 1}
    assert server.stage == 0  # no SOCKS5 byte, no credential, ever reached it


def test_a_refused_tunnel_sends_no_close() -> None:
    side, _, server, (_, flush) = tunnel(CA, SocksTLS(None, pem(CA[1])))
    assert side.rule_connection is not None
    side.rule_connection.refused = True
    side.rule_connection.sandbox_ended()
    flush()
    assert not server.closed
