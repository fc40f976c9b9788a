"""Every client method, round trip, against the contract fake over real TCP."""

from __future__ import annotations

import base64
import gc
import itertools
import json
import os
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.error import CannotListenError
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from sandboxd_client import (
    ExecResult,
    HttpSandbox,
    SandboxHandle,
    SandboxNotFound,
    SandboxSpec,
    WalkEntry,
    decode_handle,
)

from .servers import Served, make_client


@pytest_twisted.ensureDeferred
async def test_create_routes_to_the_pod_url(client: HttpSandbox, fake: Served) -> None:
    handle = await client.create(SandboxSpec(image="py", env={"A": "1"}, exposed_ports=[80]))
    route = decode_handle(handle)
    assert route.pod_url == fake.pod_url
    assert route.remote_id == "sb-1"
    assert json.loads(fake.state.seen[0].body) == {
        "image": "py",
        "env": {"A": "1"},
        "exposed_ports": [80],
    }
    await client.exists(handle, "x")
    await client.kill(handle)
    ports = [s.port for s in fake.state.seen]
    assert ports == [fake.lb_port, fake.pod_port, fake.pod_port]


@pytest_twisted.ensureDeferred
async def test_ipv6_pod_url(client: HttpSandbox, fake: Served) -> None:
    try:
        pod6 = reactor.listenTCP(0, Site(fake.state.app.resource()), interface="::1")
    except CannotListenError:
        pytest.skip("no IPv6 loopback here")
    fake.state.pod_url = f"http://[::1]:{pod6.getHost().port}"
    try:
        handle = await client.create()
        assert decode_handle(handle).base.host == "::1"
        await client.upload(handle, "a b", b"six")
        assert await client.download(handle, "a b") == b"six"
        assert (await client.exec(handle, ["echo", "v6"])).stdout == b"v6\n"
        assert fake.state.seen[-1].headers["host"] == f"[::1]:{pod6.getHost().port}"
    finally:
        await pod6.stopListening()


@pytest_twisted.ensureDeferred
async def test_files_round_trip(client: HttpSandbox, fake: Served) -> None:
    h = await client.create()
    odd = "dir one/a+b&c=d#e%f ü?.txt"
    await client.upload(h, odd, b"hello")
    assert fake.state.seen[-1].args == {"path": [odd]}
    assert await client.download(h, odd) == b"hello"
    assert await client.download(h, "/" + odd) == b"hello"
    assert await client.exists(h, odd) is True
    assert await client.exists(h, "nope") is False
    assert await client.size(h, odd) == 5
    assert await client.size(h, "nope") is None
    await client.upload(h, "empty", b"")
    assert await client.download(h, "empty") == b""
    assert await client.disk_usage(h) == 5
    await client.mkdir(h, "a/b/c")
    assert await client.exists(h, "a/b/c")
    await client.rename(h, odd, "a/b/c/moved")
    assert await client.exists(h, odd) is False
    entries = await client.walk(h)
    assert sorted(e.path for e in entries) == ["a/b/c/moved", "empty"]
    assert all(isinstance(e, WalkEntry) for e in entries)
    assert [e.path for e in await client.walk(h, "a/b")] == ["a/b/c/moved"]
    await client.delete(h, "empty")
    with pytest.raises(FileNotFoundError):
        await client.delete(h, "empty")
    with pytest.raises(FileNotFoundError):
        await client.download(h, "empty")
    await client.rmdir(h, "a")
    with pytest.raises(FileNotFoundError):
        await client.rmdir(h, "a")
    with pytest.raises(FileNotFoundError):
        await client.rename(h, "gone", "elsewhere")
    with pytest.raises(ValueError):
        await client.upload(h, "../escape", b"x")


