"""``sandboxctl exec`` with streamed stdin against the real daemon's API in memory: Ctrl-C
(the command's cancellation) kills the command; a socket's EOF and a terminal hung up end
stdin; stdin sent to a command that ended (``409``) or is unknown stops quietly, and any
other failure is raised."""

from __future__ import annotations

import io
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.main import CONNECTION_DONE, CONNECTION_LOST
from twisted.internet.task import Clock, deferLater

from sandboxd_client import HttpSandbox, SandboxError, SandboxNotFound
from sandboxd_client.cli import Console, parse_args, run
from sandboxd_client.cli._stdin import FileReader, PipeReader, pump

from .daemon_in_memory import POD_URL, InMemoryDaemon, serve_in_memory

TOKEN = "stdin-in-memory-token"
WAIT_TURNS = 2000
"""Reactor turns a test waits for a process to show (a hang guard, not a timing)."""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InMemoryDaemon]:
    yield from serve_in_memory(tmp_path, TOKEN.encode())


@pytest.fixture
def client(daemon: InMemoryDaemon) -> Iterator[HttpSandbox]:
    c = HttpSandbox(POD_URL, token=TOKEN, reactor=reactor, clock=Clock(), agent=daemon.agent)
    yield c
    pytest_twisted.blockon(c.close())


async def turn() -> None:
    await deferLater(reactor, 0.005, lambda: None)


def exec_of(client: HttpSandbox, stdin: object, *argv: str) -> tuple[Deferred[int], io.BytesIO]:
    out = io.BytesIO()
    console = Console(out, io.StringIO(), tty=False, stdin=stdin)  # type: ignore[arg-type]
    args = parse_args(["--url", POD_URL, "exec", *argv])
    return Deferred.fromCoroutine(run(client, args, console)), out


@pytest_twisted.ensureDeferred
async def test_cancelling_a_streamed_exec_kills_the_command(client: HttpSandbox) -> None:
    handle = (await client.create()).id
    read, write = os.pipe()
    with open(read, "rb", buffering=0) as pipe:
        running, _ = exec_of(client, pipe, handle, "cat")
        for _ in range(WAIT_TURNS):
            listed = await client.processes(handle)
            if listed and listed[0].running:
                break
            await turn()
        os.write(write, b"never all read\n")
        running.cancel()
        with pytest.raises(CancelledError):
            await running
    os.close(write)
    (killed,) = await client.processes(handle)
    for _ in range(WAIT_TURNS):  # the KILL was sent; the daemon reaps it
        if not killed.running:
            break
        await turn()
        (killed,) = await client.processes(handle)
    assert (killed.running, killed.exit_code) == (False, 137), "KILL, not the EOF cat waits for"


@pytest_twisted.ensureDeferred
async def test_a_command_that_ends_before_its_stdin_does_ends_the_exec(
    client: HttpSandbox,
) -> None:
    """A command that never reads its stdin ends: the exec ends with it, its stdin (a pipe
    that neither sends nor closes) is let go unread, and no error is raised."""
    handle = (await client.create()).id
    read, write = os.pipe()
    try:
        with open(read, "rb", buffering=0) as pipe:
            running, out = exec_of(client, pipe, handle, "sh", "-c", "echo done")
            # A hang guard, not a timing: the pipe never ends, so a regression would wait forever.
            assert await running.addTimeout(60, reactor) == 0
        assert out.getvalue() == b"done\n"
    finally:
        os.close(write)


@pytest_twisted.ensureDeferred
async def test_a_socket_is_streamed_to_its_eof(client: HttpSandbox) -> None:
    handle = (await client.create()).id
    ours, theirs = socket.socketpair()
    ours.sendall(b"through a socket\n")
    ours.close()
    with theirs.makefile("rb", buffering=0) as stdin:
        running, out = exec_of(client, stdin, handle, "cat")
        assert await running == 0
    theirs.close()
    assert out.getvalue() == b"through a socket\n"


@pytest_twisted.ensureDeferred
async def test_a_terminal_hung_up_is_the_end_of_stdin() -> None:
    master, slave = os.openpty()
    reader = PipeReader(reactor, slave)
    try:
        assert reader.doRead() is None, "a wake-up with nothing to read waits on"
        waiting = reader.take()
        assert not waiting.called
        os.close(master)  # the terminal hangs up: its reads find the end
        assert reader.doRead() is CONNECTION_DONE
        assert await waiting == b""
        assert await reader.take() == b"", "and stay at the end"
    finally:
        reader.close()
        os.close(slave)


@pytest_twisted.ensureDeferred
async def test_stdin_for_a_command_that_ended_or_is_unknown_stops_quietly(
    client: HttpSandbox, tmp_path: Path
) -> None:
    handle = (await client.create()).id
    ended = await client.start_process(handle, ["true"], stdin=True)
    assert (await client.output(handle, ended.id)).exit_code == 0
    data = tmp_path / "stdin"
    data.write_bytes(b"too late")
    sent: list[bytes] = []
    for process_id in (ended.id, "no-such-process"):
        with open(data, "rb") as f:

            def send(chunk: bytes, process_id: str = process_id) -> Deferred[None]:
                sent.append(chunk)
                return client.send_stdin(handle, process_id, chunk)

            await pump(FileReader(f.fileno()), send, lambda: client.close_stdin(handle, "x"))
    assert sent == [b"too late", b"too late"], "one refused chunk each, and no more"

    await client.kill(handle)
    with open(data, "rb") as f, pytest.raises(SandboxNotFound):
        await pump(
            FileReader(f.fileno()),
            lambda chunk: client.send_stdin(handle, ended.id, chunk),
            lambda: client.close_stdin(handle, ended.id),
        )


@pytest_twisted.ensureDeferred
async def test_a_reset_socket_is_the_end_of_stdin() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        ours = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()  # a reset: the next read fails (ECONNRESET)
    reader = PipeReader(reactor, ours.fileno())
    try:
        waiting = reader.take()
        assert reader.doRead() is CONNECTION_LOST, "a failed read is the end"
        assert await waiting == b""
    finally:
        reader.close()
        ours.close()


@pytest_twisted.ensureDeferred
async def test_stdin_that_cannot_reach_the_command_ends_it_and_says_why(
    client: HttpSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk of stdin the service refuses for another reason than the command's end: the
    command is killed (it would wait for an EOF that never comes) and the refusal raised."""
    handle = (await client.create()).id

    def refused(*args: object) -> Deferred[None]:
        raise SandboxError("the service refused the chunk", status=500)

    monkeypatch.setattr(client, "send_stdin", refused)
    read, write = os.pipe()
    os.write(write, b"a chunk the service refuses\n")
    with open(read, "rb", buffering=0) as pipe:
        # --timeout bounds the command should it never be killed (the test then fails).
        running, out = exec_of(client, pipe, handle, "--timeout", "60", "cat")
        with pytest.raises(SandboxError, match="refused the chunk"):
            await running
    os.close(write)
    (ended,) = await client.processes(handle)
    assert (ended.running, ended.exit_code, out.getvalue()) == (False, 137, b"")
