"""One running command (``sandboxd.core.exec.run.ExecRun``) and the stream writer that turns its
events into frames (``sandboxd.http.stream.ExecStream``): timers, flow control, ending.

A ``Clock`` drives every timer and a fake reactor/process transport stands in for the child,
so each rule (deadline, silence, keepalive, pause/resume, abort) is checked step by step.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import json
import os
import signal
import subprocess
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import CancelledError
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.main import CONNECTION_DONE, CONNECTION_LOST
from twisted.internet.process import ProcessReader
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from sandboxd.core.exec import pipes as exec_run
from sandboxd.core.exec.run import (
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_TIMEOUT,
    LINGER_AFTER_EXIT,
    ExecRun,
    Exited,
    SpawnFailed,
    exit_code_of,
)
from sandboxd.http.stream import ExecStream
from sandboxd.http.wire import (
    EXIT_PART,
    KEEPALIVE_FRAME,
    final_frame,
    final_frame_parts,
    frame_line,
    output_frame,
)
from tests.support.fakes import FakeProcess, FakeReactor

PID = 424242
DEVNULL = 99


class Response:
    """What the stream writer writes to: the frames, and the producer registered."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.producer: Any = None

    def write(self, data: bytes) -> None:
        self.frames.append(data)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self.producer = producer


class Harness:
    """An ExecRun followed by its stream writer, with recorded frames, kills and callbacks."""

    def __init__(self, **overrides: Any) -> None:
        self.clock = Clock()
        self.response = Response()
        self.frames = self.response.frames
        self.kills: list[tuple[int, int]] = []
        self.activity = 0
        self.ends = 0
        self.kill_error: BaseException | None = None
        settings = {"max_output": 16, "log_timeout": 30.0, "timeout": 100.0, **overrides}
        keepalive = settings.pop("keepalive", 5.0)
        self.stream = ExecStream(self.response, self.clock, keepalive)  # type: ignore[arg-type]
        self.run = ExecRun(
            self.clock,
            self.stream.output,
            on_activity=self._active,
            on_end=self._ended,
            kill=self._kill,
            **settings,
        )
        self.reactor = FakeReactor(PID)

    def _active(self) -> None:
        self.activity += 1

    def _ended(self) -> None:
        self.ends += 1

    def _kill(self, pid: int, sig: int) -> None:
        self.kills.append((pid, sig))
        if self.kill_error is not None:
            raise self.kill_error

    def start(self, stdin: bytes | None = None, env: dict[str, str] | None = None) -> ExecRun:
        self.run.start(self.reactor, ["/bin/cmd", "arg"], env or {"A": "1"}, stdin, DEVNULL)  # type: ignore[arg-type]
        self.stream.attach(self.run)
        assert self.response.producer is self.stream
        return self.run

    @property
    def frame(self) -> dict[str, Any] | None:
        """The final frame, once the run ended."""
        return None if self.run.outcome is None else final_frame(self.run.outcome)

    @property
    def process(self) -> FakeProcess:
        assert self.reactor.process is not None
        return self.reactor.process

    def decoded(self) -> list[dict[str, Any]]:
        return [json.loads(frame) for frame in self.frames]

    def end(self, reason: BaseException) -> dict[str, Any]:
        self.run.processExited(Failure(reason))
        self.run.processEnded(Failure(reason))
        assert self.frame is not None
        return self.frame


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def terminated(code: int | None = None, sig: int | None = None) -> ProcessTerminated:
    return ProcessTerminated(exitCode=code, signal=sig)


# Frames and exit codes


def test_frame_encodings() -> None:
    assert output_frame(b"hi") == b'{"o":"aGk="}\n'
    assert json.loads(KEEPALIVE_FRAME) == {"o": ""}
    assert frame_line({"exit": 0, "out": ""}) == b'{"exit":0,"out":""}\n'


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        (ProcessDone(0), 0),
        (terminated(3), 3),
        (terminated(0), 0),
        (terminated(None, signal.SIGKILL), 137),
        (terminated(1, signal.SIGTERM), 143),
        (terminated(), 1),
        (RuntimeError("odd"), 1),
    ],
)
def test_exit_code_of(reason: BaseException, code: int) -> None:
    assert exit_code_of(Failure(reason)) == code


