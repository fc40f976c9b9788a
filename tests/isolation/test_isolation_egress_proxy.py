"""The egress proxy's logic, without a kernel: verdicts by name and address, the nameserver
setting, the mode telling sandboxes by address, and one connection's course (peek, resolve,
refuse or splice with flow control) on Twisted's memory transports. The real thing, with
nftables redirecting real sandboxes' connections: ``tests/kernel/test_egress_names.py``."""

import ipaddress
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.names import dns

from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.network.egress import EgressNetwork
from sandboxd.isolation.network.egress_connection import (
    PEEK_TIMEOUT,
    SandboxSide,
    original_destination,
)
from sandboxd.isolation.network.egress_plan import parse_dns_servers
from sandboxd.isolation.network.egress_policy import (
    EgressPolicy,
    parse_policy,
    policy_script,
)
from sandboxd.isolation.network.egress_proxy import EgressProxy, total_for
from sandboxd.isolation.network.egress_proxy_start import descriptor_limit, egress_proxy
from sandboxd.isolation.network.egress_resolve import answer_addresses
from sandboxd.isolation.network.egress_verdict import operator_denied, refusal
from tests.isolation.test_isolation_egress import Host, plan
from tests.isolation.test_isolation_egress_names import client_hello

A = ipaddress.ip_address("203.0.113.1")
B = ipaddress.ip_address("203.0.113.2")


def never_host(address: object) -> bool:
    return False


def test_verdicts_operator_first_deny_wins_and_e2bs_exceptions() -> None:
    denied = operator_denied(plan())
    p = parse_policy(["good.example", "*.good.example", "198.51.100.0/24"], ["bad.good.example"])
    assert refusal(p, "good.example", A, denied, never_host) is None
    assert refusal(p, "api.good.example", A, denied, never_host) is None
    assert refusal(p, "bad.good.example", A, denied, never_host) == "denied"
    assert refusal(p, "other.example", A, denied, never_host) == "not_allowed"
    by_address = ipaddress.ip_address("198.51.100.9")
    assert refusal(p, "other.example", by_address, denied, never_host) is None
    for address in ("127.0.0.1", "169.254.169.254", "10.200.0.5", "::1"):
        rebound = ipaddress.ip_address(address)
        assert refusal(p, "good.example", rebound, denied, never_host) == "operator_denied"
    assert refusal(p, "good.example", A, denied, lambda a: True) == "operator_denied"
    only_deny = parse_policy(None, ["bad.example", "203.0.113.2"])
    assert refusal(only_deny, "any.example", A, denied, never_host) is None
    assert refusal(only_deny, "any.example", B, denied, never_host) == "denied"
    e2b = EgressPolicy((), (ipaddress.ip_network("0.0.0.0/0"),), True, ("good.example",), ())
    assert refusal(e2b, "good.example", A, denied, never_host) is None
    assert refusal(e2b, "other.example", A, denied, never_host) == "denied"
    assert refusal(EgressPolicy((), (), True, (), ("x.example",)), "y.example", A, denied) is None


def test_names_in_lists_are_shown_counted_and_need_the_proxy(tmp_path: Path) -> None:
    p = parse_policy(["192.0.2.1", "Good.Example", "good.example"], ["*.bad.example"])
    assert p.allow_names == ("good.example",) and p.deny_names == ("*.bad.example",)
    assert p.by_name and not p.empty
    assert p.to_json() == {
        "allow_out": ["192.0.2.1/32", "good.example"],
        "deny_out": ["*.bad.example"],
    }
    assert not parse_policy(None, ["x.example"]).empty
    assert not EgressPolicy((), (), True, (), ("x.example",)).empty
    with pytest.raises(ValueError, match="need the egress proxy"):
        policy_script(plan(), 0, p)
    script = policy_script(attrs.evolve(plan(), proxy_port=4711), 2, p).splitlines()
    assert 'add element inet sandboxd proxied { "sbx2" }' in script
    assert not any(line.startswith("delete element inet sandboxd proxied") for line in script)
    assert (
        "add rule inet sandboxd proxy_redirect iifname @proxied tcp dport { 80, 443 }"
        " redirect to :4711" in script
    )
    assert (
        "add rule inet sandboxd policy2 meta l4proto udp udp dport != 53"
        " reject with icmpx type admin-prohibited" in script
    )
    host = Host()
    mode = EgressNetwork(host.egress(tmp_path), capacity=2)
    with pytest.raises(ValueError, match="need the egress proxy"):
        mode.check_policy(p)
    mode.proxy = Listener()
    mode.check_policy(p)
    with pytest.raises(ValueError, match="allow_out: 2 entries, at most 1"):
        EgressNetwork(host.egress(tmp_path), 2, policy_entries_max=1).check_policy(p)


