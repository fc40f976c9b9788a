"""The SOCKS5 way out, without a kernel: the settings, the client's handshake on Twisted's
memory transports (every answer a SOCKS5 proxy may give, good or bad), the egress proxy
handing connections to it (judged by address when they carry no name), the ruleset that
sends every sandbox's TCP to the proxy. The real thing, with nftables, real sandboxes and a
real SOCKS5 server: ``tests/kernel/test_egress_socks.py``."""

import ipaddress
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
from twisted.internet.testing import MemoryReactorClock, StringTransport

from sandboxd.assemble import _socks5
from sandboxd.config import Config, ConfigError
from sandboxd.isolation.network.egress import EgressNetwork
from sandboxd.isolation.network.egress_policy import parse_policy
from sandboxd.isolation.network.egress_proxy_start import egress_proxy, socks_upstream
from sandboxd.isolation.network.egress_socks import (
    HANDSHAKE_TIMEOUT,
    SocksAddress,
    SocksAttempt,
    SocksUpstream,
    connect_request,
    parse_socks_address,
)
from tests.isolation.test_isolation_egress import Host, plan
from tests.isolation.test_isolation_egress_proxy import (
    GOOD,
    Redirected,
    SandboxSide,
    Wire,
    proxy_for,
)

A = ipaddress.ip_address("203.0.113.1")
SOCKS = SocksAddress("192.0.2.80", 1080)
WITH_PASSWORD = SocksUpstream(SOCKS, b"user", b"pass")
OK_V4 = bytes([5, 0, 0, 1, 192, 0, 2, 80, 4, 56])
"""A ``CONNECT`` answered: succeeded, bound to 192.0.2.80:1080."""


def test_the_address_setting_parses_or_says_why() -> None:
    assert parse_socks_address(" 192.0.2.80:1080 ") == SOCKS
    assert parse_socks_address("socks.example:1080") == SocksAddress("socks.example", 1080)
    v6 = parse_socks_address("[2001:db8::80]:1080")
    assert v6 == SocksAddress("2001:db8::80", 1080) and str(v6) == "[2001:db8::80]:1080"
    assert str(SOCKS) == "192.0.2.80:1080"
    for bad in ("socks.example", "2001:db8::80:1080", ":1080", "[::1]", "h:0", "h:70000", "h:x"):
        with pytest.raises(ValueError):
            parse_socks_address(bad)
    with pytest.raises(ValueError):
        parse_socks_address("[not-v6]:1080")


def test_the_settings_go_together(tmp_path: Path) -> None:
    env = {"SANDBOXD_EGRESS_SOCKS5": "192.0.2.80:1080"}
    config = Config.load(env)
    assert config.egress_socks5 == SOCKS and config.egress_socks5_user is None
    assert "SANDBOXD_EGRESS_SOCKS5=192.0.2.80:1080" in config.friendly().split()
    with pytest.raises(ConfigError, match="set both or neither"):
        Config.load({**env, "SANDBOXD_EGRESS_SOCKS5_USER": "u"})
    with pytest.raises(ConfigError, match="set both or neither"):
        Config.load({**env, "SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE": "/p"})
    both = {"SANDBOXD_EGRESS_SOCKS5_USER": "u", "SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE": "/p"}
    with pytest.raises(ConfigError, match="needs SANDBOXD_EGRESS_SOCKS5"):
        Config.load(both)
    assert Config.load({**env, **both}).redacted()["SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE"] == (
        "<set>"
    )
    with pytest.raises(ConfigError, match="SANDBOXD_EGRESS_SOCKS5: 'x' is not HOST:PORT"):
        Config.load({"SANDBOXD_EGRESS_SOCKS5": "x"})


