"""One background process: its run, its output log, its stdin, its end; and its readers.

A :class:`Process` owns the :class:`~sandboxd.core.exec.run.ExecRun` that runs the command
(the same runner as ``exec``) and an :class:`~sandboxd.core.processes.log.OutputLog` its
output goes into. A :class:`Reader` follows that log from an offset and hands its
:data:`ReaderEvent` values to whoever asked (a front): output chunks, ``Dropped`` when its
offset fell out of the log, then one end (``Ended``, ``SandboxGone``, or ``Caught_up`` for a
reader that does not follow). Readers come and go; none of them changes anything for the
process.
"""

import signal as signals
from collections.abc import Callable, Mapping
from typing import BinaryIO

from attrs import define, field, frozen
from twisted.internet.defer import Deferred, DeferredLock
from twisted.logger import Logger

from sandboxd.core.exec.run import ExecRun, Exited, Outcome
from sandboxd.core.processes.log import Chunk, OutputLog, tell_each
from sandboxd.core.processes.terminal import TerminalRun, TerminalSize
from sandboxd.errors import BadRequest, ProcessConflict

SIGNALS: Mapping[str, int] = {
    name: int(getattr(signals, "SIG" + name))
    for name in ("TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT")
}
"""The signal names a process may be sent, to their numbers (docs/extensions.rst,
"Background processes")."""

log = Logger()


@frozen
class Dropped:
    """``count`` bytes the reader asked for fell out of the log before it read them."""

    count: int


@frozen
class Ended:
    """The process ended: its shell exit code (``None``: it could never start, ``detail``),
    the signal that killed it if one did, and whether its ``timeout`` ended it."""

    code: int | None
    detail: str = ""
    signal: int | None = None
    timed_out: bool = False


@frozen
class SandboxGone:
    """The sandbox of the process was killed while the reader read."""


@frozen
class CaughtUp:
    """A reader that does not follow has read what was there; the process runs on."""

    offset: int


ReaderEvent = Chunk | Dropped | Ended | SandboxGone | CaughtUp


@frozen
class ProcessListing:
    """What a list of processes shows of one: its ids, command, start, and whether (and how)
    it ended (``exit``: its shell exit code, ``None`` while it runs or if it never started)."""

    id: str
    pid: int | None
    tag: str | None
    cmd: tuple[str, ...]
    started: float
    running: bool
    exit: int | None
    pty: tuple[int, int] | None = None
    """The rows and columns of its terminal (``None``: it runs on none)."""


@define(eq=False)
class Process:
    """A command running (or ended) in the background of a sandbox."""

    id: str
    tag: str | None
    cmd: tuple[str, ...]
    started: float
    run: ExecRun
    log: OutputLog
    stdin: bool
    """Started with a stdin pipe (``stdin: true``)."""
    gone: bool = False
    """Its sandbox was killed."""
    _end_listeners: set[Callable[[], None]] = field(factory=set)
    _stdin_turn: DeferredLock = field(factory=DeferredLock)

    @property
    def pid(self) -> int | None:
        return self.run.pid

    @property
    def running(self) -> bool:
        return not self.run.ended and not self.gone

    @property
    def end(self) -> Ended | None:
        """How it ended, once it has."""
        return ended_of(self.run.outcome)

    def listing(self) -> ProcessListing:
        """What a list of processes shows of it, now."""
        end = self.end
        size = self.run.size if isinstance(self.run, TerminalRun) else None
        return ProcessListing(
            id=self.id,
            pid=self.pid,
            tag=self.tag,
            cmd=self.cmd,
            started=self.started,
            running=self.running,
            exit=None if end is None else end.code,
            pty=None if size is None else (size.rows, size.cols),
        )

    # Called by the run (its output goes straight into the log)

    def ended(self) -> None:
        self._tell_end()

    def close(self) -> None:
        """Its sandbox is being killed: every reader is told, then the command is killed."""
        self.gone = True
        self._tell_end()
        self.run.abort()

    def _tell_end(self) -> None:
        tell_each(self._end_listeners, f"process {self.id}'s end")

    # Input and signals

    def write_stdin(self, data: bytes) -> None:
        """Write to its stdin; ``ProcessConflict`` without a stdin pipe, after EOF or end."""
        self._check_stdin()
        if data:
            self.run.write_stdin(data)

    def stdin_drained(self) -> Deferred[None]:
        """Fires once what was written to its stdin is in the pipe (or the pipe is gone): a
        writer that waits for it holds the daemon to one chunk in memory."""
        return self.run.stdin_gate.drained()

    async def feed_stdin(self, source: BinaryIO, limit: int) -> None:
        """Write up to ``limit`` bytes of ``source`` to its stdin once every earlier writer's
        bytes are in the pipe, and return once these are too: however many callers write at
        once, the daemon holds one chunk of its stdin (the others wait, their bodies unread).
        ``ProcessConflict`` as for :meth:`write_stdin`."""
        await self._stdin_turn.acquire()
        try:
            await self.stdin_drained()
            self.write_stdin(source.read(limit))
            await self.stdin_drained()
        finally:
            self._stdin_turn.release()

    def close_stdin(self) -> None:
        """Close its stdin (EOF); ``ProcessConflict`` as for :meth:`write_stdin`."""
        self._check_stdin()
        self.run.close_stdin()

    def _check_stdin(self) -> None:
        if not self.stdin:
            raise ProcessConflict(f"process {self.id} was started without stdin: true")
        if not self.running:
            raise ProcessConflict(f"process {self.id} has ended")
        if not self.run.stdin_open:
            raise ProcessConflict(f"process {self.id}: stdin is already closed (EOF sent)")

    def signal(self, name: str) -> None:
        """Send the signal ``name`` (a key of :data:`SIGNALS`) to its process group;
        ``ProcessConflict`` once it has ended (its pid may be another's by then)."""
        if not self.running:
            raise ProcessConflict(f"process {self.id} has ended")
        self.run.signal(SIGNALS[name])

    def signal_foreground(self, name: str) -> None:
        """Send the signal ``name`` to its terminal's foreground process group (the job a
        shell runs now, as ``Ctrl-C`` would); ``ProcessConflict`` as for :meth:`resize`."""
        self._running_terminal().signal_foreground(SIGNALS[name])

    def resize(self, size: TerminalSize) -> None:
        """Give its terminal the window size ``size``; ``ProcessConflict`` for a process that
        runs on no terminal, or has ended."""
        self._running_terminal().resize(size)

    def _running_terminal(self) -> TerminalRun:
        if not isinstance(self.run, TerminalRun):
            raise ProcessConflict(f"process {self.id} is not a terminal")
        if not self.running:
            raise ProcessConflict(f"process {self.id} has ended")
        return self.run

    # Readers

    def reader(
        self, offset: int | None, follow: bool, deliver: Callable[[ReaderEvent], None]
    ) -> "Reader":
        """A reader from byte ``offset`` (``None``: from what comes next); start it with
        :meth:`Reader.resume`. An offset past what was written is a ``BadRequest``."""
        written = self.log.written
        if offset is not None and offset > written:
            raise BadRequest(f"offset: past the end of the output ({written} bytes so far)")
        return Reader(self, written if offset is None else offset, follow, deliver)


