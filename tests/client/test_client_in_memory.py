"""
Every ``HttpSandbox`` method against the real daemon's ``SandboxAPI``, in memory (treq's
``RequestTraversalAgent``): the whole client (transport, deadlines, decoding) and the whole
API and core, with no socket between them. Deadlines run on a ``Clock`` nobody advances, so
nothing here depends on timing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock

from sandboxd_client import (
    ExecResult,
    HttpSandbox,
    NetworkInfo,
    SandboxNotFound,
    SandboxSpec,
    Socks5,
    decode_handle,
)

from .daemon_in_memory import POD_URL, InMemoryDaemon, serve_in_memory

TOKEN = "in-memory-token"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InMemoryDaemon]:
    yield from serve_in_memory(tmp_path, TOKEN.encode())


def in_memory_client(daemon: InMemoryDaemon, token: str | None = TOKEN) -> HttpSandbox:
    return HttpSandbox(POD_URL, token=token, reactor=reactor, clock=Clock(), agent=daemon.agent)


@pytest.fixture
def client(daemon: InMemoryDaemon) -> Iterator[HttpSandbox]:
    c = in_memory_client(daemon)
    yield c
    pytest_twisted.blockon(c.close())


@pytest_twisted.ensureDeferred
async def test_lifecycle_probes_and_service_calls(
    client: HttpSandbox, daemon: InMemoryDaemon, closed_port: int
) -> None:
    health = await client.health()
    assert health.status == "ok" and "isolation.none" in health.capabilities
    handle = await client.create(SandboxSpec(env={"GREETING": "hello"}))
    route = decode_handle(handle)
    assert route.pod_url == POD_URL and route.remote_id in daemon.manager.sandboxes
    assert await client.ready(handle) is False
    await client.mark_ready(handle)
    assert await client.ready(handle) is True
    await client.persist(handle, delete=False)  # no archive configured: a no-op
    assert [s.remote_id for s in await client.list_sandboxes()] == [route.remote_id]
    assert (await client.stats(handle)).oom_kills in (None, 0)
    assert await client.network(handle) == NetworkInfo("host")
    assert (await client.list_sandboxes())[0].network == NetworkInfo("host")
    with pytest.raises(ValueError, match="need mode egress"):  # lists are the egress mode's
        await client.set_network(handle, ["192.0.2.1"], ["192.0.2.2"])
    with pytest.raises(ValueError, match="need mode egress"):
        await client.set_network(handle)  # (restricting nothing)
    with pytest.raises(ValueError, match="need mode egress"):
        await client.create(SandboxSpec(network="host", deny_out=["192.0.2.2"]))
    rules = {"api.example.com": {"Authorization": "Bearer s3cret"}}
    with pytest.raises(ValueError, match="need mode egress"):  # the daemon took the rules
        await client.create(SandboxSpec(network="host", rules=rules))
    with pytest.raises(ValueError, match="need mode egress"):
        await client.set_network(handle, rules=rules)
    with pytest.raises(ValueError, match="Host cannot be set") as caught:  # its parser's
        await client.set_network(handle, rules={"api.example.com": {"Host": "s3cret"}})
    assert "s3cret" not in str(caught.value)
    proxy = Socks5("203.0.113.80:1080", "me", "pw-s3cret")
    with pytest.raises(ValueError, match="need mode egress"):  # the daemon took the proxy
        await client.set_network(handle, socks5=proxy)
    with pytest.raises(ValueError, match="a host name is not supported") as caught:
        await client.set_network(handle, socks5=Socks5("proxy.example:1080", "me", "pw-s3cret"))
    assert "pw-s3cret" not in str(caught.value)
    manifest = f"http://127.0.0.1:{closed_port}/none.json"  # refused: nothing listens
    refused = await client.resolve_tools({"nothing": manifest})
    assert set(refused.refused) == {"nothing"} and not refused.tools
    await client.kill(handle)
    assert route.remote_id not in daemon.manager.sandboxes
    with pytest.raises(SandboxNotFound):
        await client.exists(handle, "x")


@pytest_twisted.ensureDeferred
async def test_files(client: HttpSandbox, tmp_path: Path) -> None:
    h = await client.create()
    odd = "dir one/a+b&c=d#e%f ü?.txt"
    await client.upload(h, odd, b"hello")
    assert await client.download(h, "/" + odd) == b"hello"
    assert (await client.exists(h, odd), await client.exists(h, "nope")) == (True, False)
    assert (await client.size(h, odd), await client.size(h, "nope")) == (5, None)
    assert await client.disk_usage(h) >= 5
    await client.mkdir(h, "a/b")
    await client.rename(h, odd, "a/b/moved")
    assert [(e.path, e.size) for e in await client.walk(h)] == [("/a/b/moved", 5)]
    await client.delete(h, "a/b/moved")
    with pytest.raises(FileNotFoundError):
        await client.download(h, "a/b/moved")
    await client.rmdir(h, "a")
    with pytest.raises(FileNotFoundError):
        await client.rmdir(h, "a")
    with pytest.raises(ValueError):
        await client.upload(h, "../outside", b"x")
    src, back = tmp_path / "src", tmp_path / "back"
    data = os.urandom(3 * 1024 * 1024 + 7)  # several body chunks each way
    src.write_bytes(data)
    sent: list[int] = []
    await client.upload_file(h, "big.bin", str(src), on_progress=lambda n, total: sent.append(n))
    assert sent[-1] == len(data)
    await client.download_to_file(h, "big.bin", str(back))
    assert back.read_bytes() == data


@pytest_twisted.ensureDeferred
async def test_exec(client: HttpSandbox) -> None:
    h = await client.create(SandboxSpec(env={"GREETING": "hello"}))
    chunks: list[bytes] = []
    result = await client.exec(
        h, ["sh", "-c", "echo out; echo err >&2; exit 3"], on_output=chunks.append
    )
    assert result == ExecResult(3, b"out\n", b"err\n", False)
    assert sorted(b"".join(chunks).splitlines()) == [b"err", b"out"]
    assert (await client.exec(h, ["cat"], stdin=b"\x00in\xff")).stdout == b"\x00in\xff"
    env = await client.exec(h, ["sh", "-c", "echo $GREETING $EXTRA"], env={"EXTRA": "x"})
    assert env.stdout == b"hello x\n"
    await client.mkdir(h, "sub")
    assert (await client.exec(h, ["pwd"], cwd="sub")).stdout.rstrip().endswith(b"/sub")
    assert (await client.exec(h, ["no-such-command-here"])).exit_code == 127
    with pytest.raises(ValueError):
        await client.exec(h, ["true"], cwd="../..")


@pytest_twisted.ensureDeferred
async def test_a_wrong_token_is_a_permission_error(daemon: InMemoryDaemon) -> None:
    anonymous = in_memory_client(daemon, token="wrong")
    try:
        assert (await anonymous.health()).status == "ok"  # open to all (probes)
        with pytest.raises(PermissionError):
            await anonymous.create()
    finally:
        await anonymous.close()
