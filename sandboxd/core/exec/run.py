"""One running command: its process, the NDJSON frames it produces, its timers.

An :class:`ExecRun` is the ``ProcessProtocol`` of the spawned command and the push producer of
its HTTP response: when the client reads slowly, twisted.web pauses it, and it stops reading the
command's pipes, so the command blocks on write instead of the daemon buffering without bound.
"""

import contextlib
import errno
import fcntl
import functools
import json
import os
import signal
import struct
import termios
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pybase64
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorProcess, IReactorTime
from twisted.internet.main import CONNECTION_DONE, CONNECTION_LOST
from twisted.internet.process import ProcessReader
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure
from zope.interface import implementer

EXIT_TIMEOUT = 124
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
EXIT_SIGNAL_BASE = 128

LINGER_AFTER_EXIT = 1.0
"""Seconds to keep reading after the command exits, for output still in the pipes (a
background child that keeps the pipes open does not hold the exec open longer than this)."""

CAPABILITIES = ("exec.keepalive", "exec.output-cap", "exec.backpressure")

KEEPALIVE_FRAME = b'{"o":""}\n'

READ_SIZE = 1 << 16
"""Bytes read from the command's stdout or stderr at a time when its pipe could not be enlarged:
a pipe's whole default capacity. Twisted reads 8 KiB; each read is one frame, so bulk output
costs 8 times the reads, frames and reactor turns."""

PIPE_SIZE = 1 << 19
"""The capacity asked for the command's stdout and stderr pipes (``F_SETPIPE_SZ``; up to 1 MiB
an unprivileged process may ask by default), and then the size of each read: bulk output goes
out in frames of up to this much, 8 times fewer than with a default pipe, each costing its
reads, its frame and its turns of the reactor and of the HTTP flow control. 1 MiB streams no
faster here, and its frames, copied three times on their way out, left the daemon's heap some
30 MiB larger after a long stream (peak RSS growth streaming 512 MiB: 46 against 15 MiB). Quiet
output is unaffected: a read returns what the pipe holds."""


