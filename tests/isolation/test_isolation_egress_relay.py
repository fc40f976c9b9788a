"""The egress proxy's relay (sandboxd/isolation/network/egress_relay.py) on the real reactor
with real TCP connections on 127.0.0.1: a "sandbox" and an "upstream" (blocking sockets
driven from threads) and the proxy's two ends of them handed to a relay, as the proxy hands
them once a connection is allowed. Bytes both ways arrive whole and in order, a half-close
passes, a reset passes as a reset, a reader that stops holds its writer back (nothing piles up
in the daemon), and many relays run at once. The same through a real daemon and nftables:
``tests/kernel/test_egress_names_relay.py``."""

import errno
import fcntl
import gc
import hashlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import pytest_twisted
from twisted.internet import protocol, reactor, threads
from twisted.internet.task import deferLater

from sandboxd.isolation.network.egress_relay import PIPE_SIZE, Relay, take_socket

T = TypeVar("T")

PATTERN = hashlib.sha256(b"sandboxd").digest() * 2048  # 64 KiB that are not all one byte


def payload(size: int, salt: int) -> bytes:
    """``size`` bytes of a pattern ``salt`` shifts (each stream its own)."""
    reps = size // len(PATTERN) + 2
    return (PATTERN * reps)[salt : salt + size]


class Pair:
    """A sandbox's connection and an upstream's, each accepted on 127.0.0.1, their proxy
    ends relayed: ``sandbox`` and ``upstream`` are the outer, blocking, sockets."""

    def __init__(self, peeked: bytes = b"", sandbox_ended: bool = False) -> None:
        self.ended: list[float] = []
        with socket.create_server(("127.0.0.1", 0)) as listener:
            self.sandbox = socket.create_connection(listener.getsockname())
            proxy_sandbox, _ = listener.accept()
            proxy_upstream = socket.create_connection(listener.getsockname())
            self.upstream, _ = listener.accept()
        self.sandbox.settimeout(30)
        self.upstream.settimeout(30)
        proxy_sandbox.setblocking(False)
        proxy_upstream.setblocking(False)
        if sandbox_ended:
            self.sandbox.shutdown(socket.SHUT_WR)
        self.relay = Relay.start(
            reactor, proxy_sandbox, proxy_upstream, peeked, sandbox_ended, self.on_end
        )

    def on_end(self) -> None:
        self.ended.append(time.monotonic())

    def close(self) -> None:
        self.sandbox.close()
        self.upstream.close()


