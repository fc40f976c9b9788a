"""One running command: a ``ProcessProtocol`` that reports what happens as plain events.

An :class:`ExecRun` spawns the command, keeps its deadline and its silence clock, and tells
its listener each output chunk (:attr:`ExecRun.on_output`) and how the command ended
(:meth:`ExecRun.when_finished`: an :class:`Exited` or a :class:`SpawnFailed`). It knows nothing
of frames or connections: a front turns the events into its wire, and calls
:meth:`ExecRun.pause_reading` / :meth:`ExecRun.resume_reading` when its client reads slowly,
so the command blocks on write instead of the daemon buffering without bound.
"""

import contextlib
import io
import os
import signal
from collections.abc import Callable, Mapping, Sequence

from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.interfaces import IDelayedCall, IReactorProcess, IReactorTime
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from sandboxd._twisted import output_readers
from sandboxd.core.exec.pipes import StdinGate, read_in_large_chunks, waiting

EXIT_TIMEOUT = 124
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
EXIT_SIGNAL_BASE = 128
EXIT_KILLED = EXIT_SIGNAL_BASE + signal.SIGKILL

LINGER_AFTER_EXIT = 1.0
"""Seconds to keep reading after the command exits, for output still in the pipes (a
background child that keeps the pipes open does not hold the exec open longer than this)."""

CAPABILITIES = ("exec.keepalive", "exec.output-cap", "exec.backpressure")


@frozen
class Exited:
    """The command ended: its shell exit code and its kept stdout and stderr."""

    code: int
    out: bytes
    err: bytes
    truncated: bool = False
    """Some output was not kept (over ``max_output``); the live stream had all of it."""
    timed_out: bool = False
    signal: int | None = None
    """The signal that killed the command (``code`` is then ``128 + signal``), if one did."""
    oom_killed: bool = False
    """The kernel OOM-killed a process of the sandbox while the command ran (its memory
    limit was reached): the usual cause of a 137."""


@frozen
class SpawnFailed:
    """The host could not start the command (``EAGAIN``, ``ENOMEM``...)."""

    detail: str


Outcome = Exited | SpawnFailed


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