@pytest_twisted.ensureDeferred
async def test_large_replies_are_decoded_with_the_collector_paused(
    client: HttpSandbox, fake: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandboxd_client import _transport as transport
    from sandboxd_client import _wire as wire

    h = await client.create()
    await client.upload(h, "f", b"x")
    seen: list[tuple[str, bool]] = []

    def loads(data: bytes) -> object:
        seen.append(("loads", gc.isenabled()))
        return json.loads(data)

    real_decode = wire.decode_walk

    def decode_walk(reply: object) -> list[WalkEntry]:
        seen.append(("decode", gc.isenabled()))
        return real_decode(reply)

    monkeypatch.setattr(transport, "json", type("Json", (), {"loads": staticmethod(loads)}))
    monkeypatch.setattr(wire, "decode_walk", decode_walk)
    assert [e.path for e in await client.walk(h)] == ["f"]
    assert seen == [("loads", True), ("decode", False)]  # a small reply is decoded as usual
    assert gc.isenabled()
    seen.clear()
    monkeypatch.setattr(transport, "PAUSE_GC_ABOVE", 1)
    assert [e.path for e in await client.walk(h)] == ["f"]
    assert seen == [("loads", False), ("decode", False)]
    assert gc.isenabled()


@pytest_twisted.ensureDeferred
async def test_streamed_files_round_trip(client: HttpSandbox, tmp_path: Path) -> None:
    h = await client.create()
    src, dst = tmp_path / "src.bin", tmp_path / "out" / "dst.bin"
    dst.parent.mkdir()
    data = os.urandom(3 * 1024 * 1024 + 7)
    src.write_bytes(data)
    sent: list[tuple[int, int | None]] = []
    await client.upload_file(h, "big.bin", str(src), on_progress=lambda d, t: sent.append((d, t)))
    assert sent[-1] == (len(data), len(data))
    totals = [0] + [done for done, _ in sent]
    steps = [b - a for a, b in itertools.pairwise(totals)]
    assert steps == [1 << 20] * 3 + [7]  # read and sent in pieces of 1 MiB
    got: list[tuple[int, int | None]] = []
    await client.download_to_file(
        h, "big.bin", str(dst), on_progress=lambda d, t: got.append((d, t))
    )
    assert dst.read_bytes() == data
    assert got[-1] == (len(data), len(data))
    assert os.listdir(dst.parent) == ["dst.bin"]  # the temporary file is gone
    with pytest.raises(FileNotFoundError):
        await client.download_to_file(h, "missing", str(tmp_path / "out" / "x"))
    assert os.listdir(dst.parent) == ["dst.bin"]
    with pytest.raises(FileNotFoundError):
        await client.upload_file(h, "x", str(tmp_path / "no-such-local-file"))


@pytest_twisted.ensureDeferred
async def test_exec_round_trip(client: HttpSandbox, fake: Served) -> None:
    h = await client.create()
    chunks: list[bytes] = []
    result = await client.exec(h, ["echo", "hi", "there"], on_output=chunks.append)
    assert result == ExecResult(0, b"hi there\n", b"", False)
    assert chunks == [b"hi there\n"]  # the keepalive frames were not forwarded
    assert (await client.exec(h, ["exit", "7"])).exit_code == 7
    assert (await client.exec(h, ["cat"], stdin=b"\x00\xffdata")).stdout == b"\x00\xffdata"
    assert (await client.exec(h, ["printenv", "K"], env={"K": "v"})).stdout == b"v\n"
    assert (await client.exec(h, ["pwd"], cwd="sub")).stdout == b"sub"
    both = await client.exec(h, ["both"])
    assert (both.exit_code, both.stdout, both.stderr) == (3, b"to stdout\n", b"to stderr\n")
    assert (await client.exec(h, ["nope"])).exit_code == 127
    spam: list[bytes] = []
    big = await client.exec(h, ["spam", "50", "70000", "cap"], on_output=spam.append)
    assert big.truncated is True
    assert b"".join(spam) == big.stdout and len(spam) == 50
    await client.exec(h, ["echo"], timeout=5, tools=["ab" * 32])
    sent = json.loads(fake.state.seen[-1].body)
    assert sent == {"cmd": ["echo"], "timeout": 5, "tools": ["ab" * 32]}
    assert base64.b64decode(json.loads(fake.state.seen[3].body)["stdin"]) == b"\x00\xffdata"


@pytest_twisted.ensureDeferred
async def test_exec_rejects_bad_arguments_before_sending(client: HttpSandbox, fake: Served) -> None:
    h = await client.create()
    before = len(fake.state.seen)
    for bad in ("echo hi", [], [1], b"ls"):
        with pytest.raises(ValueError):
            await client.exec(h, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await client.exec(h, ["echo"], timeout=0)
    assert len(fake.state.seen) == before


@pytest_twisted.ensureDeferred
async def test_lifecycle_and_service_calls(client: HttpSandbox, fake: Served) -> None:
    h = await client.create(SandboxSpec(item_id="item-1"))
    assert await client.ready(h) is True
    h2 = await client.create()
    assert await client.ready(h2) is False
    await client.mark_ready(h2)
    assert await client.ready(h2) is True
    await client.persist(h2, delete=True)
    await client.persist(h2, False)
    assert fake.state.persisted == [("sb-2", True), ("sb-2", False)]
    infos = await client.list_sandboxes()
    assert [i.remote_id for i in infos] == ["sb-1", "sb-2"]
    stats = await client.stats(h)
    assert (stats.memory_bytes, stats.cpus) == (4096, (1,))
    health = await client.health()
    assert (health.status, health.capabilities) == ("ok", ("auth",))
    assert (await client.health(fake.pod_url)).version == "fake-1"
    res = await client.resolve_tools({"jq": "http://x/jq.json", "evil": "http://x/bad.json"})
    assert res.tools["jq"].sha == "ab" * 32 and res.tools["jq"].commands[0]["name"] == "jq"
    assert res.refused == {"evil": "digest mismatch"}
    await client.resolve_tools({"jq": "http://x/jq.json"}, handle=h)
    assert fake.state.seen[-1].port == fake.pod_port
    with pytest.raises(NotImplementedError):
        await client.expose_port(h, 8000)
    await client.kill(h)
    with pytest.raises(SandboxNotFound):
        await client.kill(h)
    with pytest.raises(SandboxNotFound):
        await client.exec(h, ["echo"])
    with pytest.raises(SandboxNotFound):
        await client.exists(h, "x")


@pytest_twisted.ensureDeferred
async def test_bearer_token(fake: Served) -> None:
    fake.state.token = "s3cret"
    anonymous = make_client(fake.lb_url)
    authed = make_client(fake.lb_url, token="s3cret")
    try:
        with pytest.raises(PermissionError):
            await anonymous.create()
        assert (await anonymous.health()).status == "ok"  # /healthz is open
        h = await authed.create()
        await authed.upload(h, "f", b"x")
        assert fake.state.seen[-1].headers["authorization"] == "Bearer s3cret"
        with pytest.raises(PermissionError):
            await anonymous.download(h, "f")
    finally:
        await anonymous.close()
        await authed.close()


@pytest_twisted.ensureDeferred
async def test_bad_handles_raise_value_error_before_any_request(
    client: HttpSandbox, fake: Served
) -> None:
    bad = [
        SandboxHandle(""),
        SandboxHandle("not base64!"),
        SandboxHandle(base64.b64encode(b"[1, 2]").decode()),
        SandboxHandle(base64.b64encode(b'{"u": "ftp://h", "r": "x"}').decode()),
        SandboxHandle(base64.b64encode(b'{"u": "http://h"}').decode()),
        "\u00e9t\u00e9",
    ]
    calls = [
        lambda h: client.kill(h),
        lambda h: client.exec(h, ["echo"]),
        lambda h: client.download(h, "f"),
        lambda h: client.exists(h, "f"),
        lambda h: client.walk(h),
        lambda h: client.persist(h, True),
        lambda h: client.rename(h, "a", "b"),
    ]
    for handle in bad:
        for call in calls:
            with pytest.raises(ValueError):
                await call(handle)
    assert fake.state.seen == []


class _SetsCookies(Resource):
    """``/healthz`` that sets a cookie on every answer and records the headers it got."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.cookies: list[bytes | None] = []

    def render_GET(self, request: Request) -> bytes:
        self.cookies.append(request.getHeader(b"cookie"))
        request.addCookie(b"affinity", b"replica-1", path=b"/")
        request.setHeader(b"content-type", b"application/json")
        return b'{"status": "ok", "version": "x", "capabilities": []}'


@pytest_twisted.ensureDeferred
async def test_cookies_are_neither_kept_nor_sent() -> None:
    resource = _SetsCookies()
    port = reactor.listenTCP(0, Site(resource), interface="127.0.0.1")
    client = HttpSandbox(f"http://127.0.0.1:{port.getHost().port}", reactor=reactor)
    try:
        for _ in range(2):
            assert (await client.health()).status == "ok"
        assert resource.cookies == [None, None]
    finally:
        await client.close()
        await port.stopListening()
