"""An upstream's TLS handshake for a header rule (docs/isolation.rst, "Header rules over
HTTPS"): a stalled one is aborted after its timeout and refused for that, once; one that
completes in time is relayed and never refused; a plain TCP upstream waits for nothing."""

from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from sandboxd.isolation.network.egress_upstream import (
    HANDSHAKE_TIMEOUT,
    UPSTREAM_TLS,
    UPSTREAM_TLS_TIMEOUT,
    UpstreamFactory,
)


class Sandbox:
    """Records what the upstream tells the sandbox's side (refused once, as the proxy's)."""

    def __init__(self) -> None:
        self.relayed: list[Any] = []
        self.refused: list[str] = []

    def relay_to(self, upstream: Any, answered: bytes = b"") -> None:
        self.relayed.append(upstream)

    def fail(self, reason: str, name: str) -> None:
        if not self.refused:
            self.refused.append(f"{reason} {name}")


def connected(tls: bool) -> tuple[Any, Sandbox, Clock, StringTransport]:
    sandbox, clock, transport = Sandbox(), Clock(), StringTransport()
    side = UpstreamFactory(sandbox, "api.example", "unreachable", tls, clock).buildProtocol(None)
    side.makeConnection(transport)
    return side, sandbox, clock, transport


def test_a_stalled_handshake_is_aborted_and_refused_for_it() -> None:
    side, sandbox, clock, transport = connected(tls=True)
    clock.advance(HANDSHAKE_TIMEOUT - 1)
    assert not sandbox.refused and not transport.disconnecting
    clock.advance(1)
    assert sandbox.refused == [f"{UPSTREAM_TLS_TIMEOUT} api.example"]
    assert transport.disconnecting and not sandbox.relayed
    side.connectionLost(None)  # (the abort's loss: not counted again)
    assert sandbox.refused == [f"{UPSTREAM_TLS_TIMEOUT} api.example"]


def test_a_handshake_in_time_is_relayed_and_its_timer_gone() -> None:
    side, sandbox, clock, transport = connected(tls=True)
    side.handshakeCompleted()
    assert sandbox.relayed == [transport] and not clock.getDelayedCalls()


def test_a_loss_before_the_handshake_is_refused_and_stops_the_timer() -> None:
    side, sandbox, clock, _ = connected(tls=True)
    side.connectionLost(None)
    assert sandbox.refused == [f"{UPSTREAM_TLS} api.example"] and not clock.getDelayedCalls()


def test_a_tcp_upstream_is_relayed_at_once_without_a_timer() -> None:
    _, sandbox, clock, transport = connected(tls=False)
    assert sandbox.relayed == [transport] and not clock.getDelayedCalls()
