"""The client's background processes and watch, round trip, against the real daemon
(docs/extensions.rst): start, list, output from offsets with and without follow, stdin, signals,
errors, watch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet.defer import CancelledError, Deferred

from sandboxd_client import (
    HttpSandbox,
    OutputChunk,
    ProcessNotFound,
    SandboxError,
    SandboxNotFound,
    WatchEvent,
)
from sandboxd_client._follow import OutputDecoder, WatchDecoder
from sandboxd_client._types import ProtocolError

from .real_daemon import daemon_and_client

TOKEN = "processes-token"


daemon, client = daemon_and_client(TOKEN)


@pytest_twisted.ensureDeferred
async def test_start_read_stdin_signal(client: HttpSandbox) -> None:
    handle = await client.create()
    started = await client.start_process(
        handle, ["sh", "-c", "cat; echo bye >&2"], stdin=True, tag="cat", env={"A": "1"}
    )
    assert started.running and started.tag == "cat" and isinstance(started.pid, int)
    await client.send_stdin(handle, started.id, b"hello\n")
    await client.close_stdin(handle, started.id)
    chunks: list[OutputChunk] = []
    result = await client.output(handle, started.id, on_output=chunks.append)
    assert result.exit_code == 0 and result.dropped == 0
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"hello\n"
    assert [c.data for c in chunks if c.stream == "stderr"] == [b"bye\n"]
    assert result.offset == chunks[-1].end == 10
    again: list[OutputChunk] = []
    tail = await client.output(handle, started.id, offset=6, follow=False, on_output=again.append)
    assert (tail.exit_code, [c.data for c in again]) == (0, [b"bye\n"])
    (listed,) = await client.processes(handle)
    assert (listed.id, listed.running, listed.exit_code, listed.cmd[0]) == (
        started.id,
        False,
        0,
        "sh",
    )
    with pytest.raises(SandboxError) as conflict:
        await client.send_stdin(handle, started.id, b"late")
    assert conflict.value.status == 409

    sleeper = await client.start_process(handle, ["sleep", "60"], timeout=30)
    running = await client.output(handle, sleeper.id, follow=False)
    assert running.exit_code is None and running.offset == 0
    await client.signal(handle, sleeper.id, "TERM")
    assert (await client.output(handle, sleeper.id)).exit_code == 143
    with pytest.raises(ValueError):
        await client.signal(handle, sleeper.id, "BOGUS")
    for call in (
        client.output(handle, "nope"),
        client.signal(handle, "nope", "TERM"),
        client.close_stdin(handle, "nope"),
    ):
        with pytest.raises(ProcessNotFound) as missing:
            await call
        assert isinstance(missing.value, LookupError)
    await client.kill(handle)
    with pytest.raises(SandboxNotFound):
        await client.processes(handle)


@pytest_twisted.ensureDeferred
async def test_a_reader_of_a_killed_sandbox_raises_sandbox_not_found(client: HttpSandbox) -> None:
    handle = await client.create()
    started = await client.start_process(handle, ["sh", "-c", "echo up; sleep 60"])
    seen: list[OutputChunk] = []
    reading: Deferred[object] = client.output(handle, started.id, on_output=seen.append)
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    while not seen:
        await deferLater(reactor, 0.02, lambda: None)
    await client.kill(handle)
    with pytest.raises(SandboxNotFound):
        await reading


@pytest_twisted.ensureDeferred
async def test_watch_reports_an_edit_until_cancelled(client: HttpSandbox) -> None:
    handle = await client.create()
    await client.mkdir(handle, "src")
    events: list[WatchEvent] = []
    watching = client.watch(handle, "/src", True, events.append)
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    for _ in range(500):  # until the watch is in place, then one edit is seen
        await client.upload(handle, "src/a.txt", b"x")
        if any(e.path == "/src/a.txt" for e in events):
            break
        await deferLater(reactor, 0.02, lambda: None)
    assert any(e.path == "/src/a.txt" and not e.dir for e in events), events
    watching.cancel()
    with pytest.raises(CancelledError):
        await watching


def test_the_decoders_refuse_what_the_contract_does_not_send(tmp_path: Path) -> None:
    decoder = OutputDecoder(0, None)
    decoder.feed(b'{"dropped":5}\n{"o":"aGk=","at":5}\n{}\n{"exit":3}\n')
    assert decoder.finish(True).offset == 7 and decoder.finish(True).dropped == 5
    for bad in (
        b"[1]\n",
        b"nope\n",
        b'{"o":"aGk="}\n',
        b'{"o":"!!","at":0}\n',
        b'{"dropped":-1}\n',
        b'{"exit":"x"}\n',
    ):
        with pytest.raises(ProtocolError):
            OutputDecoder(0, None).feed(bad)
    ended = OutputDecoder(0, None)
    ended.feed(b'{"exit":0}\n')
    with pytest.raises(ProtocolError):
        ended.feed(b'{"exit":0}\n')
    with pytest.raises(SandboxNotFound):
        OutputDecoder(0, None).finish(True)
    with pytest.raises(SandboxNotFound):
        OutputDecoder(0, None).feed(b'{"error":"SandboxNotFound","detail":"gone"}\n')
    watch = WatchDecoder(lambda e: None)
    watch.feed(b'{}\n{"event":"overflow"}\n')
    with pytest.raises(ProtocolError):
        watch.feed(b'{"event":1}\n')
    with pytest.raises(SandboxNotFound):
        watch.feed(b'{"error":"SandboxNotFound","detail":"gone"}\n')