def waiting(fd: int) -> int:
    """Bytes waiting to be read from the pipe ``fd`` (``FIONREAD``); 0 when it cannot tell."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return 0


def read_from(fd: int, received: Callable[[bytes], None], size: int = READ_SIZE) -> object:
    """``twisted.internet.fdesc.readFromFD``, reading what the pipe holds: at least
    :data:`READ_SIZE`, at most ``size`` bytes. A read buffer of a megabyte is mapped and
    unmapped for each read (19 us against 1.3 us here), so it is asked for only when that much
    is waiting, not for every line of a chatty command."""
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
    for reader in getattr(process, "pipes", {}).values():
        if isinstance(reader, ProcessReader):
            size = max(enlarge_pipe(reader.fd), READ_SIZE)
            reader.doRead = functools.partial(  # type: ignore[method-assign]
                read_from, reader.fd, reader.dataReceived, size
            )


def output_frame(data: bytes) -> bytes:
    """The NDJSON line of one live output chunk (``pybase64``: SIMD, tens of times faster
    than ``base64``, which cost most of the daemon's time when streaming bulk output)."""
    return b"".join((b'{"o":"', pybase64.b64encode(data), b'"}\n'))


_BASE64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_EXIT_KEYS = (["exit", "out", "err"], ["exit", "out", "err", "truncated"])


PART_SIZE = 1 << 20
"""Bytes of an exit frame's base64 checked, encoded and written at a time."""


def _is_base64_text(value: object) -> bool:
    """``value`` is base64 text (which JSON writes as is).

    Checked a megabyte at a time: ``bytes.translate`` first allocates a result as large as its
    input, which for a whole exit frame's buffer would be one more copy of it at the peak.
    """
    if not isinstance(value, str) or not value.isascii():
        return False
    for start in range(0, len(value), PART_SIZE):
        if value[start : start + PART_SIZE].encode("ascii").translate(None, _BASE64):
            return False
    return True


def _slices(text: str) -> Iterator[bytes]:
    for start in range(0, len(text), PART_SIZE):
        yield text[start : start + PART_SIZE].encode("ascii")


def frame_parts(frame: Mapping[str, Any]) -> Iterator[bytes]:
    """Any other NDJSON line, in parts whose concatenation is the line.

    The exit frame carries up to ``max_output`` of output in base64: its parts are the very
    bytes ``json.dumps`` gives, in a fraction of its time, and its buffers come a megabyte at
    a time, encoded as they are asked for. Written as the connection takes them, the line of
    megabytes is never held whole as bytes, nor copied whole into the connection's buffer.
    """
    keys = list(frame)
    truncated = frame.get("truncated", False)
    if keys in _EXIT_KEYS and type(frame["exit"]) is int and type(truncated) is bool:
        out, err = frame["out"], frame["err"]
        if _is_base64_text(out) and _is_base64_text(err):
            tail = b'"}\n'
            if len(keys) == 4:
                tail = b'","truncated":true}\n' if truncated else b'","truncated":false}\n'
            yield b'{"exit":%d,"out":"' % frame["exit"]
            yield from _slices(out)
            yield b'","err":"'
            yield from _slices(err)
            yield tail
            return
    yield json.dumps(frame, separators=(",", ":")).encode() + b"\n"


def encode_frame(frame: Mapping[str, Any]) -> bytes:
    """Any other NDJSON line (:func:`frame_parts` joined)."""
    return b"".join(frame_parts(frame))


def exit_code_of(reason: Failure) -> int:
    """The shell's exit code for how a process ended (``128 + N`` for signal N)."""
    value = reason.value
    if isinstance(value, ProcessDone):
        return 0
    if isinstance(value, ProcessTerminated):
        if value.signal is not None:
            return EXIT_SIGNAL_BASE + int(value.signal)
        if value.exitCode is not None:
            return int(value.exitCode)
    return 1


@implementer(IPushProducer)
class ExecRun(ProcessProtocol):
    """Runs one command and reports it as frames; :meth:`when_finished` gives the final frame."""

    def __init__(
        self,
        clock: IReactorTime,
        emit: Callable[[bytes], None],
        *,
        max_output: int,
        keepalive: float,
        log_timeout: float,
        timeout: float,
        on_activity: Callable[[], None] = lambda: None,
        on_end: Callable[[], None] = lambda: None,
        kill: Callable[[int, int], None] = os.killpg,
    ) -> None:
        self.clock = clock
        self.emit = emit
        self.max_output = max_output
        self.keepalive = keepalive
        self.log_timeout = log_timeout
        self.timeout = timeout
        self.on_activity = on_activity
        self.on_end = on_end
        self._killpg = kill
        self.frame: dict[str, Any] | None = None
        self._waiters: list[Deferred[dict[str, Any]]] = []
        self.buffers: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self.truncated = False
        self.timed_out = False
        self.stdin: bytes | None = None
        self.pid: int | None = None
        self._timers: dict[str, IDelayedCall] = {}
        self._paused = False
        self._exited = False
        self._writers: list[Deferred[None]] = []

    def start(
        self,
        reactor: IReactorProcess,
        argv: Sequence[str],
        env: Mapping[str, str],
        stdin: bytes | None,
        devnull: int,
    ) -> None:
        """Spawn ``argv``; a command that cannot be executed ends at once with 127 or 126."""
        self.stdin = stdin
        child_fds: dict[int, int | str] = {0: "w" if stdin is not None else devnull, 1: "r", 2: "r"}
        try:
            process = reactor.spawnProcess(
                self, argv[0], list(argv), env=dict(env), childFDs=child_fds
            )
        except FileNotFoundError as e:
            self._finish(EXIT_NOT_FOUND, f"{argv[0]}: command not found: {e}\n".encode())
            return
        except PermissionError as e:
            self._finish(EXIT_NOT_EXECUTABLE, f"{argv[0]}: not executable: {e}\n".encode())
            return
        except OSError as e:  # the host could not start it (EAGAIN, ENOMEM...): in band
            self._end({"error": "SpawnFailed", "detail": f"cannot start the command: {e}"})
            return
        self.pid = process.pid
        self._schedule("deadline", self.timeout, self._expire)
        self._schedule("silence", self.log_timeout, self._expire)
        self._schedule("keepalive", self.keepalive, self._keepalive)

    @property
    def ended(self) -> bool:
        return self.frame is not None

    def when_finished(self) -> Deferred[dict[str, Any]]:
        """A new Deferred firing with the final frame (cancelling it does not stop the run)."""
        waiter: Deferred[dict[str, Any]] = Deferred()
        if self.frame is not None:
            waiter.callback(self.frame)
        else:
            self._waiters.append(waiter)
        return waiter

    # ProcessProtocol

    def connectionMade(self) -> None:
        read_in_large_chunks(self.transport)
        if self.stdin is not None:
            assert self.transport is not None
            self.transport.write(self.stdin)
            self.transport.closeStdin()

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        self.emit(output_frame(data))
        kept = self.buffers[childFD]
        room = self.max_output - len(kept)
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        kept += data
        self.on_activity()
        self._schedule("keepalive", self.keepalive, self._keepalive)
        if not self._paused:
            self._schedule("silence", self.log_timeout, self._expire)

    def processExited(self, reason: Failure) -> None:
        """The command is gone; give its pipes a moment, then stop waiting for them.

        While the client reads slowly (paused), the pipes are not being read: what the command
        wrote last is still in them, so the moment starts only once reading resumes.
        """
        self._exited = True
        if not self._paused:
            self._schedule("linger", LINGER_AFTER_EXIT, self._close_pipes)

    def processEnded(self, reason: Failure) -> None:
        code = EXIT_TIMEOUT if self.timed_out else exit_code_of(reason)
        self._finish(code)

    # IPushProducer (the HTTP response's flow control)

    def pauseProducing(self) -> None:
        self._paused = True
        self._cancel("silence")
        self._cancel("linger")
        if self.transport is not None:
            self.transport.pauseProducing()  # type: ignore[attr-defined]

    def resumeProducing(self) -> None:
        self._paused = False
        if self.transport is not None and not self.ended:
            self._schedule("silence", self.log_timeout, self._expire)
            if self._exited:
                self._schedule("linger", LINGER_AFTER_EXIT, self._close_pipes)
            self.transport.resumeProducing()  # type: ignore[attr-defined]
        self._release_writers()

    def stopProducing(self) -> None:
        self.abort()
        self._release_writers()

    def writable(self) -> Deferred[None]:
        """A Deferred firing once the response takes more (the final frame is written a part
        at a time): at once, unless the client reads slowly (paused), then when it resumes or
        the response is stopped."""
        writer: Deferred[None] = Deferred()
        if self._paused:
            self._writers.append(writer)
        else:
            writer.callback(None)
        return writer

    def _release_writers(self) -> None:
        writers, self._writers = self._writers, []
        for writer in writers:
            if not writer.called:  # a cancelled one has been called
                writer.callback(None)

    # Ending

    def abort(self) -> None:
        """Kill the command's whole process group (client gone, daemon stopping, sandbox killed)."""
        if self.ended or self.pid is None:
            return
        try:
            self._killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            # Not yet a group leader (still in the wrapper) or already gone. Once reaped, the
            # pid may belong to another process: only a command not yet exited is killed by pid.
            if not self._exited:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
        self._close_pipes()

    def _expire(self) -> None:
        self.timed_out = True
        self.abort()

    def _close_pipes(self) -> None:
        if self.transport is not None:
            self.transport.loseConnection()

    def _keepalive(self) -> None:
        self.emit(KEEPALIVE_FRAME)
        self._schedule("keepalive", self.keepalive, self._keepalive)

    def _finish(self, code: int, stderr: bytes = b"") -> None:
        if stderr:
            self.emit(output_frame(stderr))
            self.buffers[2] += stderr
        frame: dict[str, Any] = {"exit": code}
        for fd, key in ((1, "out"), (2, "err")):
            frame[key] = pybase64.b64encode_as_string(self.buffers[fd])
            self.buffers[fd] = bytearray()  # up to max_output each: not kept twice
        if self.truncated:
            frame["truncated"] = True
        self._end(frame)

    def _end(self, frame: dict[str, Any]) -> None:
        """Settle the run with its last frame (an exit frame, or an in-band error frame)."""
        for name in list(self._timers):
            self._cancel(name)
        self.frame = frame
        self.on_end()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.called:
                waiter.callback(frame)

    def _schedule(self, name: str, delay: float, action: Callable[[], None]) -> None:
        self._cancel(name)
        self._timers[name] = self.clock.callLater(delay, self._fire, name, action)

    def _fire(self, name: str, action: Callable[[], None]) -> None:
        del self._timers[name]
        action()

    def _cancel(self, name: str) -> None:
        call = self._timers.pop(name, None)
        if call is not None and call.active():
            call.cancel()
