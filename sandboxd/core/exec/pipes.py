"""Reading a command's stdout and stderr a whole pipe at a time.

Twisted reads a process's pipes 8 KiB at a time; each read is one event, so bulk output costs
many more reads, events and reactor turns. The pipes are enlarged, and each read takes what
the pipe holds (see docs/performance.rst for the figures).
"""

import contextlib
import errno
import fcntl
import functools
import os
import struct
import termios
from collections.abc import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IPushProducer
from twisted.internet.main import CONNECTION_DONE, CONNECTION_LOST
from zope.interface import implementer

from sandboxd import _twisted

READ_SIZE = 1 << 16
"""Bytes read from the command's stdout or stderr at a time when its pipe could not be enlarged:
a pipe's whole default capacity."""

PIPE_SIZE = 1 << 17
"""The capacity asked for the command's stdout and stderr pipes (``F_SETPIPE_SZ``; up to 1 MiB
an unprivileged process may ask by default), and then the most a read takes: bulk output comes
in chunks of up to this much, each read, encoded and sent in one turn of the reactor, which every
other sandbox's request waits behind (docs/performance.rst, "Exec output"). Quiet output is
unaffected: a read returns what the pipe holds."""


def waiting(fd: int) -> int:
    """Bytes waiting to be read from the pipe ``fd`` (``FIONREAD``); 0 when it cannot tell."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return 0


def read_from(fd: int, received: Callable[[bytes], None], size: int = READ_SIZE) -> object:
    """``twisted.internet.fdesc.readFromFD``, reading what the pipe holds: at least
    :data:`READ_SIZE`, at most ``size`` bytes (a large read buffer is asked for only when that
    much is waiting, not for every line of a chatty command)."""
    try:
        data = os.read(fd, min(max(waiting(fd), READ_SIZE), size))
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EINTR):
            return None
        return CONNECTION_LOST
    if not data:
        return CONNECTION_DONE
    received(data)
    return None


def enlarge_pipe(fd: int, size: int = PIPE_SIZE) -> int:
    """Ask for a capacity of ``size`` bytes for the pipe ``fd``; return the capacity it has.

    Best effort: past the system's limits (``/proc/sys/fs/pipe-max-size``, an unprivileged
    user's pipe pages) the pipe keeps the capacity it had; :data:`READ_SIZE` if it cannot
    even be asked (not a pipe).
    """
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    try:
        return int(fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ))
    except OSError:
        return READ_SIZE


def read_in_large_chunks(process: object) -> None:
    """Make the process transport's output readers use :func:`read_from`, each reading its
    whole pipe at once, after enlarging the pipe to :data:`PIPE_SIZE`."""
    for reader in _twisted.output_readers(process):
        size = max(enlarge_pipe(reader.fd), READ_SIZE)
        _twisted.replace_read(
            reader, functools.partial(read_from, reader.fd, reader.dataReceived, size)
        )


@implementer(IPushProducer)
class StdinGate:
    """The producer of a command's stdin pipe (``registerProducer`` on its writer): the pipe
    pauses it while more than its buffer waits to be written, and resumes it once everything
    is in the pipe. :meth:`drained` waits for that, so a caller that writes stdin in chunks
    holds one chunk at a time in the daemon, however slowly the command reads."""

    def __init__(self) -> None:
        self.paused = False
        self._waiters: list[Deferred[None]] = []

    def drained(self) -> Deferred[None]:
        """Fires once what was written is in the pipe (or the pipe is gone)."""
        if not self.paused:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append(waiter)
        return waiter

    def pauseProducing(self) -> None:
        self.paused = True

    def resumeProducing(self) -> None:
        self.paused = False
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def stopProducing(self) -> None:
        """The pipe is closed: nothing more will be written."""
        self.resumeProducing()

    def attach(self, transport: object) -> None:
        """Become the producer of ``transport``'s stdin pipe, when it has one."""
        writer = getattr(transport, "pipes", {}).get(0)
        if writer is not None:
            writer.registerProducer(self, True)