# Start


def test_start_spawns_with_devnull_stdin_and_its_timers() -> None:
    h = Harness()
    run = h.start(env={"PATH": "/bin"})
    (spawn,) = h.reactor.spawned
    assert spawn["executable"] == "/bin/cmd"
    assert spawn["args"] == ["/bin/cmd", "arg"]
    assert spawn["env"] == {"PATH": "/bin"}
    assert spawn["childFDs"] == {0: DEVNULL, 1: "r", 2: "r"}
    assert run.pid == PID
    assert not h.process.stdin_closed and h.process.written == b""
    assert sorted(call.getTime() for call in h.clock.getDelayedCalls()) == [5.0, 30.0, 100.0]


def test_start_feeds_stdin_then_eof() -> None:
    h = Harness()
    h.start(stdin=b"\x00input")
    assert h.reactor.spawned[0]["childFDs"][0] == "w"
    assert h.process.written == b"\x00input"
    assert h.process.stdin_closed


@pytest.mark.parametrize(
    ("error", "code", "text"),
    [
        (FileNotFoundError(2, "No such file"), EXIT_NOT_FOUND, b"command not found"),
        (PermissionError(13, "Permission denied"), EXIT_NOT_EXECUTABLE, b"not executable"),
    ],
)
def test_a_command_that_cannot_start_ends_at_once(
    error: BaseException, code: int, text: bytes
) -> None:
    h = Harness()
    h.reactor.error = error
    run = h.start()
    assert run.ended and run.pid is None
    assert h.frame is not None
    assert h.frame["exit"] == code
    err = base64.b64decode(h.frame["err"])
    assert err.startswith(b"/bin/cmd: ") and text in err
    assert h.decoded() == [{"o": h.frame["err"]}]
    assert h.ends == 1
    assert h.clock.getDelayedCalls() == []
    run.abort()
    assert h.kills == []


def test_a_command_the_host_cannot_start_ends_in_band() -> None:
    h = Harness()
    h.reactor.error = OSError(errno.EAGAIN, "Resource temporarily unavailable")
    h.start()
    assert h.frame == {
        "error": "SpawnFailed",
        "detail": "cannot start the command: [Errno 11] Resource temporarily unavailable",
    }
    assert h.ends == 1 and h.clock.getDelayedCalls() == []


# Output


def test_output_is_streamed_and_kept_apart() -> None:
    h = Harness()
    run = h.start()
    run.childDataReceived(1, b"out")
    run.childDataReceived(2, b"err")
    run.childDataReceived(1, b"more")
    assert h.decoded() == [{"o": b64(b"out")}, {"o": b64(b"err")}, {"o": b64(b"more")}]
    assert h.activity == 3
    frame = h.end(ProcessDone(0))
    assert frame == {"exit": 0, "out": b64(b"outmore"), "err": b64(b"err")}
    assert h.ends == 1


def test_buffers_are_capped_the_stream_is_not() -> None:
    h = Harness(max_output=4)
    run = h.start()
    run.childDataReceived(1, b"abc")
    run.childDataReceived(1, b"defgh")  # one byte of room left
    run.childDataReceived(1, b"ijk")  # no room
    run.childDataReceived(2, b"1234")  # exactly full
    assert b"".join(base64.b64decode(f["o"]) for f in h.decoded()) == b"abcdefghijk1234"
    frame = h.end(terminated(2))
    assert frame == {"exit": 2, "out": b64(b"abcd"), "err": b64(b"1234"), "truncated": True}
    assert [run.buffers[fd].getvalue() for fd in (1, 2)] == [b"", b""]  # given, not kept twice