@pytest.fixture
def pairs() -> Iterator[list[Pair]]:
    made: list[Pair] = []
    yield made
    for pair in made:
        pair.close()


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def send_then_end(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


async def in_thread(work: Callable[[], T]) -> T:
    return await threads.deferToThread(work)


async def until(condition: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not in time"
        await deferLater(reactor, 0.01, lambda: None)


def in_flight_max() -> int:
    """The most bytes a stalled stream holds between its sender and its reader: the receive
    and send buffers of both connections at their largest, and one of a relay's pipes."""

    def largest(setting: str) -> int:
        with open(f"/proc/sys/net/ipv4/{setting}") as values:
            return int(values.read().split()[2])

    return 2 * largest("tcp_rmem") + 2 * largest("tcp_wmem") + PIPE_SIZE


async def steady(read: Callable[[], int], seconds: float = 20) -> int:
    """What ``read()`` gives once it has not changed for half a second."""
    deadline = time.monotonic() + seconds
    last = read()
    while True:
        await deferLater(reactor, 0.5, lambda: None)
        now = read()
        if now == last:
            return now
        assert time.monotonic() < deadline, "never steady"
        last = now


@pytest_twisted.ensureDeferred
async def test_large_transfers_both_ways_arrive_whole_the_peeked_bytes_first(
    pairs: list[Pair],
) -> None:
    pair = Pair(peeked=b"GET / HTTP/1.1\r\n")
    pairs.append(pair)
    up, down = payload(24 << 20, 1), payload(24 << 20, 2)
    # each side sends all it has and ends, and reads the other's: both at once
    sent_up = threads.deferToThread(send_then_end, pair.sandbox, up)
    sent_down = threads.deferToThread(send_then_end, pair.upstream, down)
    got_up = threads.deferToThread(read_all, pair.upstream)
    got_down = threads.deferToThread(read_all, pair.sandbox)
    await sent_up
    await sent_down
    assert await got_up == b"GET / HTTP/1.1\r\n" + up
    assert await got_down == down
    await until(lambda: bool(pair.ended))
    assert pair.relay.closed and len(pair.ended) == 1
    assert pair.sandbox.recv(1) == b""  # closed, not reset


@pytest_twisted.ensureDeferred
async def test_a_half_close_passes_and_the_answer_still_comes(pairs: list[Pair]) -> None:
    pair = Pair()
    pairs.append(pair)
    await in_thread(lambda: send_then_end(pair.sandbox, b"all I ask"))
    assert await in_thread(lambda: read_all(pair.upstream)) == b"all I ask"
    await deferLater(reactor, 0.05, lambda: None)
    assert not pair.ended  # the other way is still open
    await in_thread(lambda: send_then_end(pair.upstream, b"the answer, later"))
    assert await in_thread(lambda: read_all(pair.sandbox)) == b"the answer, later"
    await until(lambda: bool(pair.ended))


@pytest_twisted.ensureDeferred
async def test_a_sandbox_that_ended_while_its_name_was_resolved(pairs: list[Pair]) -> None:
    pair = Pair(peeked=b"GET /slow HTTP/1.1\r\n\r\n", sandbox_ended=True)
    pairs.append(pair)
    assert await in_thread(lambda: read_all(pair.upstream)) == b"GET /slow HTTP/1.1\r\n\r\n"
    await in_thread(lambda: send_then_end(pair.upstream, b"answer"))
    assert await in_thread(lambda: read_all(pair.sandbox)) == b"answer"
    await until(lambda: bool(pair.ended))


@pytest_twisted.ensureDeferred
async def test_a_side_resetting_resets_the_other(pairs: list[Pair]) -> None:
    pair = Pair()
    pairs.append(pair)
    await in_thread(lambda: pair.sandbox.sendall(b"request"))
    assert await in_thread(lambda: pair.upstream.recv(100)) == b"request"
    pair.upstream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
    pair.upstream.close()  # a reset
    with pytest.raises(ConnectionResetError):
        await in_thread(lambda: read_all(pair.sandbox))
    await until(lambda: bool(pair.ended))
    assert len(pair.ended) == 1
    pair.relay.ends[0].connectionLost(None)  # the reactor stopping, later: nothing more
    assert len(pair.ended) == 1


@pytest_twisted.ensureDeferred
async def test_the_reactor_losing_an_end_resets_both(pairs: list[Pair]) -> None:
    pair = Pair()
    pairs.append(pair)
    pair.relay.ends[1].connectionLost(None)  # as reactor.disconnectAll() at shutdown
    assert pair.relay.closed and len(pair.ended) == 1
    pair.relay.ends[0].doWrite()  # an event of the same turn of the reactor: nothing is done
    with pytest.raises(ConnectionResetError):
        await in_thread(lambda: read_all(pair.sandbox))
    with pytest.raises(ConnectionResetError):
        await in_thread(lambda: read_all(pair.upstream))


@pytest_twisted.ensureDeferred
async def test_a_sandbox_that_stops_reading_holds_its_upstream_back(pairs: list[Pair]) -> None:
    pair = Pair()
    pairs.append(pair)
    size = 96 << 20
    down = payload(size, 3)
    sent = [0]

    def send() -> None:
        view = memoryview(down)
        while sent[0] < size:
            sent[0] += pair.upstream.send(view[sent[0] : sent[0] + (1 << 20)])
        pair.upstream.shutdown(socket.SHUT_WR)

    sending = threads.deferToThread(send)
    held = await steady(lambda: sent[0])  # the sender waits: nothing more is taken
    assert held <= in_flight_max() < size  # what the kernel's buffers hold, no more
    way = pair.relay.ways[1]
    assert way.in_pipe <= PIPE_SIZE
    got = await in_thread(lambda: read_all(pair.sandbox))
    await sending
    assert got == down
    pair.sandbox.shutdown(socket.SHUT_WR)
    await until(lambda: bool(pair.ended))


@pytest_twisted.ensureDeferred
async def test_many_relays_at_once(pairs: list[Pair]) -> None:
    count = 100
    made = [Pair() for _ in range(count)]
    pairs.extend(made)
    size = 256 << 10

    def exchange(index: int, pair: Pair) -> bool:
        up, down = payload(size, index), payload(size, index + 1000)
        pair.sandbox.sendall(up)
        pair.sandbox.shutdown(socket.SHUT_WR)
        got_up = read_all(pair.upstream)
        pair.upstream.sendall(down)
        pair.upstream.shutdown(socket.SHUT_WR)
        return got_up == up and read_all(pair.sandbox) == down

    results = [threads.deferToThread(exchange, i, pair) for i, pair in enumerate(made)]
    assert all([await result for result in results])
    await until(lambda: all(pair.ended for pair in made))
    open_fds = len(os.listdir("/proc/self/fd"))
    for pair in made:
        pair.close()
    assert len(os.listdir("/proc/self/fd")) == open_fds - 2 * count  # (pipes closed already)


@pytest_twisted.ensureDeferred
async def test_no_descriptor_left_for_a_pipe_resets_both(
    pairs: list[Pair], monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[int] = []
    real = os.pipe2

    def pipe2(flags: int) -> tuple[int, int]:
        if made:  # the second way's pipe: the daemon is out of descriptors
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        ends = real(flags)
        made.extend(ends)
        return ends

    open_before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "pipe2", pipe2)
    pair = Pair()
    monkeypatch.undo()
    pairs.append(pair)
    assert pair.relay.closed and len(pair.ended) == 1
    with pytest.raises(ConnectionResetError):
        await in_thread(lambda: read_all(pair.sandbox))
    # the first way's pipe closed, the proxy's sockets too: the outer two alone are left
    assert len(made) == 2 and len(os.listdir("/proc/self/fd")) == open_before + 2


@pytest_twisted.ensureDeferred
async def test_past_the_pipe_quota_a_relay_works_with_the_default_pipes(
    pairs: list[Pair], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = fcntl.fcntl

    def refused(fd: int, command: int, arg: int = 0) -> int:
        if command == fcntl.F_SETPIPE_SZ:  # as for a user past pipe-user-pages-soft
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))
        return real(fd, command, arg)

    monkeypatch.setattr(fcntl, "fcntl", refused)
    pair = Pair()
    monkeypatch.undo()
    pairs.append(pair)
    assert fcntl.fcntl(pair.relay.ways[0].pipe_in, fcntl.F_GETPIPE_SZ) == 65536
    down = payload(4 << 20, 5)
    sending = threads.deferToThread(send_then_end, pair.upstream, down)
    assert await in_thread(lambda: read_all(pair.sandbox)) == down
    await sending


@pytest_twisted.ensureDeferred
async def test_a_socket_taken_from_twisteds_transports_is_the_takers_alone() -> None:
    """``take_socket`` on Twisted's own TCP transports (a listener's and a client's): the
    reactor stops watching them, their protocols hear nothing more, and the connections stay
    open and usable (Twisted never shuts them down)."""
    taken: dict[str, socket.socket] = {}
    heard: list[bytes] = []

    class Taker(protocol.Protocol):
        def __init__(self, role: str) -> None:
            self.role = role

        def connectionMade(self) -> None:
            taken[self.role] = take_socket(self.transport)

        def dataReceived(self, data: bytes) -> None:
            heard.append(data)

        def connectionLost(self, reason: object = None) -> None:
            heard.append(b"lost")

    tcp: Any = reactor  # (IReactorTCP's stubs want factories of its own protocol types)
    server = protocol.Factory.forProtocol(lambda: Taker("accepted"))
    port = tcp.listenTCP(0, server, interface="127.0.0.1")
    try:
        address = port.getHost()
        outer = socket.create_connection(("127.0.0.1", address.port), timeout=10)
        with socket.create_server(("127.0.0.1", 0)) as listener:
            client = protocol.ClientFactory.forProtocol(lambda: Taker("dialled"))
            tcp.connectTCP("127.0.0.1", listener.getsockname()[1], client)
            dialled_peer, _ = await in_thread(listener.accept)
        await until(lambda: len(taken) == 2)
        outer.sendall(b"to the accepted")
        dialled_peer.sendall(b"to the dialled")
        await deferLater(reactor, 0.1, lambda: None)
        gc.collect()  # the transports go: never the connections
        taken["accepted"].setblocking(True)
        taken["dialled"].setblocking(True)
        assert taken["accepted"].recv(100) == b"to the accepted"
        assert taken["dialled"].recv(100) == b"to the dialled"
        taken["accepted"].sendall(b"back")
        assert outer.recv(100) == b"back"
        assert heard == []  # Twisted read nothing and lost nothing
    finally:
        await port.stopListening()
        for sock in (*taken.values(), outer, dialled_peer):
            sock.close()
