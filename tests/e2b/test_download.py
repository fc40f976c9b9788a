"""``GET /files`` of the E2B front, on a real loopback connection kept alive: the body is
exactly the ``Content-Length`` announced when the file was opened, whatever the file does
while it is sent (the next answer on the connection must not read leftover bytes)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure

from sandboxd.e2b import files
from sandboxd.web.site import make_site
from tests.e2b.memory import Memory, memory_front


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    yield from memory_front(str(tmp_path))


@pytest.fixture
def port(memory: Memory) -> Any:
    from twisted.internet import reactor

    site: Any = make_site(memory.front.app.resource(), 1 << 20)  # a Site: a server factory
    listening: Any = reactor.listenTCP(0, site, interface="127.0.0.1")
    yield listening.getHost().port
    listening.stopListening()


class Collect(Protocol):
    """Sends ``request``, keeps every byte received until the connection ends."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.received = bytearray()
        self.done: Deferred[bytes] = Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.done.callback(bytes(self.received))


def read_then(monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> None:
    """``files.read_file`` that changes the file right after opening it."""
    original = files.read_file

    async def opened(*args: Any) -> Any:
        source, size = await original(*args)
        change()
        return source, size

    monkeypatch.setattr(files, "read_file", opened)


async def exchange(port: int, raw: bytes) -> bytes:
    from twisted.internet import reactor

    protocol = Collect(raw)
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), protocol)
    # A hang guard (a server that never closes), not a timing assertion.
    return await protocol.done.addTimeout(60, reactor)


def get(memory: Memory, entry: Any, close: bool) -> bytes:
    headers = "".join(f"{k}: {v}\r\n" for k, v in memory.envd_headers(entry).items())
    connection = "Connection: close\r\n" if close else ""
    return f"GET /files?path=log HTTP/1.1\r\nHost: x\r\n{headers}{connection}\r\n".encode()


def split(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def write_log(memory: Memory, entry: Any, size: int) -> str:
    path = os.path.join(memory.manager.layout.workspace(entry.id), "log")
    with open(path, "wb") as f:
        f.write(b"a" * size)
    return path


def append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


@pytest_twisted.ensureDeferred
async def test_a_file_that_grows_is_sent_as_long_as_announced(
    memory: Memory, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = memory.create()
    path = write_log(memory, entry, 100_000)
    read_then(monkeypatch, lambda: append(path, b"b" * 50_000))
    # Two requests on one kept-alive connection: the second answer starts where the first
    # one's announced length ends.
    raw = await exchange(port, get(memory, entry, close=False) + get(memory, entry, close=True))
    status, headers, rest = split(raw)
    assert (status, headers["content-length"]) == (200, "100000")
    assert rest[:100_000] == b"a" * 100_000
    status, headers, second = split(rest[100_000:])
    assert (status, headers["content-length"]) == (200, "150000")
    assert second == b"a" * 100_000 + b"b" * 50_000


@pytest_twisted.ensureDeferred
async def test_a_file_that_shrinks_ends_the_connection(
    memory: Memory, port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = memory.create()
    path = write_log(memory, entry, 100_000)
    read_then(monkeypatch, lambda: os.truncate(path, 10_000))
    # Kept alive: a client waiting for the promised bytes must see the connection end.
    status, headers, body = split(await exchange(port, get(memory, entry, close=False)))
    assert (status, headers["content-length"]) == (200, "100000")
    assert body == b"a" * 10_000