def test_nameserver_settings_parse_or_say_why() -> None:
    assert parse_dns_servers("") == ()
    found = parse_dns_servers("192.0.2.53, 192.0.2.54:5353 [2001:db8::53]:53 [::1] ::2")
    assert [str(server) for server in found] == [
        "192.0.2.53:53",
        "192.0.2.54:5353",
        "[2001:db8::53]:53",
        "[::1]:53",
        "[::2]:53",
    ]
    assert parse_dns_servers(",".join(str(server) for server in found)) == found
    for bad in ("dns.example", "192.0.2.1:x", "192.0.2.1:70000", "[::1]:0"):
        with pytest.raises(ValueError, match="not a"):
            parse_dns_servers(bad)


def test_the_mode_knows_its_sandboxes_by_their_veths_address(tmp_path: Path) -> None:
    host = Host()
    mode = EgressNetwork(host.egress(tmp_path), capacity=2, proxy=Listener())
    mode.prepare()
    policy = parse_policy(["good.example"], None)
    mode.stage_policy("a", policy)
    mode.attach("a", "/ns/a")
    mode.attach("b", "/ns/b")
    a = plan().addresses(0)
    b = plan().addresses(1)
    assert mode.sandbox_at(str(a.sandbox4)) == ("a", policy)
    assert mode.sandbox_at(str(b.sandbox6)) == ("b", EgressPolicy())
    assert "redirect to :4711" in host.nft_inputs()[-1]
    for other in (
        str(a.host4),
        "198.51.100.1",
        "not an address",
        str(plan().addresses(5).sandbox4),
    ):
        assert mode.sandbox_at(other) is None
    no6 = EgressNetwork(Host().egress(tmp_path, plan(pool6=None)), capacity=1)
    assert no6.sandbox_at(str(a.sandbox6)) is None
    mode.detach("a", "/ns/a")
    assert 'delete element inet sandboxd proxied { "sbx0" }' in host.nft_inputs()[-1]
    mode.close()


class FakeSocket:
    """A redirected socket: its original destination, and a real socket's descriptor
    (``detach``) for the relay."""

    def __init__(self, family: int, raw: bytes) -> None:
        self.family = family
        self.raw = raw

    def detach(self) -> int:
        sock, self.peer = socket.socketpair()
        self.peer.settimeout(5)
        return sock.detach()

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        if not self.raw:
            raise OSError(92, "ENOPROTOOPT: not redirected")
        assert option == 80 and size == len(self.raw)
        return self.raw


def test_the_original_destination_is_read_for_either_family() -> None:
    v4 = struct.pack("!HH4s8x", socket.AF_INET, 443, socket.inet_aton("203.0.113.1"))
    assert original_destination(FakeSocket(socket.AF_INET, v4)) == ("203.0.113.1", 443)  # type: ignore[arg-type]
    address = socket.inet_pton(socket.AF_INET6, "2001:db8::1")
    v6 = struct.pack("!HHI16sI", socket.AF_INET6, 80, 0, address, 0)
    assert original_destination(FakeSocket(socket.AF_INET6, v6)) == ("2001:db8::1", 80)  # type: ignore[arg-type]


def record(kind: int, payload: Any) -> dns.RRHeader:
    return dns.RRHeader(b"good.example", kind, dns.IN, 5, payload)


def test_answers_give_the_names_addresses() -> None:
    found = answer_addresses(
        [
            (True, ([record(dns.A, dns.Record_A("203.0.113.1"))], [], [])),
            (True, ([record(dns.CNAME, dns.Record_CNAME(b"x.example"))], [], [])),
            (True, ([record(dns.AAAA, dns.Record_AAAA("2001:db8::1"))], [], [])),
            (False, Exception("NXDOMAIN")),
        ]
    )
    assert found == ({A, ipaddress.ip_address("2001:db8::1")}, 5)
    assert answer_addresses([(False, Exception("NXDOMAIN"))]) == (set(), 60)