def test_output_exactly_at_the_cap_is_not_truncated() -> None:
    h = Harness(max_output=4)
    run = h.start()
    run.childDataReceived(1, b"abcd")
    assert "truncated" not in h.end(ProcessDone(0))


# Timers


def test_deadline_kills_the_group_and_gives_124() -> None:
    h = Harness(timeout=10.0, log_timeout=1000.0, keepalive=1000.0)
    run = h.start()
    h.clock.advance(9.75)
    assert h.kills == [] and not run.timed_out
    h.clock.advance(0.25)
    assert run.timed_out
    assert h.kills == [(PID, signal.SIGKILL)]
    assert h.process.lost == 1
    assert h.end(terminated(None, signal.SIGKILL))["exit"] == EXIT_TIMEOUT
    assert h.clock.getDelayedCalls() == []


def test_output_does_not_push_the_deadline_back() -> None:
    h = Harness(timeout=10.0, log_timeout=3.0, keepalive=1000.0)
    run = h.start()
    for _ in range(4):
        h.clock.advance(2.5)
        run.childDataReceived(1, b".")
    assert h.kills == [(PID, signal.SIGKILL)]
    assert run.timed_out


def test_silence_gives_124_and_output_resets_it() -> None:
    h = Harness(log_timeout=3.0, keepalive=1000.0)
    run = h.start()
    h.clock.advance(2.75)
    run.childDataReceived(2, b"still here")
    h.clock.advance(2.75)
    assert h.kills == []
    h.clock.advance(0.25)
    assert h.kills == [(PID, signal.SIGKILL)] and run.timed_out
    assert h.end(terminated(None, signal.SIGKILL))["exit"] == EXIT_TIMEOUT


def test_keepalive_frames_while_quiet() -> None:
    h = Harness(keepalive=1.0)
    run = h.start()
    h.clock.advance(1.0)
    h.clock.advance(1.0)
    assert h.frames == [KEEPALIVE_FRAME, KEEPALIVE_FRAME]
    h.clock.advance(0.5)
    run.childDataReceived(1, b"x")  # output pushes the next keepalive back
    h.clock.advance(0.75)
    assert h.frames[2:] == [output_frame(b"x")]
    h.clock.advance(0.25)
    assert h.frames[3:] == [KEEPALIVE_FRAME]
    h.end(ProcessDone(0))
    h.clock.advance(10)
    assert h.frames[4:] == []


def test_linger_after_exit_closes_the_pipes() -> None:
    h = Harness()
    run = h.start()
    run.processExited(Failure(ProcessDone(0)))  # a background child still holds the pipes
    h.clock.advance(LINGER_AFTER_EXIT * 0.75)
    assert h.process.lost == 0
    h.clock.advance(LINGER_AFTER_EXIT * 0.25)
    assert h.process.lost == 1
    run.processEnded(Failure(ProcessDone(0)))
    assert h.frame is not None and h.frame["exit"] == 0


# Flow control


def test_pause_stops_reading_and_the_silence_clock() -> None:
    h = Harness(log_timeout=3.0, keepalive=1000.0)
    run = h.start()
    h.stream.pauseProducing()
    assert h.process.paused == 1
    h.clock.advance(10)  # a slow reader is not a silent command
    run.childDataReceived(1, b"late")  # buffered before the pause took effect
    h.clock.advance(10)
    assert h.kills == []
    h.stream.resumeProducing()
    assert h.process.resumed == 1
    h.clock.advance(2.75)
    assert h.kills == []
    h.clock.advance(0.25)
    assert h.kills == [(PID, signal.SIGKILL)]


def test_pause_does_not_stop_the_deadline() -> None:
    h = Harness(timeout=5.0, log_timeout=3.0)
    run = h.start()
    h.stream.pauseProducing()
    h.clock.advance(5.0)
    assert run.timed_out and h.kills == [(PID, signal.SIGKILL)]