def ended_of(outcome: Outcome | None) -> Ended | None:
    if outcome is None:
        return None
    if isinstance(outcome, Exited):
        return Ended(outcome.code, signal=outcome.signal, timed_out=outcome.timed_out)
    return Ended(None, outcome.detail)


class Reader:
    """Reads one process's log from an offset, as fast as its consumer takes it.

    Pull-based: while not paused it reads the log up to its end and hands each event to
    ``deliver``; paused (its consumer is slow), it reads nothing and holds nothing, and the
    process runs on. It resumes where it stopped, or, if that fell out meanwhile, with a
    :class:`Dropped` first. A consumer that raises is logged, once, and read for no more:
    the process and its other readers go on.
    """

    def __init__(
        self,
        process: Process,
        offset: int,
        follow: bool,
        deliver: Callable[[ReaderEvent], None],
    ) -> None:
        self.process = process
        self.cursor = max(offset, 0)
        self.follow = follow
        self.deliver = deliver
        self.until = None if follow else process.log.written
        self.done = False
        self._paused = True
        self._pumping = False
        self._stops = [
            process.log.listen(self._pump),
            _listen(process._end_listeners, self._pump),
        ]

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._pump()

    def stop(self) -> None:
        """Read no more (its consumer went away)."""
        self.done = True
        for stop in self._stops:
            stop()

    def _pump(self) -> None:
        if self._pumping or self.done:
            return
        if self.process.gone:
            # Told at once, even to a paused reader: a slow client holds nothing of a dead
            # sandbox (its log goes with it).
            self._finish(SandboxGone())
            return
        self._pumping = True
        try:
            while not self._paused and not self.done:
                # Not past ``until``: what was written after a non-following reader was made.
                found = self.process.log.read(self.cursor, until=self.until)
                if found.dropped:
                    self.cursor += found.dropped
                    self._tell(Dropped(found.dropped))
                    if self.done:
                        break
                if not found.chunks:
                    self._at_the_end()
                    break
                for chunk in found.chunks:
                    self.cursor = chunk.end
                    self._tell(chunk)
                    if self._paused or self.done:
                        break
                if self.until is not None and self.cursor >= self.until:
                    self._at_the_end()
                    break
        finally:
            self._pumping = False

    def _at_the_end(self) -> None:
        end = self.process.end
        if end is not None and self.cursor >= self.process.log.written:
            self._finish(end)
        elif not self.follow:
            self._finish(CaughtUp(self.cursor))

    def _finish(self, event: ReaderEvent) -> None:
        if self.done:  # its consumer stopped it, or raised, on the last chunk
            return
        self.stop()
        self._tell(event)

    def _tell(self, event: ReaderEvent) -> None:
        try:
            self.deliver(event)
        except Exception:
            self.stop()
            log.failure("a reader of process {id} raised: it reads no more", id=self.process.id)


def _listen(listeners: set[Callable[[], None]], listener: Callable[[], None]) -> Callable[[], None]:
    listeners.add(listener)
    return lambda: listeners.discard(listener)