def test_answers_are_kept_for_their_ttl_and_bounded() -> None:
    proxy, reactor = proxy_for(GOOD)
    resolver: Any = proxy.resolver
    seen: list[set[Any]] = []
    proxy.names.resolve("good.example").addCallback(seen.append)
    proxy.names.resolve("good.example").addCallback(seen.append)
    assert seen == [{A}, {A}] and resolver.asked == ["good.example"]  # the second kept
    reactor.advance(5)  # the records' TTL
    proxy.names.resolve("good.example")
    assert resolver.asked == ["good.example"] * 2
    proxy.names.resolve("other.example")  # NXDOMAIN: not kept
    proxy.names.resolve("other.example")
    assert resolver.asked.count("other.example") == 2
    proxy.names.names_max = 1
    proxy.names.resolve("loop.example")  # the only room: good.example's answer goes
    proxy.names.resolve("good.example")
    assert resolver.asked.count("good.example") == 3


class Sandboxes:
    def __init__(self, policy: EgressPolicy) -> None:
        self.policy = policy
        self.known = {"10.200.0.1": "a"}

    def sandbox_at(self, address: str) -> tuple[str, EgressPolicy] | None:
        rid = self.known.get(address)
        return None if rid is None else (rid, self.policy)


class Resolver:
    def __init__(self, zone: dict[str, list[str]]) -> None:
        self.zone = zone
        self.asked: list[str] = []

    def lookupAddress(self, name: str, timeout: Any = None) -> Any:
        assert timeout == (1, 3)  # not Twisted's minute
        self.asked.append(name)
        if name not in self.zone:
            return fail(Exception("NXDOMAIN"))
        v4 = [record(dns.A, dns.Record_A(a)) for a in self.zone[name] if ":" not in a]
        return succeed((v4, [], []))

    def lookupIPV6Address(self, name: str, timeout: Any = None) -> Any:
        v6 = [record(dns.AAAA, dns.Record_AAAA(a)) for a in self.zone.get(name, []) if ":" in a]
        return succeed((v6, [], []))


class Redirected(StringTransport):
    """A sandbox's connection as the proxy's listener accepts it."""

    def __init__(self, peer: str, destination: str, port: int) -> None:
        super().__init__(peerAddress=IPv4Address("TCP", peer, 40000))
        raw = struct.pack("!HH4s8x", socket.AF_INET, port, socket.inet_aton(destination))
        self.handle = FakeSocket(socket.AF_INET, raw)
        self.aborted = False
        self.write_closed = False

    def loseWriteConnection(self) -> None:
        self.write_closed = True

    def getHandle(self) -> FakeSocket:
        return self.handle

    def stopReading(self) -> None:
        self.producerState = "taken"

    def stopWriting(self) -> None:
        pass

    def abortConnection(self) -> None:
        self.aborted = True
        self.disconnecting = True


@attrs.define
class Attempt:
    """A plain upstream the proxy asked for (its ``connector``): nothing is connected; the
    test says how it went (``connected`` with a socket of its own, or ``failed``)."""

    reactor: Any
    address: Any
    port: int
    timeout: float
    connected: Callable[[socket.socket], None]
    failed: Callable[[], None]
    started: bool = False
    cancelled: bool = False

    def start(self) -> None:
        self.started = True

    def cancel(self) -> None:
        self.cancelled = True


