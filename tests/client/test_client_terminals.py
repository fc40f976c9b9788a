"""The client's terminal calls in this process against a real daemon over loopback (issue 32;
docs/extensions.rst, "Terminals"): start with every option, attach, type (before the socket
is open too), resize both ways, kill, detach; a daemon that is not there; and
``sandboxctl shell`` run in this process with its keyboard a pipe (no terminal: the default
size, input to its end) and a sandbox killed under it. ``test_client_shell.py`` drives the
same command on a real pty, as a person would."""

from __future__ import annotations

import io
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import pytest_twisted
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import deferLater

from sandboxd_client import HttpSandbox
from sandboxd_client._handles import encode_handle
from sandboxd_client._terminals import TerminalConnection
from sandboxd_client.cli import Console, parse_args, run
from sandboxd_client.cli._shell import DEFAULT_SIZE, KeyboardReader, window_size

from .real_daemon import daemon_and_client

TOKEN = "terminals-client-token"
daemon, client = daemon_and_client(TOKEN)
WAIT_TURNS = 3000
"""Reactor turns a test waits for output (a hang guard, not a timing)."""


async def turn() -> None:
    await deferLater(reactor, 0.01, lambda: None)


class Screen:
    """What a terminal printed, as it came."""

    def __init__(self) -> None:
        self.seen = b""

    def __call__(self, data: bytes) -> None:
        self.seen += data

    async def until(self, wanted: bytes) -> bytes:
        for _ in range(WAIT_TURNS):
            if wanted in self.seen:
                return self.seen
            await turn()
        raise AssertionError(f"{wanted!r} never came: {self.seen[-400:]!r}")


async def ended(connection_ended: Deferred[int | None]) -> int | None:
    for _ in range(WAIT_TURNS):
        if connection_ended.called:
            return await connection_ended
        await turn()
    raise AssertionError("the terminal never ended")


@pytest_twisted.ensureDeferred
async def test_a_terminal_with_every_option_typed_resized_and_killed(client: HttpSandbox) -> None:
    handle = (await client.create()).id
    await client.mkdir(handle, "sub")
    started = await client.start_terminal(
        handle,
        ["sh"],
        rows=11,
        cols=41,
        term="vt220",
        env={"GREETING": "hello-from-env"},
        cwd="sub",
    )
    assert started.running and started.cmd == ("sh",)
    screen = Screen()
    connection = client.attach_terminal(handle, started.id, screen)
    # Typed before the socket is open: kept, then sent once it is.
    connection.type(b"echo $GREETING T=$TERM; basename $PWD; stty size\n")
    seen = await screen.until(b"11 41")
    assert b"hello-from-env T=vt220" in seen and b"\nsub" in seen.replace(b"\r", b""), seen
    connection.type(b"")  # nothing to send
    connection.resize(30, 100)  # the socket's control message
    connection.type(b"stty size\n")
    await screen.until(b"30 100")
    await client.resize_terminal(handle, started.id, 17, 63)  # the route
    connection.type(b"stty size\n")
    await screen.until(b"17 63")
    await client.kill_terminal(handle, started.id)
    assert await ended(connection.ended) == 137


@pytest_twisted.ensureDeferred
async def test_the_defaults_and_a_detach_that_leaves_it_running(client: HttpSandbox) -> None:
    handle = (await client.create()).id
    started = await client.start_terminal(handle)
    assert started.cmd == ("sh",)
    screen = Screen()
    connection = client.attach_terminal(handle, started.id, screen)
    connection.type(b"echo T=$TERM; stty size\n")
    await screen.until(b"24 80")
    assert b"T=xterm-256color" in screen.seen
    connection.close()
    assert await ended(connection.ended) is None  # closed, not ended
    connection.type(b"echo typed-after-the-close\n")  # goes nowhere, raises nothing
    connection.resize(5, 5)
    (listed,) = [p for p in await client.processes(handle) if p.id == started.id]
    assert listed.running
    again = Screen()
    second = client.attach_terminal(handle, started.id, again)
    await again.until(b"T=xterm-256color")  # its scrollback
    second.type(b"exit 6\n")
    assert await ended(second.ended) == 6


@pytest_twisted.ensureDeferred
async def test_attaching_where_no_daemon_listens_fails_the_connection(closed_port: int) -> None:
    nowhere = HttpSandbox(f"http://127.0.0.1:{closed_port}", token=TOKEN, reactor=reactor)
    try:
        handle = encode_handle(f"http://127.0.0.1:{closed_port}", "0123456789abcdef")
        connection = nowhere.attach_terminal(handle, "t1", lambda data: None)
        with pytest.raises(ConnectionRefusedError):
            await ended(connection.ended)
    finally:
        await nowhere.close()


