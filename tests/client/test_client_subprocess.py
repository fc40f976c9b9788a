"""
The client in a fresh interpreter of its own, against the contract fake in this process:

- streamed uploads and downloads keep the client's memory flat (peak RSS measured);
- an asyncio application drives the client through Twisted's asyncio reactor.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest_twisted
from twisted.internet.utils import getProcessOutputAndValue

from .servers import Served

REPO = str(Path(__file__).resolve().parents[2])
MIB = 1 << 20


async def python(script: str, *args: str) -> dict[str, object]:
    """Run ``script`` in a new interpreter; it prints one JSON object as its last line."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": REPO}
    out, err, code = await getProcessOutputAndValue(
        sys.executable, ["-c", textwrap.dedent(script), *args], env=env, path=REPO
    )
    assert code == 0, err.decode()
    result: dict[str, object] = json.loads(out.decode().strip().splitlines()[-1])
    return result


MEMORY_SCRIPT = """
    import json, os, sys
    from twisted.internet import task
    from sandboxd_client import HttpSandbox

    def peak_rss() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")

    async def main(reactor, url, tmp, size):
        client = HttpSandbox(url, reactor=reactor)
        handle = await client.create()
        warm = os.path.join(tmp, "warm")
        with open(warm, "wb") as f:
            f.write(os.urandom(1 << 20))
        await client.upload_file(handle, "warm", warm)          # warm up every code path
        await client.download_to_file(handle, "warm", warm + ".back")
        before = peak_rss()
        big = os.path.join(tmp, "big")
        with open(big, "wb") as f:
            f.truncate(int(size))                                # sparse: cheap to make
        await client.upload_file(handle, "big", big)
        after_upload = peak_rss()
        await client.download_to_file(handle, "big", big + ".back")
        moved = os.path.getsize(big + ".back")
        await client.close()
        print(json.dumps({"before": before, "upload": after_upload, "download": peak_rss(),
                          "moved": moved}))

    task.react(main, sys.argv[1:])
"""


@pytest_twisted.ensureDeferred
async def test_streamed_transfers_keep_memory_flat(fake: Served, tmp_path: Path) -> None:
    size = 96 * MIB  # buffering it would show as ~96 MiB; 1 GiB behaves the same, slower
    r = await python(MEMORY_SCRIPT, fake.lb_url, str(tmp_path), str(size))
    assert r["moved"] == size
    before, upload, download = int(r["before"]), int(r["upload"]), int(r["download"])  # type: ignore[call-overload]
    assert upload - before < 8 * MIB, r
    assert download - before < 8 * MIB, r


ASYNCIO_SCRIPT = """
    import asyncio, json, sys
    from twisted.internet import asyncioreactor

    # Importing the client must not install a reactor (install() below would then fail).
    from sandboxd_client import HttpSandbox, SandboxNotFound

    async def app(url: str) -> dict:
        from twisted.internet import reactor

        client = HttpSandbox(url, reactor=reactor)
        loop = asyncio.get_running_loop()
        handle = await client.create().asFuture(loop)
        chunks = []
        result = await client.exec(handle, ["echo", "from", "asyncio"],
                                   on_output=chunks.append).asFuture(loop)
        await client.upload(handle, "f.txt", b"payload").asFuture(loop)
        data, exists = await asyncio.gather(
            client.download(handle, "f.txt").asFuture(loop),
            client.exists(handle, "f.txt").asFuture(loop),
        )
        await client.kill(handle).asFuture(loop)
        try:
            await client.ready(handle).asFuture(loop)
            gone = False
        except SandboxNotFound:
            gone = True
        await client.close().asFuture(loop)
        return {"stdout": result.stdout.decode(), "chunks": [c.decode() for c in chunks],
                "data": data.decode(), "exists": exists, "gone": gone,
                "loop": type(loop).__module__}

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    asyncioreactor.install(loop)
    from twisted.internet import reactor

    reactor.startRunning(installSignalHandlers=False)
    try:
        result = loop.run_until_complete(app(sys.argv[1]))
    finally:
        reactor.stop()
        loop.run_forever()
    print(json.dumps(result))
"""


@pytest_twisted.ensureDeferred
async def test_an_asyncio_application(fake: Served) -> None:
    r = await python(ASYNCIO_SCRIPT, fake.lb_url)
    assert r == {
        "stdout": "from asyncio\n",
        "chunks": ["from asyncio\n"],
        "data": "payload",
        "exists": True,
        "gone": True,
        "loop": "asyncio.unix_events",
    }