def test_the_password_is_read_from_its_file_at_start(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("pass\n")
    password.chmod(0o600)
    env = {
        "SANDBOXD_EGRESS_SOCKS5": "192.0.2.80:1080",
        "SANDBOXD_EGRESS_SOCKS5_USER": "user",
        "SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE": str(password),
    }
    assert _socks5(Config.load(env)) == WITH_PASSWORD
    assert _socks5(Config.load({})) is None
    password.chmod(0o644)
    with pytest.raises(SystemExit, match=r"egress: SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE: .* mode"):
        _socks5(Config.load(env))
    password.chmod(0o600)
    with pytest.raises(SystemExit, match="egress: SANDBOXD_EGRESS_SOCKS5_USER or _PASSWORD_FILE"):
        _socks5(Config.load({**env, "SANDBOXD_EGRESS_SOCKS5_USER": "u" * 256}))


def test_credentials_are_bounded_and_choose_the_method() -> None:
    assert SocksUpstream(SOCKS).methods == b"\x00"
    assert WITH_PASSWORD.methods == b"\x02"
    for user, password in ((b"", b"p"), (b"u", b"p" * 256)):
        with pytest.raises(ValueError, match="1 to 255 bytes"):
            SocksUpstream(SOCKS, user, password)
    config = SimpleNamespace(egress_socks5=None)
    assert socks_upstream(config, None) is None


def test_the_request_names_the_checked_address_never_a_name() -> None:
    assert connect_request(A, 443) == bytes([5, 1, 0, 1, 203, 0, 113, 1, 1, 187])
    v6 = ipaddress.ip_address("2001:db8::1")
    assert connect_request(v6, 80) == bytes([5, 1, 0, 4]) + v6.packed + b"\x00\x50"


class Outcome:
    def __init__(self) -> None:
        self.connected: list[tuple[Any, bytes]] = []
        self.failed: list[str] = []

    def on_connected(self, transport: Any, first: bytes) -> None:
        self.connected.append((transport, first))


def attempt(upstream: SocksUpstream = WITH_PASSWORD) -> tuple[Any, Any, Outcome, Any]:
    """An attempt to reach ``A:443``, connected: its client, transport, outcome, reactor."""
    reactor = MemoryReactorClock()
    outcome = Outcome()
    upstream.connect(reactor, A, 443, outcome.on_connected, outcome.failed.append)
    host, port, factory, timeout, _ = reactor.tcpClients[-1]
    assert (host, port, timeout) == ("192.0.2.80", 1080, HANDSHAKE_TIMEOUT)
    client: Any = factory.buildProtocol(None)
    transport = StringTransport()
    client.makeConnection(transport)
    return client, transport, outcome, reactor


def test_a_handshake_with_a_password_then_the_upstreams_first_bytes() -> None:
    client, transport, outcome, reactor = attempt()
    assert transport.value() == b"\x05\x01\x02"  # the password alone is offered
    transport.clear()
    client.dataReceived(b"\x05")  # a byte at a time: nothing is decided early
    client.dataReceived(b"\x02")
    assert transport.value() == b"\x01\x04user\x04pass"
    transport.clear()
    client.dataReceived(b"\x01")
    client.dataReceived(b"\x00")
    assert transport.value() == connect_request(A, 443)
    client.dataReceived(OK_V4[:4])
    client.dataReceived(OK_V4[4:] + b"SSH-2.0-banner")
    assert outcome.connected == [(transport, b"SSH-2.0-banner")] and not outcome.failed
    assert not reactor.getDelayedCalls()  # the deadline went with it
    client.connectionLost(None)  # (never, once relayed: said once anyway)
    assert not outcome.failed


@pytest.mark.parametrize(
    "bound",
    [
        bytes([4]) + ipaddress.ip_address("2001:db8::80").packed,
        bytes([3, 13]) + b"socks.example",
    ],
)
def test_without_a_password_and_any_bound_address(bound: bytes) -> None:
    client, transport, outcome, _ = attempt(SocksUpstream(SOCKS))
    assert transport.value() == b"\x05\x01\x00"
    client.dataReceived(b"\x05\x00")
    reply = bytes([5, 0, 0]) + bound + b"\x04\x38"
    client.dataReceived(reply[:-1])
    assert not outcome.connected
    client.dataReceived(reply[-1:])
    assert outcome.connected == [(transport, b"")]


@pytest.mark.parametrize(
    ("answers", "reason"),
    [
        ([b"\x04\x02"], "socks_protocol"),  # not SOCKS5
        ([b"\x05\x02junk"], "socks_protocol"),  # more than the method
        ([b"\x05\xff"], "socks_auth"),  # none of the methods offered
        ([b"\x05\x00"], "socks_auth"),  # a method not offered
        ([b"\x05\x02", b"\x01\x01"], "socks_auth"),  # the password refused
        ([b"\x05\x02", b"\x02\x00"], "socks_protocol"),
        ([b"\x05\x02", b"\x01\x00\x00"], "socks_protocol"),
        ([b"\x05\x02", b"\x01\x00", bytes([5, 5, 0, 1, 0])], "socks_refused"),
        ([b"\x05\x02", b"\x01\x00", bytes([5, 0, 0, 9, 0])], "socks_protocol"),
        ([b"\x05\x02", b"\x01\x00", bytes([4, 0, 0, 1, 0])], "socks_protocol"),
        ([b"\x05\x02", b"\x01\x00", bytes([5, 0, 1, 1, 0])], "socks_protocol"),
        ([b"HTTP/1.0 400 Bad Request\r\n\r\n"], "socks_protocol"),
    ],
)
def test_anything_but_a_connect_fails_closed(answers: list[bytes], reason: str) -> None:
    client, transport, outcome, reactor = attempt()
    for answer in answers:
        client.dataReceived(answer)
    assert outcome.failed == [reason] and not outcome.connected
    assert transport.disconnecting  # (aborted)
    assert not reactor.getDelayedCalls()
    client.connectionLost(None)  # the abort's end: told once only
    assert outcome.failed == [reason]


@pytest.mark.parametrize(
    ("answers", "reason"), [([], "socks_protocol"), ([b"\x05\x02"], "socks_auth")]
)
def test_a_hang_up_is_a_refusal(answers: list[bytes], reason: str) -> None:
    client, _, outcome, _ = attempt()
    for answer in answers:
        client.dataReceived(answer)
    client.connectionLost(None)
    assert outcome.failed == [reason]


def test_unreachable_or_too_slow() -> None:
    reactor = MemoryReactorClock()
    outcome = Outcome()
    WITH_PASSWORD.connect(reactor, A, 443, outcome.on_connected, outcome.failed.append)
    factory: Any = reactor.tcpClients[-1][2]
    factory.clientConnectionFailed(None, None)
    assert outcome.failed == ["socks_unreachable"] and not reactor.getDelayedCalls()
    slow: SocksAttempt = WITH_PASSWORD.connect(
        reactor, A, 443, outcome.on_connected, outcome.failed.append
    )
    stopped: list[bool] = []
    slow.connector = SimpleNamespace(stopConnecting=lambda: stopped.append(True))
    reactor.advance(HANDSHAKE_TIMEOUT)  # still connecting
    assert outcome.failed[-1] == "socks_timeout" and stopped == [True]
    client, transport, outcome, reactor = attempt(SocksUpstream(SOCKS))
    reactor.advance(HANDSHAKE_TIMEOUT)  # connected, never answered
    assert outcome.failed == ["socks_timeout"] and transport.disconnecting
    client.dataReceived(b"\x05\x00")  # too late: it stays failed
    client.dataReceived(OK_V4)
    assert not outcome.connected and outcome.failed == ["socks_timeout"]


def socks_proxy(policy: Any) -> tuple[Any, MemoryReactorClock]:
    proxy, reactor = proxy_for(policy)
    proxy.socks = SocksUpstream(SOCKS)
    return proxy, reactor


def redirected(proxy: Any, destination: str, port: int) -> tuple[SandboxSide, Redirected]:
    side = SandboxSide(proxy)
    transport = Redirected("10.200.0.1", destination, port)
    side.makeConnection(transport)
    return side, transport


def handshake(reactor: MemoryReactorClock, first: bytes = b"") -> Wire:
    """The SOCKS5 proxy's side of the latest attempt: connected, answered; its wire."""
    host, port, factory, _, _ = reactor.tcpClients[-1]
    assert (host, port) == ("192.0.2.80", 1080)
    client: Any = factory.buildProtocol(None)
    wire = Wire()
    client.makeConnection(wire)
    client.dataReceived(b"\x05\x00")
    client.dataReceived(OK_V4 + first)
    return wire


def test_a_connection_without_a_name_is_judged_by_address_and_handed_on() -> None:
    proxy, reactor = socks_proxy(parse_policy(None, None))
    side, transport = redirected(proxy, "203.0.113.1", 22)
    assert transport.producerState == "paused"  # not read: its bytes wait for the relay
    assert not reactor.getDelayedCalls()[1:]  # no peek's timer, only the handshake's
    wire = handshake(reactor, b"SSH-2.0-banner")
    assert transport.producerState == "taken" and side.relay is not None
    sandbox = transport.handle.peer
    assert sandbox.recv(100) == b"SSH-2.0-banner"  # what came with the answer goes first
    sandbox.sendall(b"SSH-2.0-client")
    for end in list(reactor.readers):
        end.doRead()
    assert wire.received(100) == b"SSH-2.0-client"
    assert not proxy.refused and proxy.open["a"] == 1
    side.relay.abort()
    assert not proxy.open


def test_names_are_still_read_on_the_web_ports_and_lists_still_hold() -> None:
    proxy, reactor = socks_proxy(GOOD)  # names only: no address is allowed
    side, transport = redirected(proxy, "203.0.113.1", 443)
    assert transport.producerState != "paused"  # read for its name
    side.dataReceived(b"GET / HTTP/1.1\r\nHost: good.example\r\n\r\n")
    handshake(reactor)
    assert side.relay is not None and not proxy.refused
    side.relay.abort()
    before = len(reactor.tcpClients)
    _, other_port = redirected(proxy, "203.0.113.1", 22)
    assert other_port.aborted and len(reactor.tcpClients) == before  # never asked of it
    _, host = redirected(proxy, "127.0.0.1", 22)
    assert host.aborted
    assert proxy.refused == {("a", "not_allowed"): 1, ("a", "operator_denied"): 1}


def test_a_socks_failure_resets_the_sandboxs_connection() -> None:
    proxy, reactor = socks_proxy(parse_policy(None, None))
    _, transport = redirected(proxy, "203.0.113.1", 22)
    factory: Any = reactor.tcpClients[-1][2]
    factory.clientConnectionFailed(None, None)
    assert transport.aborted and proxy.refused == {("a", "socks_unreachable"): 1}
    side, transport = redirected(proxy, "203.0.113.1", 22)
    side.connectionLost(None)  # hung up meanwhile
    wire = handshake(reactor)
    assert wire.disconnecting and side.relay is None


def test_the_ruleset_sends_every_sandboxs_tcp_to_the_proxy(tmp_path: Path) -> None:
    dns = (ipaddress.ip_address("10.96.0.10"), ipaddress.ip_address("2001:db8::53"))
    ruleset = plan(proxy_all=True, proxy_port=4711, dns=dns).ruleset("drop")
    assert 'iifname "sbx*" meta l4proto tcp ct status dnat accept' in ruleset
    assert "type nat hook prerouting priority -100; policy accept;" in ruleset
    assert "ip daddr { 10.96.0.10 } tcp dport 53 accept" in ruleset
    assert "ip6 daddr { 2001:db8::53 } tcp dport 53 accept" in ruleset
    assert 'iifname "sbx*" meta l4proto tcp redirect to :4711' in ruleset
    only_dns = (
        "th dport 53 accept\n    reject with icmpx type admin-prohibited\n    ip daddr @deny4"
    )
    assert only_dns in ruleset  # nothing forwarded after DNS
    closed = plan(proxy_all=True).ruleset("drop")  # no proxy: nothing redirected, nor out
    assert "redirect" not in closed and "proxy_all" not in closed
    assert "accept\n    reject with icmpx type admin-prohibited\n    ip daddr @deny4" in closed
    assert "proxy_all" not in plan(proxy_port=4711).ruleset("drop")
    assert "dport 53" not in plan(proxy_all=True, proxy_port=4711).ruleset("drop")
    host = Host()
    mode = EgressNetwork(host.egress(tmp_path), capacity=1)
    config = SimpleNamespace(egress_dns=(), resolv_conf="/nonexistent", egress_judge="off")
    proxy = egress_proxy(
        config, MemoryReactorClock(), mode, ("127.0.0.1",), socks=SocksUpstream(SOCKS)
    )
    assert proxy is not None and proxy.socks == SocksUpstream(SOCKS)
    assert mode.egress.plan == attrs.evolve(plan(), proxy_all=True)
