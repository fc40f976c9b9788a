"""The twisted.web site (``sandboxd.web.site``): body limit (413), JSON answers to malformed
requests.

``LimitedRequest`` is tested directly (``DummyChannel``) and through a real ``Site`` on a real
loopback port, with raw HTTP bytes so the test controls ``Content-Length`` and chunking.
"""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web.test.requesthelper import DummyChannel

from sandboxd.core.files import workspace
from sandboxd.core.manager import SandboxManager
from sandboxd.errors import InsufficientStorage, SandboxdError
from sandboxd.http import parse, wire
from sandboxd.web.site import (
    READ_SIZE,
    SEND_SIZE,
    SPOOL_MIN,
    LimitedRequest,
    Spool,
    SpoolingSite,
    Utf8URLs,
    _Discard,
    can_spool,
    make_site,
)
from tests.http.http_harness import Harness

LIMIT = 64


class Collect(Protocol):
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


def dechunk(data: bytes) -> bytes:
    body = bytearray()
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(body)
        body += data[:size]
        data = data[size + 2 :]


class Answer:
    def __init__(self, raw: bytes) -> None:
        head, _, self.body = raw.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
        if self.headers.get("transfer-encoding") == "chunked":
            self.body = dechunk(self.body)

    def json(self) -> Any:
        assert self.headers["content-type"] == "application/json"
        return json.loads(self.body)


@pytest.fixture
def site_port(harness: Harness) -> Any:
    from twisted.internet import reactor

    port = reactor.listenTCP(0, make_site(harness.api.app.resource(), LIMIT), interface="127.0.0.1")
    yield port.getHost().port
    port.stopListening()


async def send(port: int, raw: bytes) -> Answer:
    from twisted.internet import reactor

    protocol = Collect(raw)
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), protocol)
    # A hang guard (a server that never closes), not a timing assertion.
    return Answer(await protocol.done.addTimeout(60, reactor))


