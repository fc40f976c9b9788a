"""
The client against hostile servers over real TCP: stalls, deaths mid-stream, refusals, garbage.

Deadlines and backoffs run on a fake clock (``HttpSandbox(clock=...)``) that a driver advances
only once the server really holds the request, so attempt counts are exact and no test waits
for a real timeout.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import Clock, deferLater

from sandboxd_client import (
    ExecResult,
    HttpSandbox,
    ProtocolError,
    RetryPolicy,
    SandboxBusy,
    SandboxError,
    SandboxHandle,
    SandboxNotFound,
    SandboxUnavailable,
    TooLarge,
    encode_handle,
)

from .client_hostile import (
    Hostile,
    die_after,
    error,
    garbage_factory,
    reset,
    respond,
    stall,
    stall_body,
    trickle,
)
from .servers import listen, make_client, url_of

# On the fake clock: long deadlines, short backoffs (the driver tells them apart by length).
SLOW = RetryPolicy(attempts=3, timeout=100, max_timeout=150, backoff=0.01, max_backoff=0.02)


class Rig:
    """A hostile server, a client on a fake clock, and a handle routed to the server."""

    def __init__(self, tmp_path: Path, **client_kwargs: Any) -> None:
        self.server = Hostile()
        self.port = listen(self.server.app.resource())
        self.url = url_of(self.port)
        self.clock = Clock()
        client_kwargs.setdefault("exec_idle_timeout", 30.0)
        client_kwargs.setdefault("retry", SLOW)
        self.client: HttpSandbox = make_client(self.url, clock=self.clock, **client_kwargs)
        self.handle: SandboxHandle = encode_handle(self.url, "sb-1")
        self.tmp = tmp_path

    async def until(self, ready: Callable[[], object]) -> None:
        """Let the reactor run until ``ready()`` (a safety bound turns a hang into a failure)."""
        for _ in range(20000):
            if ready():
                return
            await deferLater(reactor, 0.0005, lambda: None)
        raise AssertionError("condition never became true")

    async def drive(self, d: Deferred[Any], armed: Callable[[], object] = lambda: True) -> None:
        """
        Run ``d`` to completion against stalling actions: each time the server holds a request
        (and ``armed()``, e.g. the client has seen the body bytes sent so far), fire the
        client's pending deadline; each time the client sleeps, end its backoff.
        """
        while not d.called:
            await self.until(
                lambda: d.called or (self.server.holding and armed()) or self._sleeping()
            )
            if d.called:
                break
            if self.server.holding:
                self.clock.advance(1000)  # the deadline of the held request fires
                await self.until(lambda: d.called or not self.server.holding)
            else:
                self.clock.advance(1000)  # the backoff ends: the next attempt starts

    def _sleeping(self) -> bool:
        # Between attempts the only pending timer is the backoff, and it is short.
        calls = self.clock.getDelayedCalls()
        return bool(calls) and all(c.getTime() - self.clock.seconds() <= 1 for c in calls)

    async def outcome(self, d: Deferred[Any], armed: Callable[[], object] = lambda: True) -> Any:
        await self.drive(d, armed)
        return await d

    async def close(self) -> None:
        await self.client.close()
        await self.port.stopListening()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    pytest_twisted.blockon(ensureDeferred(r.close()))


Call = Callable[[HttpSandbox, SandboxHandle, Path], Awaitable[Any]]


def _local(tmp: Path) -> str:
    path = tmp / "local.bin"
    path.write_bytes(b"x" * 1000)
    return str(path)


IDEMPOTENT: dict[str, tuple[str, Call]] = {
    "exists": ("GET exists", lambda c, h, t: c.exists(h, "f")),
    "size": ("GET size", lambda c, h, t: c.size(h, "f")),
    "disk_usage": ("GET disk-usage", lambda c, h, t: c.disk_usage(h)),
    "walk": ("GET walk", lambda c, h, t: c.walk(h)),
    "ready": ("GET ready", lambda c, h, t: c.ready(h)),
    "download": ("GET file", lambda c, h, t: c.download(h, "f")),
    "download_to_file": ("GET file", lambda c, h, t: c.download_to_file(h, "f", str(t / "o"))),
    "upload": ("PUT file", lambda c, h, t: c.upload(h, "f", b"data")),
    "upload_file": ("PUT file", lambda c, h, t: c.upload_file(h, "f", _local(t))),
    "delete": ("DELETE file", lambda c, h, t: c.delete(h, "f")),
    "mkdir": ("POST mkdir", lambda c, h, t: c.mkdir(h, "d")),
    "rmdir": ("DELETE dir", lambda c, h, t: c.rmdir(h, "d")),
    "mark_ready": ("POST mark-ready", lambda c, h, t: c.mark_ready(h)),
    "kill": ("kill", lambda c, h, t: c.kill(h)),
    "stats": ("GET stats", lambda c, h, t: c.stats(h)),
    "health": ("healthz", lambda c, h, t: c.health()),
    "list": ("list", lambda c, h, t: c.list_sandboxes()),
}

ONCE: dict[str, tuple[str, Call]] = {
    "create": ("create", lambda c, h, t: c.create()),
    "exec": ("POST exec", lambda c, h, t: c.exec(h, ["sleep", "1"])),
    "persist": ("POST persist", lambda c, h, t: c.persist(h, True)),
    "rename": ("POST rename", lambda c, h, t: c.rename(h, "a", "b")),
    "resolve_tools": ("tools/resolve", lambda c, h, t: c.resolve_tools({"t": "http://m"})),
}


@pytest.mark.parametrize("name", sorted(IDEMPOTENT))
@pytest_twisted.ensureDeferred
async def test_stalled_idempotent_calls_are_retried_then_busy(rig: Rig, name: str) -> None:
    kind, call = IDEMPOTENT[name]
    rig.server.default = stall()
    d = ensureDeferred(call(rig.client, rig.handle, rig.tmp))
    with pytest.raises(SandboxBusy, match="gave up after 3 attempts"):
        await rig.outcome(d)
    assert rig.server.hits == {kind: SLOW.attempts}
    assert rig.clock.getDelayedCalls() == []
    assert not [p for p in os.listdir(rig.tmp) if p.endswith(".part")]


@pytest.mark.parametrize("name", sorted(ONCE))
@pytest_twisted.ensureDeferred
async def test_stalled_calls_that_must_not_repeat_are_sent_once(rig: Rig, name: str) -> None:
    kind, call = ONCE[name]
    rig.server.default = stall()
    d = ensureDeferred(call(rig.client, rig.handle, rig.tmp))
    with pytest.raises(SandboxBusy):
        await rig.outcome(d)
    assert rig.server.hits == {kind: 1}
    assert rig.clock.getDelayedCalls() == []  # no retry is pending either


@pytest_twisted.ensureDeferred
async def test_a_retry_recovers_from_one_stall(rig: Rig) -> None:
    rig.server.on("GET exists", stall(), respond(200, b'{"exists": true}'))
    assert await rig.outcome(ensureDeferred(rig.client.exists(rig.handle, "f"))) is True
    assert rig.server.hits["GET exists"] == 2


@pytest_twisted.ensureDeferred
async def test_a_stalled_body_is_busy_and_retried(rig: Rig) -> None:
    dest = rig.tmp / "dest"
    dest.write_bytes(b"old")
    rig.server.default = stall_body(b"partial", length=100)
    seen: list[int] = []
    d = ensureDeferred(
        rig.client.download_to_file(
            rig.handle, "f", str(dest), on_progress=lambda n, t: seen.append(n)
        )
    )
    with pytest.raises(SandboxBusy):  # fired by the body deadline, after the headers came
        await rig.outcome(d, armed=lambda: len(seen) == rig.server.hits["GET file"])
    assert seen == [7] * SLOW.attempts
    assert rig.server.hits["GET file"] == SLOW.attempts
    assert dest.read_bytes() == b"old"
    assert sorted(os.listdir(rig.tmp)) == ["dest"]


@pytest.mark.parametrize(
    ("name", "kind", "gone"),
    [
        ("delete", "DELETE file", error(404, "FileNotFoundError")),
        ("rmdir", "DELETE dir", error(404, "FileNotFoundError")),
        ("kill", "kill", error(404, "SandboxNotFound")),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_removal_found_gone_after_a_timeout_is_done(
    rig: Rig, name: str, kind: str, gone: Any
) -> None:
    call = IDEMPOTENT[name][1]
    rig.server.on(kind, stall(), gone)
    assert await rig.outcome(ensureDeferred(call(rig.client, rig.handle, rig.tmp))) is None
    assert rig.server.hits[kind] == 2
    rig.server.on(kind, gone)  # without an earlier timeout, "gone" is an answer
    with pytest.raises((FileNotFoundError, SandboxNotFound)):
        await call(rig.client, rig.handle, rig.tmp)


@pytest_twisted.ensureDeferred
async def test_exec_output_stall_is_busy_with_chunks_kept(rig: Rig) -> None:
    rig.server.default = stall_body(b'{"o": "aGk="}\n{"o": ""}\n')
    chunks: list[bytes] = []
    d = ensureDeferred(rig.client.exec(rig.handle, ["x"], on_output=chunks.append))
    with pytest.raises(SandboxBusy):
        await rig.outcome(d, armed=lambda: chunks)
    assert chunks == [b"hi"]
    assert rig.server.hits["POST exec"] == 1


FRAMES = b'{"o": "b25l"}\n{"o": ""}\n{"o": "dHdv"}\n'


@pytest.mark.parametrize(
    "tail",
    [b"", b'{"exit": 0, "out": "b25l', b"\n\n"],
    ids=["between-frames", "mid-frame", "blank-lines"],
)
@pytest_twisted.ensureDeferred
async def test_exec_stream_that_dies_is_not_found_with_chunks_kept(rig: Rig, tail: bytes) -> None:
    rig.server.default = die_after(FRAMES + tail)
    chunks: list[bytes] = []
    with pytest.raises(SandboxNotFound):
        await rig.client.exec(rig.handle, ["x"], on_output=chunks.append)
    assert chunks == [b"one", b"two"]


@pytest_twisted.ensureDeferred
async def test_exec_stream_that_ends_cleanly_without_exit_is_not_found(rig: Rig) -> None:
    rig.server.default = respond(200, FRAMES, "application/x-ndjson")
    chunks: list[bytes] = []
    with pytest.raises(SandboxNotFound):
        await rig.client.exec(rig.handle, ["x"], on_output=chunks.append)
    assert chunks == [b"one", b"two"]


@pytest_twisted.ensureDeferred
async def test_exec_result_stands_when_the_replica_dies_after_the_exit_frame(rig: Rig) -> None:
    rig.server.default = die_after(FRAMES + b'{"exit": 2, "out": "b25l", "err": ""}\n')
    assert await rig.client.exec(rig.handle, ["x"]) == ExecResult(2, b"one", b"", False)


@pytest_twisted.ensureDeferred
async def test_process_output_stands_when_the_replica_dies_after_the_exit(rig: Rig) -> None:
    rig.server.default = die_after(b'{"o":"b25l","at":0}\n{"exit":2}\n')
    chunks: list[Any] = []
    result = await rig.client.output(rig.handle, "p1", on_output=chunks.append)
    assert (result.exit_code, result.offset) == (2, 3)
    assert [chunk.data for chunk in chunks] == [b"one"]


@pytest_twisted.ensureDeferred
async def test_a_watch_stream_that_ends_cleanly_is_not_found(rig: Rig) -> None:
    change = b'{"event":"create","path":"/a","dir":false}\n'
    rig.server.default = respond(200, change, "application/x-ndjson")
    events: list[Any] = []
    with pytest.raises(SandboxNotFound, match="the replica is gone"):
        await rig.client.watch(rig.handle, on_event=events.append)
    assert [(event.event, event.path) for event in events] == [("create", "/a")]


@pytest_twisted.ensureDeferred
async def test_exec_frames_trickled_one_byte_at_a_time(rig: Rig) -> None:
    final = b'{"exit": 0, "out": "b25ldHdv", "err": "", "truncated": false}'  # no newline
    rig.server.default = trickle(FRAMES + b"\r\n" + final)
    chunks: list[bytes] = []
    result = await rig.client.exec(rig.handle, ["x"], on_output=chunks.append)
    assert chunks == [b"one", b"two"]
    assert result == ExecResult(0, b"onetwo", b"", False)


@pytest.mark.parametrize(
    ("frame", "exc"),
    [
        ({"error": "FileNotFoundError", "detail": "cwd"}, FileNotFoundError),
        ({"error": "SandboxNotFound", "detail": "killed"}, SandboxNotFound),
        ({"error": "BadRequest", "detail": "cwd"}, ValueError),
        ({"error": "NoCapacity", "detail": "pids"}, SandboxUnavailable),
        ({"error": "SpawnFailed", "detail": "boom"}, SandboxError),
    ],
)
@pytest_twisted.ensureDeferred
async def test_exec_in_band_errors_are_mapped(rig: Rig, frame: dict[str, str], exc: type) -> None:
    rig.server.default = respond(200, FRAMES + json.dumps(frame).encode() + b"\n")
    chunks: list[bytes] = []
    with pytest.raises(exc, match=frame["detail"]):
        await rig.client.exec(rig.handle, ["x"], on_output=chunks.append)
    assert chunks == [b"one", b"two"]


@pytest_twisted.ensureDeferred
async def test_exec_on_output_exception_drops_the_stream(rig: Rig) -> None:
    rig.server.default = stall_body(FRAMES)

    def explode(chunk: bytes) -> None:
        raise KeyError("app bug")

    with pytest.raises(KeyError):
        await rig.client.exec(rig.handle, ["x"], on_output=explode)
    await rig.until(lambda: not rig.server.holding)  # the connection was dropped


@pytest_twisted.ensureDeferred
async def test_truncated_download_is_not_found_and_leaves_the_destination(rig: Rig) -> None:
    dest = rig.tmp / "dest"
    dest.write_bytes(b"old")
    rig.server.default = die_after(b"x" * 500, length=1000)
    with pytest.raises(SandboxNotFound):
        await rig.client.download_to_file(rig.handle, "f", str(dest))
    with pytest.raises(SandboxNotFound):
        await rig.client.download(rig.handle, "f")
    assert dest.read_bytes() == b"old"
    assert sorted(os.listdir(rig.tmp)) == ["dest"]
    assert rig.server.hits["GET file"] == 2  # "dead" is never retried


@pytest_twisted.ensureDeferred
async def test_connection_reset_is_not_found_or_unavailable(rig: Rig) -> None:
    rig.server.default = reset()
    with pytest.raises(SandboxNotFound):
        await rig.client.exists(rig.handle, "f")
    with pytest.raises(SandboxNotFound):
        await rig.client.exec(rig.handle, ["x"])
    with pytest.raises(SandboxUnavailable):
        await rig.client.create()
    assert rig.server.hits == {"GET exists": 1, "POST exec": 1, "create": 1}


@pytest_twisted.ensureDeferred
async def test_refused_connections(closed_port: int) -> None:
    url = f"http://127.0.0.1:{closed_port}"
    # Twisted's HostnameEndpoint reports a refusal only after its 0.3 s attempt delay.
    client = make_client(url, retry=RetryPolicy())
    handle = encode_handle(url, "sb-1")
    try:
        for call in (
            client.exists(handle, "f"),
            client.exec(handle, ["x"]),
            client.kill(handle),
            client.download(handle, "f"),
            client.upload(handle, "f", b"x"),
        ):
            with pytest.raises(SandboxNotFound):
                await call
        for service_call in (client.create(), client.health(), client.list_sandboxes()):
            with pytest.raises(SandboxUnavailable):
                await service_call
    finally:
        await client.close()


GARBAGE: list[tuple[str, str, Any, Call, type[BaseException]]] = [
    (
        "text-200",
        "GET exists",
        respond(200, b"hello", "text/plain"),
        lambda c, h, t: c.exists(h, "f"),
        ProtocolError,
    ),
    ("empty-200", "GET exists", respond(200, b""), lambda c, h, t: c.exists(h, "f"), ProtocolError),
    ("list-200", "GET walk", respond(200, b"[1, 2]"), lambda c, h, t: c.walk(h), ProtocolError),
    (
        "bad-entry",
        "GET walk",
        respond(200, b'{"entries": [{"path": 1}]}'),
        lambda c, h, t: c.walk(h),
        ProtocolError,
    ),
    (
        "str-size",
        "GET size",
        respond(200, b'{"size": "big"}'),
        lambda c, h, t: c.size(h, "f"),
        ProtocolError,
    ),
    (
        "int-bool",
        "GET ready",
        respond(200, b'{"ready": 1}'),
        lambda c, h, t: c.ready(h),
        ProtocolError,
    ),
    (
        "html-502",
        "GET disk-usage",
        respond(502, b"<html>Bad Gateway</html>", "text/html"),
        lambda c, h, t: c.disk_usage(h),
        SandboxError,
    ),
    (
        "html-404",
        "GET file",
        respond(404, b"<html>nope</html>", "text/html"),
        lambda c, h, t: c.download(h, "f"),
        SandboxNotFound,
    ),
    (
        "json-500",
        "POST mkdir",
        error(500, "Boom", "kaput"),
        lambda c, h, t: c.mkdir(h, "d"),
        SandboxError,
    ),
    ("redirect", "GET exists", respond(301, b""), lambda c, h, t: c.exists(h, "f"), SandboxError),
    ("413", "PUT file", error(413, "TooLarge"), lambda c, h, t: c.upload(h, "f", b"x"), TooLarge),
    (
        "507",
        "PUT file",
        error(507, "InsufficientStorage"),
        lambda c, h, t: c.upload(h, "f", b"x"),
        OSError,
    ),
    ("503", "create", error(503, "Draining"), lambda c, h, t: c.create(), SandboxUnavailable),
    (
        "ftp-pod",
        "create",
        respond(200, b'{"pod_url": "ftp://x", "remote_id": "r"}'),
        lambda c, h, t: c.create(),
        ProtocolError,
    ),
    (
        "no-rid",
        "create",
        respond(200, b'{"pod_url": "http://x"}'),
        lambda c, h, t: c.create(),
        ProtocolError,
    ),
    (
        "exec-text",
        "POST exec",
        respond(200, b"not json\n"),
        lambda c, h, t: c.exec(h, ["x"]),
        ProtocolError,
    ),
    (
        "exec-array",
        "POST exec",
        respond(200, b"[1]\n"),
        lambda c, h, t: c.exec(h, ["x"]),
        ProtocolError,
    ),
    (
        "exec-str-exit",
        "POST exec",
        respond(200, b'{"exit": "0"}\n'),
        lambda c, h, t: c.exec(h, ["x"]),
        ProtocolError,
    ),
    (
        "exec-bad-b64",
        "POST exec",
        respond(200, b'{"o": "!!!"}\n'),
        lambda c, h, t: c.exec(h, ["x"]),
        ProtocolError,
    ),
    (
        "exec-400",
        "POST exec",
        error(400, "BadRequest", "cmd"),
        lambda c, h, t: c.exec(h, ["x"]),
        ValueError,
    ),
    (
        "tools-garbage",
        "tools/resolve",
        respond(200, b'{"tools": {"t": {"sha": 5}}}'),
        lambda c, h, t: c.resolve_tools({"t": "u"}),
        ProtocolError,
    ),
]


@pytest.mark.parametrize(
    ("kind", "action", "call", "exc"), [g[1:] for g in GARBAGE], ids=[g[0] for g in GARBAGE]
)
@pytest_twisted.ensureDeferred
async def test_garbage_answers_raise_clear_errors(
    rig: Rig, kind: str, action: Any, call: Call, exc: type[BaseException]
) -> None:
    rig.server.on(kind, action)
    with pytest.raises(exc) as info:
        await call(rig.client, rig.handle, rig.tmp)
    assert not isinstance(info.value, SandboxBusy)
    assert rig.server.hits == {kind: 1}


@pytest_twisted.ensureDeferred
async def test_error_details_survive(rig: Rig) -> None:
    rig.server.on("POST mkdir", error(500, "Boom", "kaput"))
    rig.server.on("PUT file", error(507, "InsufficientStorage", "disk full"))
    with pytest.raises(SandboxError) as info:
        await rig.client.mkdir(rig.handle, "d")
    assert (info.value.status, info.value.error, info.value.detail) == (500, "Boom", "kaput")
    with pytest.raises(OSError) as oserr:
        await rig.client.upload(rig.handle, "f", b"x")
    assert oserr.value.errno == errno.ENOSPC


@pytest_twisted.ensureDeferred
async def test_overlong_exec_line_is_refused(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_exec_line=1000)
    try:
        rig.server.default = stall_body(b'{"o": "' + b"A" * 5000)
        with pytest.raises(ProtocolError, match="longer than 1000"):
            await rig.client.exec(rig.handle, ["x"])
        await rig.until(lambda: not rig.server.holding)
    finally:
        await rig.close()


@pytest_twisted.ensureDeferred
async def test_non_http_server_is_a_protocol_error(tmp_path: Path) -> None:
    port = reactor.listenTCP(0, garbage_factory(), interface="127.0.0.1")  # type: ignore[attr-defined]
    url = url_of(port)
    client = make_client(url)
    try:
        with pytest.raises(ProtocolError):
            await client.exists(encode_handle(url, "sb"), "f")
    finally:
        await client.close()
        await port.stopListening()