class Reactor(MemoryReactorClock):
    """A memory reactor that also keeps the proxy's plain upstreams asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts: list[Attempt] = []

    def connector(self, *args: Any) -> Attempt:
        self.attempts.append(Attempt(*args))
        return self.attempts[-1]


def proxy_for(policy: EgressPolicy, per_sandbox: int = 4) -> tuple[EgressProxy, Reactor]:
    reactor = Reactor()
    zone = {"good.example": ["203.0.113.1"], "loop.example": ["127.0.0.1"]}
    refused: list[tuple[str, str]] = []
    proxy = EgressProxy(
        reactor,
        Sandboxes(policy),
        Resolver(zone),
        operator_denied(plan()),
        never_host,
        per_sandbox=per_sandbox,
        on_refused=lambda rid, reason: refused.append((rid, reason)),
        connector=reactor.connector,
    )
    return proxy, reactor


def connect(
    proxy: EgressProxy, destination: str = "203.0.113.1", peer: str = "10.200.0.1"
) -> tuple[SandboxSide, Redirected]:
    side = SandboxSide(proxy)
    transport = Redirected(peer, destination, 443)
    side.makeConnection(transport)
    return side, transport


GOOD = parse_policy(["good.example", "loop.example"], None)


class Wire(StringTransport):
    """The upstream's connection: a real socket (``peer``: the upstream's end)."""

    def __init__(self) -> None:
        super().__init__()
        self.sock, self.peer = socket.socketpair()
        self.peer.settimeout(5)

    def getHandle(self) -> socket.socket:
        return self.sock

    def stopReading(self) -> None:
        pass

    def stopWriting(self) -> None:
        pass

    def received(self, size: int) -> bytes:
        """What the upstream has been sent, ``size`` bytes at most."""
        return self.peer.recv(size)


def test_an_allowed_name_is_relayed_both_ways_in_the_kernel() -> None:
    proxy, reactor = proxy_for(GOOD)
    side, transport = connect(proxy)
    hello = client_hello("good.example")
    side.dataReceived(hello[:10])  # not enough to name anything yet
    assert not reactor.attempts
    side.dataReceived(hello[10:])
    assert transport.producerState == "paused"  # not read while deciding
    attempt = reactor.attempts[-1]
    assert (str(attempt.address), attempt.port) == ("203.0.113.1", 443) and attempt.started
    assert not reactor.tcpClients  # no Twisted transport is made for the upstream
    wire = Wire()
    attempt.connected(wire.sock)
    assert transport.producerState == "taken"  # both sockets left Twisted for the relay
    assert wire.received(65536) == hello  # the peeked bytes go first
    assert side.relay is not None and not side.relay.closed
    sandbox = transport.handle.peer
    sandbox.sendall(b"more")
    wire.peer.sendall(b"answer")
    for end in list(reactor.readers):  # the reactor's turn: each readable end is read
        end.doRead()
    assert wire.received(100) == b"more" and sandbox.recv(100) == b"answer"
    assert proxy.open["a"] == 1
    second, _ = connect(proxy)
    assert proxy.open["a"] == 2
    second.connectionLost(None)
    assert proxy.open["a"] == 1
    wire.peer.close()  # the upstream's end: the sandbox sees it, its own way stays open
    for end in list(reactor.readers):
        end.doRead()
    assert sandbox.recv(100) == b"" and not side.relay.closed and proxy.open["a"] == 1
    sandbox.close()  # its end too: nothing is left either way
    for end in list(reactor.readers):
        end.doRead()
    assert side.relay.closed and not proxy.open
    assert not reactor.readers and not reactor.writers
    assert not proxy.refused
    assert not reactor.getDelayedCalls()  # the peek's timer is gone


@pytest.mark.parametrize(
    ("first", "destination", "reason"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "203.0.113.1", "no_name"),
        (b"GET / HTTP/1.1\r\nHost: good.example\r\n\r\n", "203.0.113.2", "mismatch"),
        (b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n", "203.0.113.1", "unresolved"),
        (b"GET / HTTP/1.1\r\nHost: loop.example\r\n\r\n", "203.0.113.1", "mismatch"),
        (b"x" * 20000, "203.0.113.1", "no_name"),
    ],
)
def test_what_has_no_good_name_is_refused_and_counted(
    first: bytes, destination: str, reason: str
) -> None:
    proxy, reactor = proxy_for(GOOD)
    side, transport = connect(proxy, destination)
    side.dataReceived(first)
    assert transport.aborted and not reactor.attempts
    assert proxy.refused == {("a", reason): 1}
    side.connectionLost(None)
    assert not proxy.open


def test_the_policy_now_decides_and_denied_names_are_refused() -> None:
    proxy, _reactor = proxy_for(GOOD)
    side, transport = connect(proxy)
    proxy.sandboxes.policy = parse_policy(None, ["good.example"])  # type: ignore[attr-defined]
    side.dataReceived(b"GET / HTTP/1.1\r\nHost: good.example\r\n\r\n")
    assert transport.aborted and proxy.refused == {("a", "denied"): 1}


def test_strangers_too_many_slow_and_vanished_connections() -> None:
    proxy, reactor = proxy_for(GOOD, per_sandbox=1)
    stranger, stranger_transport = connect(proxy, peer="192.0.2.9")
    assert stranger_transport.aborted and not proxy.refused  # not a sandbox: not counted
    stranger.connectionLost(None)
    slow, slow_transport = connect(proxy)
    _, extra = connect(proxy)
    assert extra.aborted and proxy.refused == {("a", "too_many"): 1}
    proxy.per_sandbox, proxy.total = 2, 1  # room for the sandbox, none left in all
    _, beyond_all = connect(proxy)
    assert beyond_all.aborted and proxy.refused == {("a", "too_many"): 2}
    proxy.per_sandbox, proxy.total = 1, 4096
    reactor.advance(PEEK_TIMEOUT)
    assert slow_transport.aborted and proxy.refused[("a", "no_name")] == 1
    slow.connectionLost(None)
    gone, gone_transport = connect(proxy)
    proxy.sandboxes.known.clear()  # type: ignore[attr-defined]
    gone.dataReceived(b"GET / HTTP/1.1\r\nHost: good.example\r\n\r\n")
    assert gone_transport.aborted and not reactor.attempts
    _closed, closed_transport = connect(proxy, peer="10.200.0.3")
    assert closed_transport.aborted
    proxy.sandboxes.known["10.200.0.1"] = "a"  # type: ignore[attr-defined]
    gone.connectionLost(None)
    late, late_transport = connect(proxy)
    late.gone = True  # the sandbox hung up while the name was resolved
    late.dataReceived(b"GET / HTTP/1.1\r\nHost: good.example\r\n\r\n")
    assert not reactor.attempts and not late_transport.aborted


def test_an_unreachable_upstream_or_a_sandbox_gone_meanwhile() -> None:
    proxy, reactor = proxy_for(GOOD)
    side, transport = connect(proxy)
    side.dataReceived(b"GET / HTTP/1.1\r\nHost: good.example\r\n\r\n")
    attempt = reactor.attempts[-1]
    attempt.failed()
    assert transport.aborted and proxy.refused == {("a", "unreachable"): 1}
    side.connectionLost(None)
    attempt.failed()  # once only
    assert proxy.refused == {("a", "unreachable"): 1}
    side, transport = connect(proxy)
    side.dataReceived(b"GET / HTTP/1.1\r\nHost: good.example\r\n\r\n")
    attempt = reactor.attempts[-1]
    side.connectionLost(None)
    assert attempt.cancelled  # the sandbox went: its upstream is given up
    late, other = socket.socketpair()
    attempt.connected(late)  # connected all the same: closed, never relayed
    assert late.fileno() == -1 and side.relay is None
    other.close()


class Listener:
    """The proxy as the mode sees it."""

    def __init__(self) -> None:
        self.listening = False

    def listen(self) -> int:
        self.listening = True
        return 4711

    def close(self) -> None:
        self.listening = False


def test_the_proxy_listens_while_the_layer_is_up_its_port_guarded(tmp_path: Path) -> None:
    host = Host()
    mode = EgressNetwork(host.egress(tmp_path), capacity=1, lazy=True)
    reactor = MemoryReactorClock()
    config = SimpleNamespace(
        egress_dns=parse_dns_servers("127.0.0.1:5353"),
        resolv_conf="/nonexistent",
        egress_judge="off",
    )
    proxy = egress_proxy(config, reactor, mode, interfaces=("127.0.0.1", "::1"))
    assert proxy is not None and mode.proxy is proxy
    mode.prepare()
    assert not reactor.adoptedPorts  # lazy: nothing until an egress sandbox needs it
    mode.attach("a", "/ns/a")
    assert [family for _, family, _ in reactor.adoptedPorts] == [socket.AF_INET, socket.AF_INET6]
    assert isinstance(reactor.adoptedPorts[0][2].buildProtocol(None), SandboxSide)
    port = mode.egress.plan.proxy_port
    assert port > 0
    guard = f'iifname != "sbx*" tcp dport {port} reject with tcp reset'
    assert any(guard in text for text in host.nft_inputs())
    mode.detach("a", "/ns/a")  # the last one: the layer stops, and the proxy's listening
    assert not proxy._ports and mode.egress.plan.proxy_port == 0
    assert guard not in plan().ruleset("drop")
    no6 = EgressNetwork(Host().egress(tmp_path, plan(pool6=None)), capacity=1)
    config.egress_dns = ()
    proxy = egress_proxy(config, MemoryReactorClock(), no6, interfaces=("127.0.0.1", "::1"))
    assert proxy is not None and list(proxy.interfaces) == ["127.0.0.1"]
    assert egress_proxy(config, reactor, object()) is None


def test_a_layer_that_cannot_start_stops_the_proxys_listening(tmp_path: Path) -> None:
    host = Host()
    listener = Listener()
    mode = EgressNetwork(host.egress(tmp_path), capacity=1, proxy=listener)
    host.fail = "proxied"  # the ruleset is refused
    with pytest.raises(IsolationUnavailable):
        mode.prepare()
    assert not listener.listening and mode.egress.plan.proxy_port == 0


def test_a_sandboxs_counts_go_with_it(tmp_path: Path) -> None:
    host = Host()
    mode = EgressNetwork(host.egress(tmp_path), capacity=2)
    forgotten: list[tuple[str, str]] = []
    reactor = MemoryReactorClock()
    config = SimpleNamespace(egress_dns=(), resolv_conf="/nonexistent", egress_judge="off")
    proxy = egress_proxy(config, reactor, mode, interfaces=("127.0.0.1",))
    assert proxy is not None
    proxy.on_forget = lambda rid, why: forgotten.append((rid, why))
    mode.prepare()
    mode.attach("a", "/ns/a")
    proxy.refuse("a", "denied", "bad.example", "203.0.113.2")
    proxy.refuse("b", "mismatch", "good.example", "203.0.113.2")
    mode.detach("a", "/ns/a")
    assert forgotten == [("a", "denied")] and proxy.refused == {("b", "mismatch"): 1}
    mode.close()


def test_a_half_close_before_the_upstream_is_up() -> None:
    proxy, reactor = proxy_for(GOOD)
    pending: list[Deferred[Any]] = []

    def later(name: str, timeout: Any) -> Deferred[Any]:
        pending.append(Deferred())
        return pending[-1]

    proxy.resolver.lookupAddress = later
    side, _ = connect(proxy)
    side.dataReceived(b"GET / HTTP/1.1\r\nHost: good.example\r\n\r\n")
    side.dataReceived(b"body")  # read before the pause took hold: kept
    side.readConnectionLost()
    pending[0].callback(([record(dns.A, dns.Record_A("203.0.113.1"))], [], []))
    wire = Wire()
    reactor.attempts[-1].connected(wire.sock)
    sent = b""
    while chunk := wire.received(65536):  # all of it, then its end
        sent += chunk
    assert sent.endswith(b"\r\n\r\nbody")
    assert side.relay is not None and not side.relay.closed  # the answer may still come
    peeking, peeking_transport = connect(proxy)
    peeking.dataReceived(b"GET / HTTP/1.1\r\nHo")
    peeking.readConnectionLost()  # its name can never be complete
    assert peeking_transport.aborted and proxy.refused == {("a", "no_name"): 1}


def test_a_connection_nftables_did_not_redirect_is_closed() -> None:
    proxy, _ = proxy_for(GOOD)
    side = SandboxSide(proxy)
    transport = Redirected("10.200.0.1", "203.0.113.1", 443)
    transport.handle = FakeSocket(socket.AF_INET, b"")
    side.makeConnection(transport)
    assert transport.aborted and not proxy.open


def test_the_connections_cap_leaves_the_descriptors_to_the_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Six descriptors a relayed connection, a quarter of the daemon's limit at most.
    assert total_for(1 << 20) == 4096
    assert total_for(20_000) == 833 and 833 * 6 <= 20_000 // 4
    assert total_for(10) == 1
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 524288))
    assert descriptor_limit() == 524288  # the soft limit is raised to it at start
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, resource.RLIM_INFINITY))
    assert descriptor_limit() == 1024
