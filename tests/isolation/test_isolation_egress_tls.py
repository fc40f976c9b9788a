"""Header rules over TLS without a kernel: the proxy's course on Twisted's memory transports,
with real TLS on both sides (Python's ``ssl`` as the sandbox's client, pyOpenSSL as the
upstream's server): the upstream verified before the sandbox is shown anything, the sandbox's
requests decrypted and given the rule's header, the answers passed back; an upstream that
does not verify refused. The real thing: ``tests/kernel/test_egress_rules_tls.py``."""

import contextlib
import os
import ssl
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from OpenSSL import SSL
from twisted.internet.error import ConnectionLost
from twisted.internet.ssl import Certificate, trustRootFromCertificates
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from sandboxd.isolation.namespaces.identity_files import HostBundle
from sandboxd.isolation.network.egress import EgressNetwork
from sandboxd.isolation.network.egress_ca import CA_DIR, EgressCA
from sandboxd.isolation.network.egress_policy import parse_policy
from sandboxd.isolation.network.egress_proxy_start import egress_proxy, rule_tls
from sandboxd.isolation.network.egress_tls import RuleTLS, upstream_trust
from sandboxd.undo import StartupUndo
from tests.isolation.test_isolation_egress import Host
from tests.isolation.test_isolation_egress_proxy import connect, proxy_for
from tests.isolation.test_isolation_egress_rules import Upstream

SECRET = "Bearer tls-s3cr3t"
RULED_RULES = {"good.example": [{"headers": {"X-Key": SECRET}}]}
RULED = parse_policy(["good.example"], None, RULED_RULES)


def a_ca(path: Path) -> EgressCA:
    clock = Clock()
    clock.advance(time.time())  # (the clients check certificates on their own clock)
    return EgressCA.of_root(str(path), clock)


class Server:
    """The upstream: a TLS server in memory with ``ca``'s leaf for ``name``."""

    def __init__(self, ca: EgressCA, name: str) -> None:
        self.tls = SSL.Connection(ca.options_for(name).getContext(), None)
        self.tls.set_app_data(SimpleNamespace(factory=SimpleNamespace(wrappedFactory=None)))
        self.tls.set_accept_state()

    def take(self, data: bytes) -> bytes:
        """Read ``data`` (what came over the wire); what it sends back, and its plain bytes
        in :attr:`got`."""
        self.tls.bio_write(data)
        self.got = b""
        try:
            self.tls.do_handshake()
            while True:
                self.got += self.tls.recv(65536)
        except (SSL.WantReadError, SSL.Error):
            pass
        try:
            return bytes(self.tls.bio_read(65536))
        except SSL.WantReadError:
            return b""


class Client:
    """The sandbox's HTTPS client, trusting ``pem`` alone, asking for ``name``."""

    def __init__(self, pem: bytes, name: str) -> None:
        context = ssl.create_default_context(cadata=pem.decode())
        context.set_alpn_protocols(["h2", "http/1.1"])
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname=name)

    def take(self, data: bytes) -> bytes:
        self.incoming.write(data)
        with contextlib.suppress(ssl.SSLWantReadError):
            self.tls.do_handshake()
        return self.outgoing.read()


def tls_rule_connection(tmp_path: Path, upstream_name: str) -> Any:
    """A sandbox's TLS connection to good.example through the proxy, to an upstream whose
    leaf is for ``upstream_name``: the pieces, the upstream's handshake pumped to its end."""
    ours, theirs = a_ca(tmp_path / "daemon"), a_ca(tmp_path / "upstream")
    proxy, reactor = proxy_for(RULED)
    trust = trustRootFromCertificates([Certificate.loadPEM(theirs.pem)])
    proxy.tls = RuleTLS(ours, trust, reactor)
    side, transport = connect(proxy)
    client = Client(ours.pem, "good.example")
    side.dataReceived(client.take(b""))
    assert transport.value() == b""  # (nothing shown the sandbox before the upstream is up)
    factory = reactor.tcpClients[0][2]
    wire = Upstream()
    tls_upstream: Any = factory.buildProtocol(None)
    tls_upstream.makeConnection(wire)
    server = Server(theirs, upstream_name)
    for _ in range(5):
        reactor.advance(0)
        sent = wire.value()
        wire.clear()
        answer = server.take(sent) if sent else b""
        if answer:
            tls_upstream.dataReceived(answer)
    return SimpleNamespace(**locals())


def pump(pieces: Any) -> None:
    """Move what is written on either side, until nothing moves."""
    for _ in range(10):
        pieces.reactor.advance(0)
        to_client, to_server = pieces.transport.value(), pieces.wire.value()
        pieces.transport.clear()
        pieces.wire.clear()
        if to_client:
            sent = pieces.client.take(to_client)
            if sent:
                pieces.side.dataReceived(sent)
        answer = pieces.server.take(to_server) if to_server else b""
        if answer:
            pieces.tls_upstream.dataReceived(answer)


