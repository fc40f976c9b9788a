"""
Every client method, round trip, against the real daemon (``twistd -n sandboxd
--isolation=none``) over real TCP, with a bearer token. One daemon serves the whole module.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import pytest_twisted
from twisted.web.resource import Resource
from twisted.web.static import Data

from sandboxd_client import (
    ExecResult,
    HttpSandbox,
    SandboxNotFound,
    SandboxSpec,
    decode_handle,
)
from sandboxd_client.cli import Console, main_async

from .real_daemon import Daemon, daemon_and_client
from .servers import listen, url_of

TOKEN = "real-daemon-token"


daemon, client = daemon_and_client(TOKEN)


@pytest_twisted.ensureDeferred
async def test_lifecycle_and_probes(client: HttpSandbox, daemon: Daemon) -> None:
    health = await client.health()
    assert health.status == "ok" and "isolation.none" in health.capabilities
    handle = await client.create(SandboxSpec(env={"GREETING": "hello"}))
    assert decode_handle(handle).pod_url == daemon.url
    assert await client.ready(handle) in (True, False)
    await client.mark_ready(handle)
    assert await client.ready(handle) is True
    await client.persist(handle, delete=False)  # no archive configured: a no-op
    await client.persist(handle, True)
    listed = [s.remote_id for s in await client.list_sandboxes()]
    assert decode_handle(handle).remote_id in listed
    stats = await client.stats(handle)
    assert stats.pids is None or stats.pids >= 0
    url = await client.expose_port(handle, 8000)
    assert url == f"{daemon.url}/sandboxes/{decode_handle(handle).remote_id}/ports/8000/"
    assert await client.expose_port(handle, 8000, public=True) == url
    await client.kill(handle)
    with pytest.raises(SandboxNotFound):
        await client.exists(handle, "x")
    with pytest.raises(SandboxNotFound):
        await client.kill(handle)


@pytest_twisted.ensureDeferred
async def test_files(client: HttpSandbox, tmp_path: Path) -> None:
    h = await client.create()
    try:
        odd = "dir one/a+b&c=d#e%f ü?.txt"
        await client.upload(h, odd, b"hello")
        assert await client.download(h, odd) == b"hello"
        assert await client.download(h, "/" + odd) == b"hello"
        assert (await client.exists(h, odd), await client.exists(h, "nope")) == (True, False)
        assert (await client.size(h, odd), await client.size(h, "nope")) == (5, None)
        assert await client.disk_usage(h) >= 5
        await client.mkdir(h, "a/b/c")
        assert await client.exists(h, "a/b/c")
        await client.rename(h, odd, "a/b/c/moved")
        walked = await client.walk(h)
        assert [e.path.lstrip("/") for e in walked] == ["a/b/c/moved"]
        assert walked[0].size == 5
        assert [e.path.lstrip("/") for e in await client.walk(h, "a/b")] == ["a/b/c/moved"]
        await client.delete(h, "a/b/c/moved")
        with pytest.raises(FileNotFoundError):
            await client.delete(h, "a/b/c/moved")
        with pytest.raises(FileNotFoundError):
            await client.download(h, "a/b/c/moved")
        await client.rmdir(h, "a")
        with pytest.raises(FileNotFoundError):
            await client.rmdir(h, "a")
        with pytest.raises(FileNotFoundError):
            await client.rename(h, "gone", "elsewhere")
        for escape in ("../outside", "a/../../outside"):
            with pytest.raises((ValueError, FileNotFoundError)):
                await client.upload(h, escape, b"x")

        src, back = tmp_path / "src", tmp_path / "back"
        data = os.urandom(5 * 1024 * 1024 + 1)
        src.write_bytes(data)
        await client.upload_file(h, "big/file.bin", str(src))
        assert await client.size(h, "big/file.bin") == len(data)
        await client.download_to_file(h, "big/file.bin", str(back))
        assert back.read_bytes() == data
    finally:
        await client.kill(h)


@pytest_twisted.ensureDeferred
async def test_exec(client: HttpSandbox) -> None:
    h = await client.create(SandboxSpec(env={"GREETING": "hello"}))
    try:
        chunks: list[bytes] = []
        script = "echo out; echo err >&2; exit 3"
        result = await client.exec(h, ["sh", "-c", script], on_output=chunks.append)
        assert result == ExecResult(3, b"out\n", b"err\n", False)
        assert sorted(b"".join(chunks).splitlines()) == [b"err", b"out"]
        outs: list[bytes] = []
        errs: list[bytes] = []
        split = await client.exec(
            h, ["sh", "-c", script], on_output=outs.append, on_stderr=errs.append
        )
        assert (b"".join(outs), b"".join(errs), split.exit_code) == (b"out\n", b"err\n", 3)
        assert (await client.exec(h, ["cat"], stdin=b"\x00in\xff")).stdout == b"\x00in\xff"
        env = await client.exec(h, ["sh", "-c", "echo $GREETING $EXTRA"], env={"EXTRA": "x"})
        assert env.stdout == b"hello x\n"  # the create env, then the exec env
        await client.mkdir(h, "sub")
        assert (await client.exec(h, ["pwd"], cwd="sub")).stdout.rstrip().endswith(b"/sub")
        assert (await client.exec(h, ["no-such-command-here"])).exit_code == 127
        assert (await client.exec(h, ["sleep", "5"], timeout=1)).exit_code == 124
        # Silent for longer than the client's patience, yet alive: keepalives carry it.
        quiet = HttpSandbox(
            decode_handle(h).pod_url, token=TOKEN, exec_idle_timeout=1.6, retry=None
        )
        try:
            assert (await quiet.exec(h, ["sh", "-c", "sleep 2.5; echo done"])).stdout == b"done\n"
        finally:
            await quiet.close()
    finally:
        await client.kill(h)


def _tool_tarball() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        script = b"#!/bin/sh\necho hello from the tool\n"
        info = tarfile.TarInfo("bin/hello-tool")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
    return buf.getvalue()


@pytest_twisted.ensureDeferred
async def test_tools(client: HttpSandbox) -> None:
    tarball = _tool_tarball()
    sha = hashlib.sha256(tarball).hexdigest()
    store = Resource()
    port = listen(store)
    base = url_of(port)
    command = {"name": "hello", "description": "says hello", "parameters": {"type": "object"}}
    manifest = {
        "name": "hello",
        "version": "1.2",
        "artifact": {"url": f"{base}/hello.tar.gz", "sha256": sha},
        "commands": [command],
    }
    store.putChild(b"hello.json", Data(json.dumps(manifest).encode(), "application/json"))
    store.putChild(b"hello.tar.gz", Data(tarball, "application/gzip"))
    bad = dict(manifest, artifact={"url": f"{base}/hello.tar.gz", "sha256": "0" * 64})
    store.putChild(b"bad.json", Data(json.dumps(bad).encode(), "application/json"))
    h = await client.create()
    try:
        res = await client.resolve_tools(
            {"hello": f"{base}/hello.json", "bad": f"{base}/bad.json"}, handle=h
        )
        assert set(res.refused) == {"bad"}
        tool = res.tools["hello"]
        assert (tool.sha, tool.version, tool.stale) == (sha, "1.2", False)
        assert tool.commands == (command,)
        result = await client.exec(h, ["hello-tool"], tools=[tool.sha])
        assert result.stdout == b"hello from the tool\n"
    finally:
        await client.kill(h)
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_token_is_required_and_sandboxctl_works(daemon: Daemon, tmp_path: Path) -> None:
    from twisted.internet import reactor

    anonymous = HttpSandbox(daemon.url, reactor=reactor)
    try:
        assert (await anonymous.health()).status == "ok"
        with pytest.raises(PermissionError):
            await anonymous.create()
    finally:
        await anonymous.close()

    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    common = ["--url", daemon.url, "--token-file", str(token)]

    async def ctl(*argv: str) -> tuple[int, bytes, str]:
        out, err = io.BytesIO(), io.StringIO()
        code = await main_async(reactor, [*common, *argv], Console(out, err))
        return code, out.getvalue(), err.getvalue()

    code, out, _ = await ctl("create")
    handle = out.decode().strip()
    assert code == 0 and handle
    code, out, err = await ctl("exec", handle, "--", "sh", "-c", "echo live; exit 5")
    assert (code, out, err) == (5, b"live\n", "")
    local = tmp_path / "local"
    local.write_bytes(b"via sandboxctl")
    assert (await ctl("put", handle, str(local), "f"))[0] == 0
    assert (await ctl("get", handle, "f", str(tmp_path / "back")))[0] == 0
    assert (tmp_path / "back").read_bytes() == b"via sandboxctl"
    code, out, _ = await ctl("--json", "ls", handle)
    assert [e["path"].lstrip("/") for e in json.loads(out)] == ["f"]
    assert (await ctl("rm", handle, "f"))[0] == 0
    assert (await ctl("kill", handle))[0] == 0
    code, _, err = await ctl("kill", handle)
    assert code == 1 and err.startswith("sandboxctl: SandboxNotFound")