class ExecRun(ProcessProtocol):
    """Runs one command; ``on_output(fd, data)`` for each chunk, :meth:`when_finished` for
    the end."""

    def __init__(
        self,
        clock: IReactorTime,
        on_output: Callable[[int, bytes], None],
        *,
        max_output: int,
        log_timeout: float | None,
        timeout: float | None,
        on_activity: Callable[[], None] = lambda: None,
        on_end: Callable[[], None] = lambda: None,
        kill: Callable[[int, int], None] = os.killpg,
    ) -> None:
        self.clock = clock
        self.on_output = on_output
        self.max_output = max_output
        self.log_timeout = log_timeout
        self.timeout = timeout
        self.on_activity = on_activity
        self.on_end = on_end
        self._killpg = kill
        self.review: Callable[[Outcome], Outcome] = lambda outcome: outcome
        """Completes the outcome before it is settled (the OOM kills seen meanwhile)."""
        self.outcome: Outcome | None = None
        self._waiters: list[Deferred[Outcome]] = []
        self.buffers: dict[int, io.BytesIO] = {1: io.BytesIO(), 2: io.BytesIO()}
        """What is kept of stdout and stderr for the outcome (``max_output`` each). A
        ``BytesIO``: its ``getvalue`` hands over the bytes it holds without copying them, so
        the end of a command that printed megabytes costs the reactor no copy."""
        self.truncated = False
        self.timed_out = False
        self.stdin: bytes | None = None
        self.pid: int | None = None
        self._timers: dict[str, IDelayedCall] = {}
        self._paused = False
        self._exited = False
        self.keep_stdin_open = False
        self.stdin_open = False
        """The command's stdin is a pipe still open for :meth:`write_stdin`."""
        self.stdin_gate = StdinGate()
        """Paused while what :meth:`write_stdin` wrote is not yet in the pipe."""
        self._unsent: list[int] | None = None
        """Signals for a command whose pid a spawn server has yet to answer (``None``: none
        awaited)."""
        self._start_waiters: list[Deferred[None]] = []

    def start(
        self,
        reactor: IReactorProcess,
        argv: Sequence[str],
        env: Mapping[str, str],
        stdin: bytes | None,
        devnull: int,
        *,
        keep_stdin_open: bool = False,
    ) -> None:
        """Spawn ``argv``; a command that cannot be executed ends at once with 127 or 126.

        ``stdin`` bytes are fed, then EOF; with ``keep_stdin_open`` the pipe stays open for
        :meth:`write_stdin` until :meth:`close_stdin`; with neither, stdin is ``/dev/null``.
        """
        self.stdin = stdin
        self.keep_stdin_open = keep_stdin_open
        piped = stdin is not None or keep_stdin_open
        child_fds: dict[int, int | str] = {0: "w" if piped else devnull, 1: "r", 2: "r"}
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
        except OSError as e:  # the host could not start it (EAGAIN, ENOMEM...)
            self._end(SpawnFailed(f"cannot start the command: {e}"))
            return
        # A command that exits at once is reaped inside spawnProcess (the transport's pid is
        # then None): its pid was taken in connectionMade.
        self.pid = self.pid or process.pid
        self.stdin_open = keep_stdin_open and not self.ended
        if self.ended:
            return
        if self.pid is None:
            self._unsent = []  # a spawn server's child: the pid comes with its answer
        if self.timeout is not None:
            self._schedule("deadline", self.timeout, self._expire)
        self._schedule_silence()

    @property
    def ended(self) -> bool:
        return self.outcome is not None

    def when_started(self) -> Deferred[None]:
        """A new Deferred firing once the command has a pid or will never have one: at once
        for a spawned command (or one that ended), else when the spawn server answers (its
        :meth:`spawned` or :meth:`spawn_failed`)."""
        waiter: Deferred[None] = Deferred()
        if self._unsent is None or self.ended:
            waiter.callback(None)
        else:
            self._start_waiters.append(waiter)
        return waiter

    def when_finished(self) -> Deferred[Outcome]:
        """A new Deferred firing with the outcome (cancelling it does not stop the run)."""
        waiter: Deferred[Outcome] = Deferred()
        if self.outcome is not None:
            waiter.callback(self.outcome)
        else:
            self._waiters.append(waiter)
        return waiter

    # ProcessProtocol

    def connectionMade(self) -> None:
        self.pid = getattr(self.transport, "pid", None)
        read_in_large_chunks(self.transport)
        if self.keep_stdin_open:
            self.stdin_gate.attach(self.transport)
        if self.stdin is not None:
            assert self.transport is not None
            self.transport.write(self.stdin)
            if not self.keep_stdin_open:
                self.transport.closeStdin()

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        self.on_output(childFD, data)
        kept = self.buffers[childFD]
        room = self.max_output - kept.tell()
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        kept.write(data)
        self.on_activity()
        if not self._paused:
            self._schedule_silence()

    def processExited(self, reason: Failure) -> None:
        """The command is gone; give its pipes a moment, then stop waiting for them.

        While the reader is slow (paused), the pipes are not being read: what the command
        wrote last is still in them, so the moment starts only once reading resumes.
        """
        self._exited = True
        if not self._paused:
            self._schedule("linger", LINGER_AFTER_EXIT, self._drain_and_close_pipes)

    def processEnded(self, reason: Failure) -> None:
        code = EXIT_TIMEOUT if self.timed_out else exit_code_of(reason)
        killed = getattr(reason.value, "signal", None)
        self._finish(code, signal=None if killed is None else int(killed))

    # Flow control: the front's client reads slowly

    def pause_reading(self) -> None:
        """Stop reading the command's pipes (it blocks on write) and its silence clock."""
        self._paused = True
        self._cancel("silence")
        self._cancel("linger")
        if self.transport is not None:
            self.transport.pauseProducing()  # type: ignore[attr-defined]

    def resume_reading(self) -> None:
        """Read the command's pipes again."""
        self._paused = False
        if self.transport is not None and not self.ended:
            self._schedule_silence()
            if self._exited:
                self._schedule("linger", LINGER_AFTER_EXIT, self._drain_and_close_pipes)
            self.transport.resumeProducing()  # type: ignore[attr-defined]

    # A spawn server's child (sandboxd.isolation.exec.spawn_server.Served)

    def spawned(self, pid: int) -> None:
        """The server started the command as ``pid``: the signals sent meanwhile go to it."""
        self.pid = pid
        unsent, self._unsent = self._unsent or [], None
        for signum in unsent:
            self._send(signum)
        self._started()

    def spawn_failed(self, error: OSError) -> None:
        """The server made no child (``EAGAIN``, ``ENOMEM``...): the command never ran."""
        self._unsent = None
        self._end(SpawnFailed(f"cannot start the command: {error}"))
        self._started()

    def _started(self) -> None:
        waiters, self._start_waiters = self._start_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    # Input and signals (a background process)

    def write_stdin(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin pipe (:attr:`stdin_open` must be true)."""
        assert self.transport is not None and self.stdin_open
        self.transport.write(data)

    def close_stdin(self) -> None:
        """Close the command's stdin pipe: it reads EOF once what was written is read
        (:attr:`stdin_open` must be true)."""
        assert self.transport is not None and self.stdin_open
        self.stdin_open = False
        self.transport.closeStdin()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the command's process group (to the command alone while it is
        not yet a group leader). Nothing once it has exited: its pid may be another's."""
        if self._unsent is not None:
            self._unsent.append(signum)
        if self.ended or self._exited or self.pid is None:
            return
        self._send(signum)

    def _send(self, signum: int) -> None:
        assert self.pid is not None
        try:
            self._killpg(self.pid, signum)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    # Ending

    def abort(self) -> None:
        """Kill the command's whole process group (client gone, daemon stopping, sandbox killed)."""
        if self._unsent is not None and not self.ended:
            self._unsent.append(signal.SIGKILL)  # the server has yet to answer its pid
            self._close_pipes()
            return
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

    def _drain_and_close_pipes(self) -> None:
        """Read what the exited command left in its pipes, then close them.

        The moment after the exit may run out before the reactor has come round to the pipes
        (a busy daemon): timers run before I/O in a reactor turn, so without this read the
        command's last output would be lost. Only what is waiting now is read (one read per
        pipe): a background child that keeps writing does not hold the run open.
        """
        for reader in output_readers(self.transport):  # set: the command has exited
            if waiting(reader.fd) > 0:
                reader.doRead()
        self._close_pipes()

    def _finish(self, code: int, stderr: bytes = b"", signal: int | None = None) -> None:
        if stderr:
            self.on_output(2, stderr)
            self.buffers[2].write(stderr)
        out, err = self.buffers[1].getvalue(), self.buffers[2].getvalue()
        self.buffers = {1: io.BytesIO(), 2: io.BytesIO()}  # the old ones share out and err
        self._end(Exited(code, out, err, self.truncated, self.timed_out, signal))

    def _end(self, outcome: Outcome) -> None:
        """Settle the run with its outcome (as :attr:`review` completes it)."""
        for name in list(self._timers):
            self._cancel(name)
        self.outcome = outcome = self.review(outcome)
        self.on_end()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.called:
                waiter.callback(outcome)

    def _schedule_silence(self) -> None:
        if self.log_timeout is not None:
            self._schedule("silence", self.log_timeout, self._expire)

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