def test_a_rule_over_tls_is_terminated_and_its_header_set(tmp_path: Path) -> None:
    pieces = tls_rule_connection(tmp_path, "good.example")
    pump(pieces)
    assert pieces.client.tls.selected_alpn_protocol() == "http/1.1"
    pieces.client.tls.write(b"GET /x HTTP/1.1\r\nHost: good.example\r\nX-Key: mine\r\n\r\n")
    pieces.side.dataReceived(pieces.client.outgoing.read())
    pump(pieces)
    assert f"X-Key: {SECRET}\r\n".encode() in pieces.server.got
    assert b"mine" not in pieces.server.got
    assert pieces.server.got.startswith(b"GET /x HTTP/1.1\r\n")
    pieces.server.tls.send(b"HTTP/1.1 204 No Content\r\n\r\n")
    pieces.tls_upstream.dataReceived(pieces.server.tls.bio_read(65536))
    pump(pieces)
    assert pieces.client.tls.read(1000) == b"HTTP/1.1 204 No Content\r\n\r\n"
    assert not pieces.proxy.refused
    pieces.side.connectionLost(None)
    assert pieces.wire.disconnecting or pieces.wire.aborted


def test_an_upstream_that_does_not_verify_is_refused(tmp_path: Path) -> None:
    pieces = tls_rule_connection(tmp_path, "other.example")
    assert pieces.wire.aborted  # (the upstream's TLS refused it: its TCP goes)
    pieces.tls_upstream.connectionLost(Failure(ConnectionLost()))
    assert pieces.transport.aborted and pieces.transport.value() == b""
    assert pieces.proxy.refused == {("a", "upstream_tls"): 1}


@pytest.mark.parametrize("whose", ["operator's", "sandbox's own"])
def test_without_a_ca_or_through_socks_a_rule_over_tls_is_refused(
    tmp_path: Path, whose: str
) -> None:
    if whose == "operator's":
        proxy, _ = proxy_for(RULED)
        proxy.socks = object()  # type: ignore[assignment]
    else:
        own = {"address": "198.18.0.1:1080"}
        proxy, _ = proxy_for(parse_policy(["good.example"], None, RULED_RULES, own))
    proxy.tls = RuleTLS(a_ca(tmp_path), None, Clock())
    side, transport = connect(proxy)
    side.dataReceived(Client(proxy.tls.ca.pem, "good.example").take(b""))
    assert transport.aborted and proxy.refused == {("a", "rule_over_tls"): 1}


def test_the_upstreams_trust_is_the_hosts_or_the_operators_bundle(tmp_path: Path) -> None:
    assert upstream_trust(None) is not None
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(a_ca(tmp_path / "one").pem + a_ca(tmp_path / "two").pem)
    assert len(upstream_trust(str(bundle))._caCerts) == 2
    bundle.write_bytes(b"")
    with pytest.raises(ValueError):
        upstream_trust(str(bundle))


def test_the_daemon_makes_its_ca_and_gives_the_proxy_the_means(tmp_path: Path) -> None:
    clock, undo = Clock(), StartupUndo()
    config = SimpleNamespace(root=str(tmp_path), egress_upstream_ca=None)
    tls = rule_tls(config, clock, undo)
    assert (tmp_path / CA_DIR / "key.pem").exists() and tls.clock is clock
    again = StartupUndo()
    assert rule_tls(config, clock, again).ca.pem == tls.ca.pem  # (read again at a restart)
    again.run()  # (a start that fails keeps a CA it did not make)
    assert (tmp_path / CA_DIR).exists()
    undo.run()  # (the first start's failing: it leaves nothing)
    assert not (tmp_path / CA_DIR).exists()


def test_only_a_sandbox_with_a_rule_gets_the_ca_beside_the_hosts_bundle(tmp_path: Path) -> None:
    mode = EgressNetwork(Host().egress(tmp_path), capacity=1)
    config = SimpleNamespace(egress_dns=(), resolv_conf="/nonexistent", egress_judge="off")
    assert mode.trust_bundle(RULED) == b""  # (no CA: no termination, nothing to trust)
    config_tls = SimpleNamespace(root=str(tmp_path), egress_upstream_ca=None)
    tls = rule_tls(config_tls, Clock(), StartupUndo())
    assert egress_proxy(config, Clock(), mode, ("127.0.0.1",), tls=tls) is not None
    assert mode.trusted == tls.ca.pem
    mode.host_bundle = HostBundle(str(tmp_path / "bundle.crt"))
    assert mode.trust_bundle(RULED) == tls.ca.pem  # (a host without a bundle)
    assert mode.trust_bundle(parse_policy(["good.example"], None)) == b""
    (tmp_path / "bundle.crt").write_bytes(b"HOST CAS")
    assert mode.trust_bundle(parse_policy(["good.example"], None)) == b"HOST CAS"
    assert mode.trust_bundle(RULED) == b"HOST CAS\n" + tls.ca.pem
    assert mode.trust_bundle(RULED, b"TEMPLATE'S") == b"TEMPLATE'S\n" + tls.ca.pem
    # read once: the same file unchanged (inode, size, time) is not read again...
    bundle = tmp_path / "bundle.crt"
    seen = bundle.stat()
    with open(bundle, "r+b") as f:
        f.write(b"SAME SIZ")
    os.utime(bundle, ns=(seen.st_atime_ns, seen.st_mtime_ns))
    assert mode.trust_bundle(parse_policy(["good.example"], None)) == b"HOST CAS"
    bundle.write_bytes(b"NEW HOST CAS")  # ...a changed one is
    assert mode.trust_bundle(parse_policy(["good.example"], None)) == b"NEW HOST CAS"
