"""The connection gate, the per-peer pace of refused tokens and the burst log, on a Clock."""

from typing import cast

import pytest
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from twisted.web.http_headers import Headers

from sandboxd.http.api import admission
from sandboxd.web import guard
from sandboxd.web.guard import Admission, BurstLog, ConnectionGate, Limits, PeerPace


class Conn:
    def __init__(self, gate: ConnectionGate) -> None:
        self.gate = gate
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True


def gate(cap: int | None, reserve: int) -> ConnectionGate:
    return ConnectionGate(Clock(), Limits(cap, reserve, 1.0, 2.0))


def test_a_full_gate_evicts_the_longest_waiting_untrusted_connection() -> None:
    g = gate(4, 1)
    first, second, third = Conn(g), Conn(g), Conn(g)
    assert all(g.opened(c) for c in (first, second, third))
    g.busy(second)
    newcomer = Conn(g)
    assert g.opened(newcomer)  # 3 untrusted = cap - reserve: the oldest waiting one goes
    assert first.evicted and not second.evicted
    assert (g.open, g.untrusted) == (3, 3)
    g.closed(first)  # its own end, later: counted once
    assert g.open == 3


def test_trusted_connections_use_the_reserve_and_are_never_evicted() -> None:
    g = gate(3, 1)
    trusted = [Conn(g), Conn(g)]
    for c in trusted:
        assert g.opened(c)
        g.trust(c)
        g.waiting(c)  # between requests: still not evictable
    assert g.untrusted == 0
    stranger = Conn(g)
    assert g.opened(stranger)
    g.busy(stranger)
    refused = Conn(g)
    assert not g.opened(refused)  # full, and nobody waiting to evict
    assert not any(c.evicted for c in (*trusted, stranger))
    g.closed(trusted[0])
    assert g.opened(refused)


def test_without_a_cap_every_connection_stays() -> None:
    g = gate(None, 0)
    connections = [Conn(g) for _ in range(50)]
    assert all(g.opened(c) for c in connections)
    g.trust(connections[0])
    g.closed(connections[0])
    g.trust(connections[0])  # closed: nothing to trust
    g.waiting(connections[0])
    assert (g.open, g.untrusted) == (49, 49)


def test_refused_tokens_are_paced_per_peer() -> None:
    clock = Clock()
    pace = PeerPace(clock, burst=3, rate=2.0, max_wait=1.0, peers_max=2)
    assert [pace.wait("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert [pace.wait("a") for _ in range(3)] == [0.5, 1.0, None]
    assert pace.wait("b") == 0.0  # another peer: its own pace
    clock.advance(10)
    assert pace.wait("c") == 0.0  # a third peer: the idle ones are forgotten
    assert pace.peers == 1
    assert pace.wait("a") == 0.0


def test_a_burst_is_logged_once_and_then_counted() -> None:
    clock = Clock()
    seen: list[LogEvent] = []
    observer = cast(ILogObserver, seen.append)
    globalLogPublisher.addObserver(observer)
    try:
        burst = BurstLog(clock, "connections", window=5)
        for n in range(100):
            burst.event(f"refused {n}")
        clock.advance(5)
        burst.event("refused again")
        clock.advance(5)
    finally:
        globalLogPublisher.removeObserver(observer)
    lines = [e for e in seen if e.get("what") == "connections"]
    assert [e.get("detail", e.get("more")) for e in lines] == ["refused 0", 99, "refused again"]


def test_limits_under_a_descriptor_limit() -> None:
    assert guard.limits_for(None, 10.0, 120.0, 1024) == Limits(512, 51, 10.0, 120.0)
    assert guard.limits_for(0, None, None, 1024) == Limits(None, 0, None, None)
    assert guard.limits_for(900, 1.0, 1.0, 1024).max_connections == 900
    with pytest.raises(ValueError, match="RLIMIT_NOFILE"):
        guard.limits_for(1000, 1.0, 1.0, 1024)
    assert guard.reserve_for(1) == 0


def test_capabilities_name_the_protections_in_force() -> None:
    assert guard.capabilities(Limits(10, 1, 1.0, 1.0), True, True) == [
        "http.auth_at_headers",
        "http.token_pace",
        "http.connection_cap",
        "http.header_timeout",
        "http.idle_timeout",
        "http.body_pace",
    ]
    assert guard.capabilities(Limits(None, 0, None, None), False, False) == []


def test_admission_judges_path_and_token() -> None:
    admit = admission(b"t")
    assert admit(b"/sandboxes", b"Bearer t", Headers()) is Admission.TRUSTED
    assert admit(b"/sandboxes", b"Bearer x", Headers()) is Admission.REFUSED
    assert admit(b"/sandboxes", None, Headers()) is Admission.REFUSED
    assert admit(b"/healthz?x=1", None, Headers()) is Admission.OPEN
    assert admit(b"/readyz", b"Bearer x", Headers()) is Admission.OPEN
    assert admission(None)(b"/sandboxes", None, Headers()) is Admission.TRUSTED


def test_an_untrusted_connection_between_requests_is_evictable_again() -> None:
    g = gate(3, 1)
    served, other = Conn(g), Conn(g)
    assert g.opened(served) and g.opened(other)
    g.busy(served)
    g.busy(other)
    assert not g.opened(Conn(g))  # 2 untrusted = cap - reserve, none waiting
    g.waiting(served)  # its /healthz answered: it waits for another request
    assert g.opened(Conn(g)) and served.evicted and not other.evicted