def test_flow_control_before_start_and_after_end() -> None:
    h = Harness()
    h.stream.pauseProducing()
    h.stream.resumeProducing()
    h.stream.stopProducing()  # nothing attached yet: nothing to abort
    h.run.pause_reading()
    h.run.resume_reading()
    h.run._close_pipes()  # nothing to close yet
    h.start()
    h.end(ProcessDone(0))
    h.stream.resumeProducing()
    assert h.process.resumed == 0 and h.kills == []
    assert h.clock.getDelayedCalls() == []


def test_stop_producing_aborts() -> None:
    h = Harness()
    run = h.start()
    h.stream.stopProducing()
    assert h.kills == [(PID, signal.SIGKILL)]
    assert h.process.lost == 1
    assert not run.timed_out
    assert h.end(terminated(None, signal.SIGKILL))["exit"] == 137


# Abort


def test_abort_before_start_or_after_end_does_nothing() -> None:
    h = Harness()
    h.run.abort()
    h.start()
    h.end(ProcessDone(0))
    h.run.abort()
    assert h.kills == []


@pytest.fixture
def sleeper() -> Any:
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


def test_abort_kills_by_pid_when_there_is_no_group_yet(sleeper: subprocess.Popen[bytes]) -> None:
    h = Harness()
    h.reactor.pid = sleeper.pid
    h.kill_error = ProcessLookupError()
    h.start()
    h.run.abort()
    assert sleeper.wait() == -signal.SIGKILL


def test_abort_after_exit_never_kills_a_recycled_pid(sleeper: subprocess.Popen[bytes]) -> None:
    h = Harness()
    h.reactor.pid = sleeper.pid  # stands for a pid reused after the command was reaped
    h.kill_error = ProcessLookupError()
    run = h.start()
    run.processExited(Failure(ProcessDone(0)))
    run.abort()
    assert sleeper.poll() is None
    assert h.process.lost == 1


def test_abort_of_a_process_already_gone() -> None:
    h = Harness()
    h.reactor.pid = 2**22 + 12345  # above pid_max: no such process
    h.kill_error = ProcessLookupError()
    h.start()
    h.run.abort()
    assert h.process.lost == 1


def test_signal_goes_to_the_pid_when_there_is_no_group_yet(
    sleeper: subprocess.Popen[bytes],
) -> None:
    h = Harness()
    h.reactor.pid = sleeper.pid  # a real child, not a group leader: killpg finds no group
    h.start()
    h.run._killpg = os.killpg
    h.run.signal(signal.SIGTERM)
    assert sleeper.wait() == -signal.SIGTERM


def test_signal_of_a_process_already_gone_is_no_error() -> None:
    h = Harness()
    h.reactor.pid = 2**22 + 12345  # above pid_max: no such process, nor group
    h.start()
    h.run._killpg = os.killpg
    h.run.signal(signal.SIGTERM)
    assert h.run.outcome is None


def test_signal_before_start_or_after_exit_sends_nothing(
    sleeper: subprocess.Popen[bytes],
) -> None:
    h = Harness()
    h.run.signal(signal.SIGTERM)  # no pid yet
    h.reactor.pid = sleeper.pid  # stands for a pid reused after the command was reaped
    run = h.start()
    run.processExited(Failure(ProcessDone(0)))
    run.signal(signal.SIGTERM)
    h.end(ProcessDone(0))
    run.signal(signal.SIGTERM)
    assert h.kills == [] and sleeper.poll() is None


class ReapedAtOnce(FakeReactor):
    """A command that exits at once: Twisted reaps it inside ``spawnProcess``, which then
    returns a transport whose pid is already ``None``."""

    def spawnProcess(self, proto: Any, *args: Any, **kwargs: Any) -> FakeProcess:
        process = super().spawnProcess(proto, *args, **kwargs)
        proto.processExited(Failure(ProcessDone(0)))
        proto.processEnded(Failure(ProcessDone(0)))
        process.pid = None  # type: ignore[assignment]
        return process


