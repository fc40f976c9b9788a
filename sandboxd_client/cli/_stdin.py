"""``sandboxctl exec`` with stdin, streamed as ``docker exec -i`` streams it.

On a replica with background processes (``processes``), the command is started with a stdin
pipe, and this process's stdin is sent to it as it comes: each chunk read as soon as it is
there (a line typed now arrives now), at most one chunk in flight and :data:`BATCH_MAX` bytes
gathered meanwhile (the reading stops until the chunk is taken: backpressure all the way from
the command back to the producer of this process's stdin), then EOF. Its output is followed
to its end, stdout to stdout and stderr to stderr, and its exit code is the result.

A replica without them takes stdin in the exec request itself, whole: up to
:data:`BUFFERED_MAX` bytes (its JSON body limit), refused above that by name.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import os
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet import abstract
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.main import CONNECTION_DONE, CONNECTION_LOST
from twisted.python.failure import Failure

from .._types import OutputChunk, ProcessNotFound, SandboxError, SandboxHandle

if TYPE_CHECKING:
    from .. import HttpSandbox

READ_SIZE = 1 << 20
"""Bytes read from stdin at a time."""

BATCH_MAX = 4 << 20
"""Bytes of stdin gathered while a chunk is in flight, past which reading stops."""

BUFFERED_MAX = 47 << 20
"""The most stdin a replica without streamed stdin takes: base64 in its 64 MiB JSON body, with
1 MiB left for the command, its environment and the JSON around them (48 MiB would be the
whole body in base64, and the daemon would refuse it with ``413``)."""

PROCESSES = "processes"
"""The capability of a replica with background processes (and their stdin)."""


def fd_of(stream: Any) -> int | None:
    """The descriptor under ``stream`` (``None``: an in-memory stream)."""
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return None


def wants_stdin(fd: int | None, asked: bool) -> bool:
    """Whether ``exec`` sends stdin: when asked (``-i``), and whenever stdin is a pipe, a
    socket or a file (as ``docker exec -i`` would be needed for; a terminal or ``/dev/null``
    needs ``-i``)."""
    if fd is None:
        return asked
    mode = os.fstat(fd).st_mode
    return asked or stat.S_ISFIFO(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode)


class PipeReader(abstract.FileDescriptor):
    """Reads a pipe, socket or terminal on the reactor (non-blocking), gathering what comes
    until :meth:`take` takes it; stops reading past :data:`BATCH_MAX` gathered."""

    def __init__(self, reactor: Any, fd: int) -> None:
        super().__init__(reactor)
        self.fd = fd
        self._flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, self._flags | os.O_NONBLOCK)
        self._gathered = bytearray()
        self._eof = False
        self._waiter: Deferred[bytes] | None = None
        self.startReading()  # type: ignore[no-untyped-call]

    def fileno(self) -> int:
        return self.fd

    def doRead(self) -> object:
        try:
            data = os.read(self.fd, READ_SIZE)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EINTR):
                return None
            return CONNECTION_LOST
        if not data:
            return CONNECTION_DONE
        self._gathered += data
        if len(self._gathered) >= BATCH_MAX:
            self.stopReading()  # type: ignore[no-untyped-call]
        self._wake()
        return None

    def connectionLost(self, reason: Failure) -> None:
        self._eof = True
        self.stopReading()  # type: ignore[no-untyped-call]
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.callback(self._take())

    def _take(self) -> bytes:
        data, self._gathered = bytes(self._gathered), bytearray()
        if not self._eof:
            self.startReading()  # type: ignore[no-untyped-call]
        return data

    def take(self) -> Deferred[bytes]:
        """What was gathered, or the next bytes to come (``b""``: EOF)."""
        if self._gathered or self._eof:
            return succeed(self._take())
        self._waiter = Deferred()
        return self._waiter

    def close(self) -> None:
        """Stop reading; give stdin its flags back (it is shared with the shell)."""
        self.stopReading()  # type: ignore[no-untyped-call]
        fcntl.fcntl(self.fd, fcntl.F_SETFL, self._flags)


class FileReader:
    """Reads a regular file or a device such as ``/dev/null`` (reads that never wait)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def take(self) -> Deferred[bytes]:
        return succeed(os.read(self.fd, READ_SIZE))

    def close(self) -> None:
        """Nothing to give back."""


def reader_of(reactor: Any, fd: int) -> PipeReader | FileReader:
    """A reader of ``fd`` that never holds ``reactor`` (the global one when ``None``)."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd):
        if reactor is None:
            from twisted.internet import reactor
        return PipeReader(reactor, fd)
    return FileReader(fd)


async def pump(
    reader: PipeReader | FileReader,
    send: Callable[[bytes], Deferred[None]],
    close: Callable[[], Deferred[None]],
) -> None:
    """Send what ``reader`` gives, a chunk at a time, then EOF; stops quietly once the command
    takes no more stdin (it ended, or closed its end)."""
    try:
        while data := await reader.take():
            await send(data)
        await close()
    except SandboxError as e:
        if e.status != 409 and not isinstance(e, ProcessNotFound):
            raise
        # 409: the command ended first (what it did not read does not matter)


async def streamed(
    client: HttpSandbox,
    handle: SandboxHandle,
    args: argparse.Namespace,
    reader: PipeReader | FileReader,
    on_output: Callable[[OutputChunk], object],
) -> int:
    """Run the command of ``args`` with ``reader`` as its stdin; its exit code."""
    started = await client.start_process(
        handle,
        args.cmd,
        env=dict(args.env) or None,
        cwd=args.cwd,
        timeout=args.timeout,
        tag="sandboxctl exec",
        stdin=True,
    )
    sending = Deferred.fromCoroutine(
        pump(
            reader,
            lambda data: client.send_stdin(handle, started.id, data),
            lambda: client.close_stdin(handle, started.id),
        )
    )
    lost: list[Failure] = []

    def end_command(failure: Failure) -> Deferred[None] | None:
        """Stdin could not reach the command: end it (it would wait for an EOF that never
        comes), and raise the cause once its output has ended."""
        if failure.check(CancelledError):
            return None
        lost.append(failure)
        killed: Deferred[None] = client.signal(handle, started.id, "KILL")
        return killed.addErrback(lambda f: None)  # it may have ended meanwhile

    sending.addErrback(end_command)
    try:
        result = await client.output(handle, started.id, 0, True, on_output)
    except BaseException:
        await client.signal(handle, started.id, "KILL")
        raise
    finally:
        reader.close()
    if not sending.called:
        sending.cancel()
    await sending
    if lost:
        lost[0].raiseException()
    code = result.exit_code
    return 0 if code is None else code


def buffered(stdin: Any) -> bytes:
    """All of stdin for a replica without streamed stdin; ``ValueError`` naming the limit."""
    data: bytes = stdin.read(BUFFERED_MAX + 1)
    if len(data) > BUFFERED_MAX:
        raise ValueError(
            f"stdin is over {BUFFERED_MAX >> 20} MiB: this sandboxd takes stdin only whole in"
            " the exec request (its 64 MiB JSON body limit); one with background processes"
            " (the processes capability) streams any length"
        )
    return data
