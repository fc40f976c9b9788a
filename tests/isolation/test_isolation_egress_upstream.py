"""An upstream's TLS handshake for a header rule (docs/isolation.rst, "Header rules over
HTTPS"): a stalled one is aborted after its timeout and refused for that, once; one that
completes in time is relayed and never refused; a plain TCP upstream waits for nothing, and
one that is relayed as it is gets no Twisted transport at all (``PlainConnect``)."""

import contextlib
import errno
import ipaddress
import select
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport

from sandboxd.isolation.network.egress_upstream import (
    HANDSHAKE_TIMEOUT,
    UPSTREAM_TLS,
    UPSTREAM_TLS_TIMEOUT,
    PlainConnect,
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


def test_an_upstream_that_cannot_be_connected_is_refused() -> None:
    sandbox = Sandbox()
    factory = UpstreamFactory(sandbox, "api.example", "unreachable", True, Clock())
    factory.clientConnectionFailed(None, None)
    assert sandbox.refused == ["unreachable api.example"]


def test_a_tcp_upstream_is_relayed_at_once_without_a_timer() -> None:
    _, sandbox, clock, transport = connected(tls=False)
    assert sandbox.relayed == [transport] and not clock.getDelayedCalls()


# A plain upstream connected without a Twisted transport (``PlainConnect``), on loopback: a
# real non-blocking connect; the reactor is a memory one, so the test says when it looks.


class Outcome:
    """What a :class:`PlainConnect` reported."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []
        self.failures = 0

    def connected(self, sock: socket.socket) -> None:
        self.sockets.append(sock)

    def failed(self) -> None:
        self.failures += 1


def plain(port: int, timeout: float = 10.0) -> tuple[PlainConnect, Outcome, MemoryReactorClock]:
    outcome, reactor = Outcome(), MemoryReactorClock()
    address = ipaddress.ip_address("127.0.0.1")
    attempt = PlainConnect(reactor, address, port, timeout, outcome.connected, outcome.failed)
    attempt.start()
    return attempt, outcome, reactor


def settle(attempt: PlainConnect, reactor: MemoryReactorClock) -> None:
    """The reactor's turn: a connecting socket is writable once its connect is done."""
    if attempt in reactor.writers:
        select.select([], [attempt.fileno()], [], 5)
        attempt.doWrite()


def test_a_plain_upstream_is_handed_over_connected() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        attempt, outcome, reactor = plain(server.getsockname()[1])
        settle(attempt, reactor)
        accepted, _ = server.accept()
        [sock] = outcome.sockets
        sock.sendall(b"hello")
        assert accepted.recv(5) == b"hello"
        assert not outcome.failures and not reactor.writers and not reactor.getDelayedCalls()
        assert attempt.fileno() == -1  # the socket is the caller's now
        sock.close()
        accepted.close()


def test_a_refused_upstream_fails_once_and_leaves_nothing() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    attempt, outcome, reactor = plain(port)  # nobody listens there now
    settle(attempt, reactor)
    assert outcome.failures == 1 and not outcome.sockets
    assert not reactor.writers and not reactor.getDelayedCalls() and attempt.fileno() == -1


@contextlib.contextmanager
def deaf_port() -> Iterator[int]:
    """A loopback port whose listener's backlog is full: it drops further SYNs, so a connect
    to it stays in progress."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = []
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        try:
            yield port
        finally:
            for filler in fillers:
                filler.close()


def test_an_upstream_that_never_answers_fails_at_its_timeout() -> None:
    with deaf_port() as port:
        attempt, outcome, reactor = plain(port, timeout=3.0)
        assert attempt in reactor.writers
        reactor.advance(3.0)
        assert outcome.failures == 1 and not outcome.sockets
        assert not reactor.writers and attempt.fileno() == -1


def test_a_write_event_while_the_connect_is_under_way_is_not_taken_for_its_end() -> None:
    """An event handed to the attempt that was not its own (another descriptor's, of the
    same number): the socket, still connecting, is not handed over."""
    with deaf_port() as port:
        attempt, outcome, reactor = plain(port)
        attempt.doWrite()
        assert not outcome.sockets and not outcome.failures
        assert attempt in reactor.writers and attempt.fileno() != -1
        attempt.cancel()


def test_a_cancelled_or_stopped_attempt() -> None:
    with deaf_port() as port:
        attempt, outcome, reactor = plain(port)
        assert attempt.logPrefix() == "egress upstream"
        assert attempt in reactor.writers
        attempt.cancel()
        assert not reactor.writers and not reactor.getDelayedCalls() and attempt.fileno() == -1
        attempt.cancel()  # (once is enough)
        attempt.connectionLost(None)  # (gone already: nothing to say)
        assert not outcome.failures and not outcome.sockets
        attempt, outcome, reactor = plain(port)
        assert attempt in reactor.writers
        attempt.connectionLost(None)  # the reactor stopping
        assert outcome.failures == 1 and attempt.fileno() == -1 and not reactor.writers


class AtOnce:
    """A socket whose ``connect_ex`` answers at once with ``code`` (the kernel may, for a
    local address)."""

    code = 0

    def __init__(self, *args: Any) -> None:
        self.closed = False

    def connect_ex(self, address: Any) -> int:
        return self.code

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("code", [0, errno.ECONNREFUSED, errno.EMFILE])
def test_an_upstream_that_answers_at_once(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def make(*args: Any) -> AtOnce:
        if code == errno.EMFILE:
            raise OSError(code, "Too many open files")
        made = AtOnce()
        made.code = code
        return made

    monkeypatch.setattr(socket, "socket", make)
    _, outcome, reactor = plain(80)
    monkeypatch.undo()
    assert not reactor.writers and not reactor.getDelayedCalls()
    if code == 0:
        assert len(outcome.sockets) == 1 and not outcome.failures
    else:
        assert outcome.failures == 1 and not outcome.sockets