def test_a_command_reaped_inside_spawn_ends_with_no_timer_left() -> None:
    h = Harness()
    h.reactor = ReapedAtOnce(PID)
    h.run.start(h.reactor, ["/bin/true"], {}, b"in", DEVNULL, keep_stdin_open=True)  # type: ignore[arg-type]
    assert h.run.pid == PID  # taken when it connected
    assert h.run.outcome is not None and h.run.outcome.code == 0  # type: ignore[union-attr]
    assert not h.run.stdin_open
    assert h.clock.getDelayedCalls() == []


def test_stdin_kept_open_is_fed_and_not_closed() -> None:
    h = Harness()
    h.run.start(h.reactor, ["/bin/cat"], {}, b"first", DEVNULL, keep_stdin_open=True)  # type: ignore[arg-type]
    assert h.process.written == b"first" and not h.process.stdin_closed
    assert h.run.stdin_open
    h.run.write_stdin(b" more")
    h.run.close_stdin()
    assert h.process.written == b"first more" and h.process.stdin_closed
    assert not h.run.stdin_open


def test_the_real_killpg_is_the_default() -> None:
    run = ExecRun(Clock(), lambda fd, data: None, max_output=1, log_timeout=1, timeout=1)
    assert run._killpg is os.killpg


# Waiting for the end


def test_when_finished_before_and_after_the_end() -> None:
    h = Harness()
    run = h.start()
    early = run.when_finished()
    cancelled = run.when_finished()
    results: list[Any] = []
    early.addCallback(results.append)
    cancelled.addErrback(lambda f: None)
    cancelled.cancel()  # a client that went away: the run goes on
    frame = h.end(terminated(5))
    assert results == [run.outcome] and final_frame(results[0]) == frame
    late: list[Any] = []
    run.when_finished().addCallback(late.append)
    assert late == [run.outcome]


def test_a_callback_per_end() -> None:
    calls: list[str] = []
    run = ExecRun(
        Clock(),
        lambda fd, data: None,
        max_output=1,
        log_timeout=1,
        timeout=1,
    )
    run.on_end = lambda: calls.append("end")
    reactor = FakeReactor()
    run.start(reactor, ["x"], {}, None, DEVNULL)  # type: ignore[arg-type]
    run.processEnded(Failure(ProcessDone(0)))
    assert calls == ["end"]
    run.on_activity()  # the default does nothing


def test_a_slow_reader_never_loses_the_tail_of_the_output() -> None:
    """The command wrote its last bytes and exited while the client was slow (paused): its
    pipes are not closed under it; the linger starts once reading resumes."""
    h = Harness()
    run = h.start()
    h.stream.pauseProducing()
    run.processExited(Failure(ProcessDone(0)))
    h.clock.advance(LINGER_AFTER_EXIT * 10)
    assert h.process.lost == 0
    h.stream.resumeProducing()
    run.childDataReceived(1, b"the tail")
    h.stream.pauseProducing()  # slow again: the linger waits again
    h.clock.advance(LINGER_AFTER_EXIT * 10)
    assert h.process.lost == 0
    h.stream.resumeProducing()
    h.clock.advance(LINGER_AFTER_EXIT)
    assert h.process.lost == 1
    frame = h.end(ProcessDone(0))
    assert base64.b64decode(frame["out"]) == b"the tail"


def test_a_slow_reader_does_not_outlive_the_deadline() -> None:
    h = Harness(timeout=10.0)
    run = h.start()
    h.stream.pauseProducing()
    run.processExited(Failure(ProcessDone(0)))
    h.clock.advance(10.0)
    assert run.timed_out and h.process.lost == 1


# Reading the command's pipes


