"""A terminal: a background process whose stdio is a pseudo-terminal (docs/extensions.rst,
"Terminals").

A :class:`TerminalRun` is the same runner as an exec or a background process
(:class:`~sandboxd.core.exec.run.ExecRun`: timeouts, signals to its group, the end), spawned
with the slave of a new pty as its stdin, stdout and stderr, through the one privilege-drop
chain with the helper's ``--ctty`` (the slave becomes the controlling terminal of the
command's session: ``Ctrl-C``, ``SIGWINCH`` and job control reach it). The daemon holds the
master: what the command writes comes out of it as one stream (fd 1), what is written to it
is the command's keyboard, and its window size is the terminal's (``TIOCSWINSZ`` on the
master: the kernel sends ``SIGWINCH`` to the terminal's foreground process group).
"""

import contextlib
import fcntl
import os
import struct
import termios
from collections.abc import Mapping, Sequence
from typing import cast

from attrs import frozen
from twisted.internet.interfaces import IReactorProcess

from sandboxd.core.exec.run import ExecRun, SpawnFailed
from sandboxd.errors import BadRequest

DEFAULT_TERM = "xterm-256color"
"""``TERM`` of a terminal whose creator names none."""
SIZE_MAX = 4096
"""The most rows or columns a terminal may have."""


@frozen
class TerminalSize:
    """A terminal's window size in character cells."""

    rows: int
    cols: int

    @classmethod
    def parse(cls, rows: object, cols: object) -> "TerminalSize":
        """``rows`` and ``cols`` as a client gave them; ``BadRequest`` unless each is a whole
        number from 1 to :data:`SIZE_MAX`."""
        for name, value in (("rows", rows), ("cols", cols)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= SIZE_MAX:
                raise BadRequest(f"{name}: must be a whole number from 1 to {SIZE_MAX}")
        assert isinstance(rows, int) and isinstance(cols, int)
        return cls(rows, cols)


def set_window_size(fd: int, size: TerminalSize) -> None:
    """Set the window size of the terminal ``fd`` (a pty's master or slave)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))


class TerminalRun(ExecRun):
    """An :class:`ExecRun` whose command runs on a pseudo-terminal the daemon holds the master
    of; its output comes as fd 1, :meth:`write_stdin` types on its keyboard."""

    size = TerminalSize(24, 80)
    """The window size it was last given."""

    def start_terminal(
        self,
        reactor: IReactorProcess,
        argv: Sequence[str],
        env: Mapping[str, str],
        size: TerminalSize,
    ) -> None:
        """Spawn ``argv`` on a new pty of window size ``size``; a pty or a fork refused ends
        the run at once (:class:`SpawnFailed`)."""
        self.size = size
        try:
            master, slave = os.openpty()
        except OSError as e:
            self._end(SpawnFailed(f"cannot open a pseudo-terminal: {e}"))
            return
        try:
            set_window_size(master, size)
            process = reactor.spawnProcess(
                self,
                argv[0],
                list(argv),
                env=dict(env),
                # Twisted takes a ready pty as (master, slave, name); its stub says bool
                usePTY=cast(bool, (master, slave, os.ttyname(slave))),
            )
        except OSError as e:
            os.close(master)
            os.close(slave)
            self._end(SpawnFailed(f"cannot start the command: {e}"))
            return
        self.pid = self.pid or process.pid
        self.keep_stdin_open = self.stdin_open = not self.ended
        if self.timeout is not None and not self.ended:
            self._schedule("deadline", self.timeout, self._expire)

    def connectionMade(self) -> None:
        self.pid = getattr(self.transport, "pid", None)
        # What is typed waits in the master's buffer while the command reads slowly: the
        # gate pauses the writer past that (Process.feed_stdin waits for it).
        self.transport.registerProducer(self.stdin_gate, True)  # type: ignore[union-attr]

    def resize(self, size: TerminalSize) -> None:
        """Give the terminal window size ``size`` (the command's foreground group is sent
        ``SIGWINCH`` by the kernel); nothing once it has ended."""
        self.size = size
        if self.transport is not None and not self.ended:
            with contextlib.suppress(OSError):  # the master closed meanwhile
                set_window_size(self.transport.fileno(), size)  # type: ignore[attr-defined]

    def signal_foreground(self, signum: int) -> None:
        """Send ``signum`` to the terminal's foreground process group (its command's group
        when the terminal cannot tell: it has just ended)."""
        if self.transport is None or self.ended:
            return
        try:
            group = os.tcgetpgrp(self.transport.fileno())  # type: ignore[attr-defined]
        except OSError:
            self.signal(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            self._killpg(group, signum)

    def close_stdin(self) -> None:
        """Type end-of-file (``Ctrl-D`` at the start of a line, in canonical mode): a pty has
        no stdin of its own to close."""
        assert self.transport is not None and self.stdin_open
        self.transport.write(b"\x04")
