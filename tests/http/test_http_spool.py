"""Large request bodies written in a real thread pool (``SpoolThreads``), through a real site
on a real loopback port: the bytes land exact, and a client that goes mid-upload leaves no
spool behind."""

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor as running
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.interfaces import IAddress
from twisted.internet.protocol import Protocol
from twisted.internet.task import deferLater
from twisted.python.threadpool import ThreadPool

from sandboxd.web.site import Channel, SpoolingSite, make_site
from sandboxd.web.spool import AHEAD, SpoolThreads
from tests.http.http_harness import Harness
from tests.http.test_http_web import put, put_chunked, send

CHUNK = 1 << 20

reactor: Any = running


def pattern(total: int) -> bytes:
    """Deterministic data whose every MiB differs (a misplaced one changes the digest)."""
    return b"".join(i.to_bytes(8, "big") * (CHUNK // 8) for i in range(total // CHUNK))


@pytest.fixture
def pool() -> Iterator[ThreadPool]:
    threads = ThreadPool(minthreads=0, maxthreads=2, name="test-spool")
    threads.start()
    yield threads
    if threads.started:  # a test may stop it first
        threads.stop()


@pytest.fixture
def threaded(harness: Harness, spool_dir: Path, pool: ThreadPool) -> Iterator[SpoolingSite]:
    yield make_site(
        harness.api.app.resource(),
        1 << 30,
        spool_dir=str(spool_dir),
        spool_threads=SpoolThreads(reactor, pool),
    )


@pytest.fixture
def port(threaded: SpoolingSite) -> Iterator[int]:
    listening = reactor.listenTCP(0, threaded, interface="127.0.0.1")
    yield listening.getHost().port
    listening.stopListening()


def spool_fds(spool_dir: Path) -> list[str]:
    """This process's descriptors open on a file of ``spool_dir`` (unnamed spools included)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed since
        if target.startswith(str(spool_dir)):
            found.append(target)
    return found


@pytest_twisted.ensureDeferred
async def test_a_large_upload_written_in_threads_arrives_exact(
    harness: Harness, port: int, spool_dir: Path
) -> None:
    rid = harness.create()
    body = pattern(3 * AHEAD)
    chunks = [body[i : i + 300_000] for i in range(0, len(body), 300_000)]
    for raw in (put(rid, body), put_chunked(rid, chunks)):
        answer = await send(port, raw)
        assert answer.status == 204, answer.body
        with open(os.path.join(harness.workspace(rid), "f"), "rb") as f:
            assert hashlib.sha256(f.read()).digest() == hashlib.sha256(body).digest()
        assert os.listdir(spool_dir) == [] and spool_fds(spool_dir) == []


class Abandon(Protocol):
    """Sends the head of an upload and part of its body, then goes."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.raw)
        self.transport.loseConnection()


@pytest_twisted.ensureDeferred
async def test_a_client_gone_mid_upload_leaves_no_spool(
    harness: Harness,
    port: int,
    threaded: SpoolingSite,
    pool: ThreadPool,
    spool_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[Channel] = []

    def build(address: IAddress) -> Channel:
        channel: Channel = build_protocol(address)
        built.append(channel)
        return channel

    build_protocol = threaded.buildProtocol
    monkeypatch.setattr(threaded, "buildProtocol", build)
    rid = harness.create()
    body = pattern(2 * AHEAD)
    raw = put(rid, body)[: -len(body) // 2]  # half the body it promises
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), Abandon(raw))
    while not built:  # the server's side is made
        await deferLater(reactor, 0.01, lambda: None)
    (channel,) = built
    assert channel.closed is not None
    await channel.closed
    pool.stop()  # every write returned; what they report runs in the next turns
    for _ in range(3):
        await deferLater(reactor, 0, lambda: None)
    assert spool_fds(spool_dir) == []
    assert os.listdir(harness.workspace(rid)) == []