def shell_of(
    client: HttpSandbox, keyboard: io.BufferedReader, *argv: str
) -> tuple[Deferred[int], io.BytesIO, io.StringIO]:
    out, err = io.BytesIO(), io.StringIO()
    console = Console(out, err, tty=False, stdin=keyboard)  # type: ignore[arg-type]
    console.reactor = reactor
    args = parse_args(["--url", "http://127.0.0.1:1", "shell", *argv])  # the handle says where
    return Deferred.fromCoroutine(run(client, args, console)), out, err


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(WAIT_TURNS):
        if condition():
            return
        await turn()
    raise AssertionError("never")


@pytest_twisted.ensureDeferred
async def test_shell_with_a_pipe_for_a_keyboard(client: HttpSandbox) -> None:
    """No terminal here: the remote one is the default size, the pipe's bytes are typed as
    they come, its end stops the typing (the shell runs on until it exits), a SIGWINCH sends
    the size again, and the exit code is the remote shell's."""
    handle = (await client.create()).id
    read, write = os.pipe()
    with open(read, "rb", buffering=0) as keyboard:
        assert window_size(keyboard.fileno()) == DEFAULT_SIZE
        running, out, _ = shell_of(client, keyboard, handle)
        os.write(write, b"stty size; echo typed-$((2*21))\n")
        await until(lambda: b"typed-42" in out.getvalue())
        os.kill(os.getpid(), signal.SIGWINCH)  # the handler resizes to the same default size
        os.write(write, b"sleep 1; exit 5\n")
        os.close(write)  # end of input: the shell still exits by itself
        assert await running == 5
    assert b"24 80" in out.getvalue()


@pytest_twisted.ensureDeferred
async def test_shell_when_the_sandbox_is_killed_under_it(client: HttpSandbox) -> None:
    handle = (await client.create()).id
    read, write = os.pipe()
    try:
        with open(read, "rb", buffering=0) as keyboard:
            running, out, err = shell_of(client, keyboard, handle, "sh")
            os.write(write, b"echo up-and-running\n")
            await until(lambda: b"up-and-running\r\n" in out.getvalue())
            await client.kill(handle)
            assert await running == 1
    finally:
        os.close(write)
    assert "closed before it ended" in err.getvalue()


def test_a_keyboard_woken_for_nothing_reads_on(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.set_blocking(read, False)
    typed: list[bytes] = []

    class Connection:
        def type(self, data: bytes) -> None:
            typed.append(data)

    keyboard = KeyboardReader(read, Connection())  # type: ignore[arg-type]
    try:
        keyboard.doRead()  # nothing there: no input, no end
        os.write(write, b"k")
        keyboard.doRead()
        assert typed == [b"k"] and keyboard.logPrefix() == "sandboxctl-shell"
        os.close(write)
        keyboard.doRead()  # the end, with no reactor to stop reading on: nothing typed
        removed: list[object] = []

        class Reactor:
            def removeReader(self, reader: object) -> None:
                removed.append(reader)

        keyboard.reactor = Reactor()
        keyboard.doRead()  # the end, read: the reader is removed
        keyboard.connectionLost(None)  # the end, seen by the reactor as a hang-up
        assert typed == [b"k"] and removed == [keyboard]
    finally:
        os.close(read)


def test_a_connection_closed_before_it_opened_sends_nothing() -> None:
    connection = TerminalConnection()
    connection.close()
    connection.type(b"kept")
    assert connection._pending == [(b"kept", True)] and not connection.ended.called


class OddServer(WebSocketServerProtocol):
    """Not a daemon: a text message that is no JSON, a control the client does not know,
    output, then the end."""

    def onOpen(self) -> None:
        self.sendMessage(b"not json", isBinary=False)
        self.sendMessage(b'{"other": 1}', isBinary=False)
        self.sendMessage(b"still-here", isBinary=True)
        self.sendMessage(b'{"exit": 3}', isBinary=False)
        self.sendClose(1000)


@pytest_twisted.ensureDeferred
async def test_messages_the_client_does_not_know_are_skipped() -> None:
    factory = WebSocketServerFactory()
    factory.protocol = OddServer
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    url = f"http://127.0.0.1:{port.getHost().port}"
    odd = HttpSandbox(url, token=TOKEN, reactor=reactor)
    try:
        screen = Screen()
        connection = odd.attach_terminal(encode_handle(url, "0123456789abcdef"), "t1", screen)
        assert await ended(connection.ended) == 3
        assert screen.seen == b"still-here"
    finally:
        await odd.close()
        await port.stopListening()