class ReadFails:
    """Stands in for ``os`` in exec_run: ``read`` fails with ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code

    def read(self, fd: int, size: int) -> bytes:
        raise OSError(self.code, os.strerror(self.code))

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def test_read_from_a_pipe() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    got: list[bytes] = []
    try:
        assert exec_run.read_from(r, got.append) is None  # nothing yet: EAGAIN
        os.write(w, b"x" * 60_000)  # fits in the pipe; more than Twisted's 8 KiB reads
        assert exec_run.read_from(r, got.append) is None
        assert [len(chunk) for chunk in got] == [60_000]
        os.close(w)
        assert exec_run.read_from(r, got.append) is CONNECTION_DONE
    finally:
        os.close(r)


def test_read_from_reads_what_the_pipe_holds_up_to_its_size() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    got: list[bytes] = []
    try:
        held = exec_run.enlarge_pipe(r)
        part = held * 2 // 3
        os.write(w, b"x" * held)  # a full pipe
        assert exec_run.waiting(r) == held
        assert exec_run.read_from(r, got.append, part) is None
        assert exec_run.read_from(r, got.append, part) is None
        assert [len(chunk) for chunk in got] == [part, held - part]
        assert exec_run.waiting(r) == 0
    finally:
        os.close(r)
        os.close(w)


def test_waiting_is_zero_when_it_cannot_be_told() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        assert exec_run.waiting(fd) == 0  # /dev/null has no FIONREAD
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("code", "result"),
    [(errno.EINTR, None), (errno.EAGAIN, None), (errno.EIO, CONNECTION_LOST)],
)
def test_read_from_errors(monkeypatch: pytest.MonkeyPatch, code: int, result: object) -> None:
    monkeypatch.setattr(exec_run, "os", ReadFails(code))
    assert exec_run.read_from(0, lambda data: None) is result


def test_enlarge_pipe_gives_the_capacity_the_pipe_has() -> None:
    r, w = os.pipe()
    try:
        default = fcntl.fcntl(r, fcntl.F_GETPIPE_SZ)
        # The kernel refuses a size it cannot round to pages: the pipe keeps its capacity.
        assert exec_run.enlarge_pipe(r, (1 << 31) + 1) == default
        assert exec_run.enlarge_pipe(r) == exec_run.PIPE_SIZE
        assert fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) == exec_run.PIPE_SIZE  # one pipe, two ends
        os.set_blocking(w, False)
        assert os.write(w, b"x" * exec_run.PIPE_SIZE) == exec_run.PIPE_SIZE
    finally:
        os.close(r)
        os.close(w)


def test_enlarge_pipe_of_a_file_that_is_no_pipe(tmp_path: Any) -> None:
    with open(tmp_path / "f", "wb") as f:
        assert exec_run.enlarge_pipe(f.fileno()) == exec_run.READ_SIZE


def test_read_in_large_chunks_reads_a_whole_enlarged_pipe_at_once() -> None:
    r, w = os.pipe()
    reader = ProcessReader.__new__(ProcessReader)
    reader.fd = r
    got: list[bytes] = []
    reader.dataReceived = got.append  # type: ignore[method-assign]

    class Process:
        pipes = {1: reader}

    try:
        exec_run.read_in_large_chunks(Process())
        os.set_blocking(w, False)
        data = os.urandom(exec_run.PIPE_SIZE)
        assert os.write(w, data) == len(data)  # fits: the pipe was enlarged
        assert reader.doRead() is None
        assert got == [data]  # one read, one frame
    finally:
        os.close(r)
        os.close(w)


def test_the_final_frame_is_written_as_fast_as_the_client_reads() -> None:
    h = Harness()
    h.start()
    h.end(ProcessDone(0))
    assert h.stream.writable().called  # not paused: write on
    h.stream.pauseProducing()
    waiting, cancelled = h.stream.writable(), h.stream.writable()
    cancelled.addErrback(lambda f: f.trap(CancelledError))
    cancelled.cancel()  # the client went away (Klein cancels the handler)
    assert not waiting.called
    h.stream.resumeProducing()
    assert waiting.called
    h.stream.pauseProducing()
    stopped = h.stream.writable()
    h.stream.stopProducing()  # the connection is gone: nothing more to wait for
    assert stopped.called


def test_read_in_large_chunks_replaces_only_output_readers() -> None:
    r, w = os.pipe()
    reader = ProcessReader.__new__(ProcessReader)
    reader.fd = r
    got: list[bytes] = []
    reader.dataReceived = got.append  # type: ignore[method-assign]
    other = object()

    class Process:
        pipes = {1: reader, 0: other}

    try:
        exec_run.read_in_large_chunks(Process())
        os.write(w, b"data")
        assert reader.doRead() is None
        assert got == [b"data"]
    finally:
        os.close(r)
        os.close(w)
    exec_run.read_in_large_chunks(object())  # no pipes: nothing to do


# The exit frame, written in parts, is exactly json.dumps' bytes


@settings(derandomize=True, database=None, deadline=None, max_examples=200)
@given(
    code=st.integers(-(2**40), 2**40),
    out=st.binary(max_size=64),
    err=st.binary(max_size=64),
    truncated=st.booleans(),
    oom_killed=st.booleans(),
    timed_out=st.booleans(),
    signal=st.one_of(st.none(), st.integers(1, 64)),
)
def test_final_frame_parts_are_the_final_frame_as_json_dumps_writes_it(
    code: int,
    out: bytes,
    err: bytes,
    truncated: bool,
    oom_killed: bool,
    timed_out: bool,
    signal: int | None,
) -> None:
    outcome = Exited(code, out, err, truncated, timed_out, signal, oom_killed)
    expected = json.dumps(final_frame(outcome), separators=(",", ":")).encode() + b"\n"
    assert b"".join(final_frame_parts(outcome)) == expected == frame_line(final_frame(outcome))


def test_final_frame_parts_keep_the_buffers_apart() -> None:
    outcome = Exited(3, b"out", b"err", truncated=True)
    assert list(final_frame_parts(outcome)) == [
        b'{"exit":3,"out":"',
        b"b3V0",
        b'","err":"',
        b"ZXJy",
        b'","truncated":true}\n',
    ]
    both = Exited(3, b"out", b"err", truncated=True, oom_killed=True)
    assert list(final_frame_parts(both))[-1] == b'","truncated":true,"oom_killed":true}\n'
    assert list(final_frame_parts(Exited(0, b"", b""))) == [
        b'{"exit":0,"out":"',
        b'","err":"',
        b'"}\n',
    ]
    assert list(final_frame_parts(SpawnFailed("no"))) == [
        b'{"error":"SpawnFailed","detail":"no"}\n'
    ]


def test_megabytes_of_output_are_encoded_a_part_at_a_time_as_they_are_asked_for() -> None:
    out = os.urandom(3 * EXIT_PART + 1)
    parts = final_frame_parts(Exited(0, out, b""))
    assert next(parts) == b'{"exit":0,"out":"'
    first = next(parts)  # only this part is encoded so far
    assert len(first) == 1 << 20 == 4 * EXIT_PART // 3
    rest = list(parts)
    assert [len(p) for p in rest[:3]] == [1 << 20, 1 << 20, 4]
    assert base64.b64decode(first + b"".join(rest[:3])) == out
    assert rest[3:] == [b'","err":"', b'"}\n']


def test_the_kept_output_is_handed_over_not_copied() -> None:
    harness = Harness(max_output=1 << 20)
    run = harness.start()
    chunk = os.urandom(1 << 16)
    for _ in range(4):
        run.childDataReceived(1, chunk)
    kept = run.buffers[1]
    harness.end(ProcessDone(0))
    assert isinstance(run.outcome, Exited) and run.outcome.out == chunk * 4
    assert run.outcome.out is kept.getvalue()  # the very bytes the buffer held
    assert run.buffers[1] is not kept and run.buffers[1].tell() == 0
