"""``sandboxctl shell HANDLE [CMD...]``: an interactive terminal in a sandbox, as
``docker exec -it`` gives one (docs/extensions.rst, "Terminals").

The local terminal is put in raw mode (every key, ``Ctrl-C`` included, goes to the
sandbox's terminal), its window size is the remote one's at start and on each ``SIGWINCH``,
what the remote terminal prints is written to stdout as it comes, and the exit code is the
remote command's. The local terminal's mode is restored however the shell ends.
"""

from __future__ import annotations

import argparse
import os
import signal
import termios
import tty
from typing import TYPE_CHECKING, Any

from twisted.internet.interfaces import IReadDescriptor
from zope.interface import implementer

from ._handle import resolve_handle

if TYPE_CHECKING:
    from .. import HttpSandbox
    from .._terminals import TerminalConnection

COMMANDS = ("shell",)
DEFAULT_SIZE = (24, 80)


def window_size(fd: int) -> tuple[int, int]:
    """``(rows, cols)`` of the terminal ``fd`` (:data:`DEFAULT_SIZE` when it is none)."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:  # not a terminal
        return DEFAULT_SIZE
    return (size.lines or DEFAULT_SIZE[0], size.columns or DEFAULT_SIZE[1])


@implementer(IReadDescriptor)
class KeyboardReader:
    """Reads what is typed on fd ``fd`` and sends it to the remote terminal."""

    def __init__(self, fd: int, connection: TerminalConnection) -> None:
        self.fd = fd
        self.connection = connection
        self.reactor: Any = None

    def fileno(self) -> int:
        return self.fd

    def logPrefix(self) -> str:
        return "sandboxctl-shell"

    def doRead(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:  # woken for nothing
            return
        if data:
            self.connection.type(data)
        # End of input: typing stops, the terminal runs on.
        elif self.reactor is not None:
            self.reactor.removeReader(self)

    def connectionLost(self, reason: object) -> None:
        """A keyboard that hung up (a pipe's writer gone): the reactor drops the reader;
        typing stops, the terminal runs on."""
        pass


async def run(client: HttpSandbox, args: argparse.Namespace, console: Any) -> int:
    """Start the terminal, attach to it, and relay until it ends; its exit code."""
    handle = resolve_handle(args.handle, args.url)
    keyboard_fd = console.stdin.fileno()
    interactive = os.isatty(keyboard_fd)
    rows, cols = window_size(keyboard_fd)
    started = await client.start_terminal(
        handle, args.cmd or None, rows=rows, cols=cols, term=os.environ.get("TERM") or None
    )
    out = console.out

    def show(data: bytes) -> None:
        out.write(data)
        out.flush()

    connection = client.attach_terminal(handle, started.id, show)
    reactor = console.reactor
    keyboard = KeyboardReader(keyboard_fd, connection)
    keyboard.reactor = reactor
    saved = termios.tcgetattr(keyboard_fd) if interactive else None

    def resized(signum: int, frame: object) -> None:
        reactor.callFromThread(connection.resize, *window_size(keyboard_fd))

    previous = signal.signal(signal.SIGWINCH, resized)
    try:
        if interactive:
            tty.setraw(keyboard_fd, termios.TCSANOW)  # what was typed already is kept
        reactor.addReader(keyboard)
        code = await connection.ended
    finally:
        reactor.removeReader(keyboard)
        signal.signal(signal.SIGWINCH, previous)
        if saved is not None:
            termios.tcsetattr(keyboard_fd, termios.TCSADRAIN, saved)
    if code is None:
        console.error("the terminal's connection closed before it ended")
        return 1
    return code