def put(rid: str, body: bytes, path: str = "f") -> bytes:
    return (
        f"PUT /sandboxes/{rid}/file?path={path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def put_chunked(rid: str, chunks: list[bytes]) -> bytes:
    head = (
        f"PUT /sandboxes/{rid}/file?path=f HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    return head + body + b"0\r\n\r\n"


@pytest_twisted.ensureDeferred
async def test_an_upload_within_the_limit_is_stored(harness: Harness, site_port: int) -> None:
    rid = harness.create()
    answer = await send(site_port, put(rid, b"x" * LIMIT))
    assert answer.status == 204
    with open(os.path.join(harness.workspace(rid), "f"), "rb") as f:
        assert f.read() == b"x" * LIMIT


@pytest_twisted.ensureDeferred
async def test_a_declared_body_over_the_limit_is_413(harness: Harness, site_port: int) -> None:
    rid = harness.create()
    answer = await send(site_port, put(rid, b"x" * (LIMIT + 1)))
    assert answer.status == 413
    assert answer.json()["error"] == "TooLarge"
    assert os.listdir(harness.workspace(rid)) == []


@pytest_twisted.ensureDeferred
async def test_a_chunked_body_over_the_limit_is_413(harness: Harness, site_port: int) -> None:
    rid = harness.create()
    answer = await send(site_port, put_chunked(rid, [b"a" * 40, b"b" * 40, b"c" * 40]))
    assert answer.status == 413
    assert answer.json()["error"] == "TooLarge"
    assert os.listdir(harness.workspace(rid)) == []


@pytest_twisted.ensureDeferred
async def test_a_chunked_body_within_the_limit_is_stored(harness: Harness, site_port: int) -> None:
    rid = harness.create()
    answer = await send(site_port, put_chunked(rid, [b"a" * 30, b"b" * 30]))
    assert answer.status == 204
    with open(os.path.join(harness.workspace(rid), "f"), "rb") as f:
        assert f.read() == b"a" * 30 + b"b" * 30


@pytest_twisted.ensureDeferred
async def test_a_json_body_over_the_limit_is_413(harness: Harness, site_port: int) -> None:
    body = json.dumps({"env": {"A": "x" * LIMIT}}).encode()
    raw = (
        b"POST /sandboxes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    answer = await send(site_port, raw)
    assert answer.status == 413
    assert harness.manager.sandboxes == {}


@pytest_twisted.ensureDeferred
async def test_an_overlong_header_line_gets_a_json_400(site_port: int) -> None:
    raw = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"y" * 20000 + b"\r\n\r\n"
    answer = await send(site_port, raw)
    assert answer.status == 400
    assert answer.json()["error"] == "BadRequest"
    assert answer.headers["connection"] == "close"


@pytest_twisted.ensureDeferred
async def test_an_overlong_request_line_gets_a_json_400(site_port: int) -> None:
    answer = await send(site_port, b"GET /" + b"a" * 70000)
    assert answer.status == 400
    assert answer.json()["error"] == "BadRequest"


@pytest_twisted.ensureDeferred
async def test_a_malformed_request_gets_a_json_400(site_port: int) -> None:
    raw = b"PUT /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: many\r\n\r\n"
    answer = await send(site_port, raw)
    assert answer.status == 400
    assert answer.json()["error"] == "BadRequest"


@pytest_twisted.ensureDeferred
async def test_a_url_that_is_not_utf8_gets_a_json_400(site_port: int) -> None:
    raw = b"GET /sandboxes/%ff%fe/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answer = await send(site_port, raw)
    assert answer.status == 400
    assert answer.json() == {"error": "BadRequest", "detail": "the URL is not UTF-8"}


@pytest_twisted.ensureDeferred
async def test_a_utf8_url_reaches_the_api(site_port: int) -> None:
    raw = b"GET /sandboxes/%C3%A9/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answer = await send(site_port, raw)
    assert answer.status == 404
    assert answer.json()["error"] == "SandboxNotFound"


def open_then(change: Any) -> Any:
    """``SandboxManager.open_for_reading`` that changes the file right after opening it."""
    original = SandboxManager.open_for_reading

    def opened(self: SandboxManager, sandbox: Any, parts: Any) -> Any:
        def changed(result: Any) -> Any:
            change(os.path.join(self.layout.workspace(sandbox.rid), *parts))
            return result

        return original(self, sandbox, parts).addCallback(changed)

    return opened


def get_file(rid: str, path: str, close: bool) -> bytes:
    connection = "Connection: close\r\n" if close else ""
    return f"GET /sandboxes/{rid}/file?path={path} HTTP/1.1\r\nHost: x\r\n{connection}\r\n".encode()


@pytest_twisted.ensureDeferred
async def test_a_download_sends_its_content_length_while_the_file_grows(
    harness: Harness, site_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rid = harness.create()
    with open(os.path.join(harness.workspace(rid), "log"), "wb") as f:
        f.write(b"a" * 100_000)

    def grow(path: str) -> None:
        with open(path, "ab") as f:
            f.write(b"b" * 50_000)

    monkeypatch.setattr(SandboxManager, "open_for_reading", open_then(grow))
    answer = await send(site_port, get_file(rid, "log", close=True))
    assert answer.status == 200
    assert answer.headers["content-length"] == "100000"
    assert answer.body == b"a" * 100_000  # nothing after: the connection stays in step


@pytest_twisted.ensureDeferred
async def test_a_download_of_a_file_that_shrinks_ends_the_connection(
    harness: Harness, site_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rid = harness.create()
    with open(os.path.join(harness.workspace(rid), "log"), "wb") as f:
        f.write(b"a" * 100_000)
    monkeypatch.setattr(
        SandboxManager, "open_for_reading", open_then(lambda path: os.truncate(path, 10_000))
    )
    # Keep-alive: a client waiting for the promised bytes must see the connection end.
    answer = await send(site_port, get_file(rid, "log", close=False))
    assert answer.status == 200
    assert answer.headers["content-length"] == "100000"
    assert answer.body == b"a" * 10_000


def test_utf8_urls_is_a_leaf(harness: Harness) -> None:
    wrapped = Utf8URLs(harness.api.app.resource())
    assert wrapped.isLeaf
    assert wrapped.getChildWithDefault(b"x", None) is wrapped
    with pytest.raises(NotImplementedError):
        wrapped.putChild(b"x", wrapped)


def test_make_site() -> None:
    site = make_site(Utf8URLs(None), 123)
    assert site.requestFactory.max_body == 123
    assert issubclass(site.requestFactory, LimitedRequest)
    assert site.displayTracebacks is False


def test_connections_read_and_send_in_large_pieces() -> None:
    site = make_site(Utf8URLs(None), 123)
    channel = site.buildProtocol(None)
    transport = StringTransport()
    channel.makeConnection(transport)
    assert transport.bufferSize == READ_SIZE
    assert transport.SEND_LIMIT == SEND_SIZE
    channel.connectionLost(Failure(ConnectionDone()))


# LimitedRequest directly


def limited(max_body: int) -> LimitedRequest:
    request = LimitedRequest(DummyChannel())
    request.max_body = max_body
    return request


def test_a_small_declared_length_is_kept() -> None:
    request = limited(10)
    request.gotLength(4)
    request.handleContentChunk(b"abcd")
    assert not request.too_large
    request.content.seek(0)
    assert request.content.read() == b"abcd"


def test_a_large_declared_length_is_refused_before_any_byte() -> None:
    request = limited(10)
    request.gotLength(11)
    assert request.too_large
    request.handleContentChunk(b"x" * 11)
    assert isinstance(request.content, _Discard)
    assert request.content.read() == b""


def test_an_unknown_length_is_counted_as_it_arrives() -> None:
    request = limited(10)
    request.gotLength(None)
    kept = request.content
    request.handleContentChunk(b"x" * 6)
    assert not request.too_large
    request.handleContentChunk(b"x" * 5)
    assert request.too_large
    assert kept.closed
    assert isinstance(request.content, _Discard)
    request.handleContentChunk(b"more")


def test_refusing_without_content_yet() -> None:
    request = limited(1)
    request.content = None
    request.handleContentChunk(b"xx")
    assert request.too_large


def test_discard() -> None:
    discard = _Discard()
    discard.write(b"dropped")
    assert discard.seek(0, 0) == 0
    assert discard.tell() == 0
    assert discard.read() == b""
    assert discard.read(10) == b""
    discard.close()


@pytest_twisted.ensureDeferred
async def test_a_chunked_json_body_over_the_json_limit_is_413(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a Content-Length the JSON limit is checked on the bytes themselves (else a
    chunked body up to the upload limit would be read into memory whole)."""
    from twisted.internet import reactor

    monkeypatch.setattr(parse, "JSON_BODY_LIMIT", 100)
    port = reactor.listenTCP(
        0, make_site(harness.api.app.resource(), 1 << 20), interface="127.0.0.1"
    )
    try:
        body = json.dumps({"env": {"A": "x" * 200}}).encode()
        raw = (
            b"POST /sandboxes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        )
        answer = await send(port.getHost().port, raw)
        assert answer.status == 413
        assert answer.json()["error"] == "TooLarge"
        assert harness.manager.sandboxes == {}
        small = json.dumps({"env": {"A": "x"}}).encode()
        raw = (
            b"POST /sandboxes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(small), small)
        )
        assert (await send(port.getHost().port, raw)).status == 200
    finally:
        await port.stopListening()


# Large bodies spooled on the workspaces' filesystem


@pytest.fixture
def spooling_port(harness: Harness, spool_dir: Path) -> Any:
    from twisted.internet import reactor

    site = make_site(harness.api.app.resource(), 1 << 30, spool_dir=str(spool_dir))
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    yield port.getHost().port
    port.stopListening()


def never_copied(source: Any, fd: int) -> None:
    raise AssertionError("a spooled body was copied instead of linked")


BIG = bytes(range(256)) * (SPOOL_MIN // 256 + 100)


@pytest_twisted.ensureDeferred
async def test_a_large_upload_is_linked_from_its_spool_not_copied(
    harness: Harness, spooling_port: int, spool_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workspace, "_copy_into", never_copied)
    rid = harness.create()
    for raw in (put(rid, BIG), put_chunked(rid, [BIG[:70_000], BIG[70_000:]])):
        answer = await send(spooling_port, raw)
        assert answer.status == 204, answer.body
        with open(os.path.join(harness.workspace(rid), "f"), "rb") as f:
            assert f.read() == BIG
        assert os.listdir(harness.workspace(rid)) == ["f"]
        assert os.listdir(spool_dir) == []  # the spool never had a name


@pytest_twisted.ensureDeferred
async def test_a_large_json_body_is_read_from_its_spool(
    harness: Harness, spooling_port: int
) -> None:
    body = json.dumps({"env": {"A": "x" * SPOOL_MIN}}).encode()
    raw = (
        b"POST /sandboxes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    answer = await send(spooling_port, raw)
    assert answer.status == 200, answer.body
    (sandbox,) = harness.manager.sandboxes.values()
    assert sandbox.env["A"] == "x" * SPOOL_MIN


@pytest_twisted.ensureDeferred
async def test_a_body_that_cannot_be_spooled_is_500_and_writes_nothing(
    harness: Harness, spooling_port: int, spool_dir: Path
) -> None:
    rid = harness.create()
    os.rmdir(spool_dir)
    answer = await send(spooling_port, put(rid, BIG))
    assert answer.status == 500
    assert answer.json() == {
        "error": "InternalError",
        "detail": "the request body could not be stored: No such file or directory",
    }
    assert os.listdir(harness.workspace(rid)) == []
    assert (await send(spooling_port, put(rid, b"small"))).status == 204  # kept in memory


def test_spooling_site_keeps_small_bodies_in_memory(spool_dir: Path) -> None:
    site = SpoolingSite(Utf8URLs(None))
    site.spool_dir = str(spool_dir)
    assert isinstance(site.getContentFile(SPOOL_MIN - 1), io.BytesIO)
    for length in (SPOOL_MIN, None):
        with site.getContentFile(length) as spool:
            assert isinstance(spool, Spool)
            assert os.fstat(spool.fileno()).st_nlink == 0
    assert os.listdir(spool_dir) == []
    site.spool_dir = None
    with site.getContentFile(None) as temporary:
        assert not isinstance(temporary, Spool | io.BytesIO)  # twisted.web's own


def test_can_spool(spool_dir: Path) -> None:
    assert can_spool(str(spool_dir))
    assert os.listdir(spool_dir) == []
    assert not can_spool(str(spool_dir / "missing"))


class Full:
    """A content file on a full disk."""

    closed = False

    def write(self, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self) -> None:
        self.closed = True
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_body_that_fills_the_disk_is_discarded_from_then_on() -> None:
    request = limited(1 << 20)
    request.gotLength(None)
    request.content = full = Full()
    request.handleContentChunk(b"x" * 10)
    assert full.closed
    assert isinstance(request.content, _Discard)
    assert request.content_error is not None and request.content_error.errno == errno.ENOSPC
    request.handleContentChunk(b"more")  # dropped
    assert not request.too_large


def test_a_body_whose_spool_cannot_be_opened_is_discarded(spool_dir: Path) -> None:
    channel = DummyChannel()
    channel.site = SpoolingSite(Utf8URLs(None))
    channel.site.spool_dir = str(spool_dir / "missing")
    request = LimitedRequest(channel)
    request.gotLength(None)
    assert isinstance(request.content, _Discard)
    assert request.content_error is not None and request.content_error.errno == errno.ENOENT


@pytest.mark.parametrize(
    ("code", "kind"), [(errno.ENOSPC, InsufficientStorage), (errno.EDQUOT, InsufficientStorage)]
)
def test_a_body_that_could_not_be_stored_is_507(code: int, kind: type) -> None:
    request = limited(1 << 20)
    request.content_error = OSError(code, os.strerror(code))
    with pytest.raises(kind, match="the request body could not be stored"):
        parse.refuse_too_large(request, 1 << 20)


def test_a_body_that_could_not_be_stored_for_another_reason_is_500() -> None:
    request = limited(1 << 20)
    request.content_error = OSError(errno.EIO, os.strerror(errno.EIO))
    with pytest.raises(SandboxdError) as raised:
        parse.refuse_too_large(request, 1 << 20)
    assert type(raised.value) is SandboxdError and wire.status_and_type(raised.value)[0] == 500
