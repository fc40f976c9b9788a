"""The process output log, its readers and the process table, without a process
(docs/extensions.rst, "Background processes").

The runs are real :class:`ExecRun` objects driven by hand (``Clock`` for time): what the
log keeps, what a reader from an offset is told (``dropped``, chunks, the end), how pausing
holds nothing, and which records the table pushes out.
"""

import signal
import tracemalloc
from typing import Any

import pytest
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from sandboxd.core.exec.run import ExecRun, SpawnFailed
from sandboxd.core.processes.log import (
    FREE_RUNS,
    RUN_COST,
    RUN_MAX,
    STDERR,
    STDOUT,
    Chunk,
    OutputLog,
)
from sandboxd.core.processes.process import (
    CaughtUp,
    Dropped,
    Ended,
    Process,
    ReaderEvent,
    SandboxGone,
)
from sandboxd.core.processes.table import ProcessTable
from sandboxd.errors import BadRequest, ProcessConflict, ProcessNotFound, TooMany


class Transport:
    """What a run asks of its process transport, recorded."""

    pid = 4242

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.stdin_closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def closeStdin(self) -> None:
        self.stdin_closed = True

    def loseConnection(self) -> None:
        pass


def make(limit: int = 10, stdin: bool = False, **fields: Any) -> tuple[Process, ExecRun, list[Any]]:
    clock = Clock()
    log = OutputLog(limit)
    signals: list[tuple[int, int]] = []
    run = ExecRun(
        clock,
        log.append,
        max_output=0,
        log_timeout=None,
        timeout=None,
        kill=lambda pid, sig: signals.append((pid, sig)),
    )
    run.transport = Transport()  # type: ignore[assignment]
    run.pid = Transport.pid
    run.stdin_open = stdin
    process = Process("p1", None, ("cmd",), 0.0, run, log, stdin, **fields)
    run.on_end = process.ended
    return process, run, signals


def read(process: Process, offset: int | None = 0, follow: bool = True) -> list[ReaderEvent]:
    events: list[ReaderEvent] = []
    process.reader(offset, follow, events.append).resume()
    return events


def test_the_log_keeps_the_newest_bytes_at_their_offsets() -> None:
    log = OutputLog(10)
    log.append(STDOUT, b"abcd")
    log.append(STDERR, b"efgh")
    log.append(STDOUT, b"")
    assert (log.start, log.written, log.kept) == (0, 8, 8)
    log.append(STDOUT, b"ijkl")  # 12 bytes: the two oldest fall out, not the whole write
    assert (log.start, log.written, log.kept) == (2, 12, 10)
    found = log.read(0)
    assert found.dropped == 2
    assert found.chunks == (
        Chunk(STDOUT, 2, b"cd"),
        Chunk(STDERR, 4, b"efgh"),
        Chunk(1, 8, b"ijkl"),
    )
    assert log.read(6).chunks[0] == Chunk(STDERR, 6, b"gh")
    assert log.read(12).chunks == () and log.read(12).end is None
    log.append(STDOUT, b"0123456789ABCDEF")  # larger than the log: only its tail is kept
    assert (log.start, log.written, log.kept) == (18, 28, 10)
    assert log.read(0).dropped == 18 and log.read(0).end == 28


def test_writes_on_one_stream_are_coalesced_into_runs_of_at_most_run_max() -> None:
    log = OutputLog(4 * RUN_MAX)
    for _ in range(RUN_MAX + 1):
        log.append(STDOUT, b"x")
    log.append(STDERR, b"e")
    assert [(c.fd, c.at, len(c.data)) for c in log.read(0).chunks] == [
        (STDOUT, 0, RUN_MAX),
        (STDOUT, RUN_MAX, 1),
        (STDERR, RUN_MAX + 1, 1),
    ]


def test_a_read_takes_about_most_bytes_and_stops_before_until() -> None:
    log = OutputLog(1000)
    for n in range(10):
        log.append(STDOUT if n % 2 else STDERR, b"x" * 10)
    assert len(log.read(0, most=25).chunks) == 3
    assert log.read(5, until=25).chunks == (
        Chunk(STDERR, 5, b"x" * 5),
        Chunk(STDOUT, 10, b"x" * 10),
        Chunk(STDERR, 20, b"x" * 5),
    )
    assert log.read(25, until=25).chunks == ()


def test_a_log_written_a_byte_at_a_time_holds_about_its_limit() -> None:
    """Issue 29: a byte per write cost ~80 bytes of memory per byte kept."""
    limit = 1 << 17
    tracemalloc.start()
    try:
        log = OutputLog(limit)
        for _ in range(3 * limit):
            log.append(STDOUT, b"x")
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert log.kept == limit and log.start == 2 * limit
    assert held < limit + 32 * 1024, held


def test_a_log_whose_writes_alternate_streams_is_charged_for_its_runs() -> None:
    limit = 1 << 17
    tracemalloc.start()
    try:
        log = OutputLog(limit)
        for n in range(limit):
            log.append(STDOUT if n % 2 else STDERR, b"x")
        free = FREE_RUNS + limit // RUN_MAX
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert log.charged <= limit and log.kept == (limit - free) // (RUN_COST + 1) + free
    assert held < limit + 32 * 1024, held
    assert log.read(log.start).chunks[0] == Chunk(
        STDOUT if log.start % 2 else STDERR, log.start, b"x"
    )


def test_a_reader_that_does_not_follow_stops_where_the_log_was_when_it_was_made() -> None:
    process, run, _ = make(limit=100)
    run.childDataReceived(1, b"ab")
    events: list[ReaderEvent] = []
    reader = process.reader(0, False, events.append)
    run.childDataReceived(1, b"cd")  # the same run grows past where the reader stops
    reader.resume()
    assert events == [Chunk(1, 0, b"ab"), CaughtUp(2)]


def test_a_follower_gets_everything_then_the_exit() -> None:
    process, run, _ = make()
    events: list[ReaderEvent] = []
    reader = process.reader(0, True, events.append)
    run.childDataReceived(1, b"hi")
    assert events == []  # not resumed: nothing read yet
    reader.resume()
    run.childDataReceived(2, b"oops")
    run.processEnded(Failure(ProcessTerminated(3)))
    assert events == [Chunk(1, 0, b"hi"), Chunk(2, 2, b"oops"), Ended(3)]
    assert reader.done and process.listing().exit == 3 and not process.running


def test_a_paused_follower_holds_nothing_and_is_told_what_it_missed() -> None:
    process, run, _ = make(limit=4)
    events: list[ReaderEvent] = []
    reader = process.reader(0, True, events.append)
    reader.resume()
    run.childDataReceived(1, b"ab")
    reader.pause()
    for data in (b"cd", b"ef", b"gh"):
        run.childDataReceived(1, data)
    assert events == [Chunk(1, 0, b"ab")]
    reader.resume()
    assert events[1:] == [Dropped(2), Chunk(1, 4, b"efgh")]  # one run: its writes coalesced
    run.processEnded(Failure(ProcessDone(0)))
    assert events[-1] == Ended(0)


def test_a_follower_that_pauses_itself_mid_read_stops_there() -> None:
    process, run, _ = make(limit=100)
    for fd, data in ((1, b"a"), (2, b"b"), (1, b"c")):  # three runs: streams alternate
        run.childDataReceived(fd, data)
    events: list[ReaderEvent] = []

    def take_one(event: ReaderEvent) -> None:
        events.append(event)
        reader.pause()

    reader = process.reader(0, True, take_one)
    reader.resume()
    assert events == [Chunk(1, 0, b"a")]
    reader.resume()
    assert events[-1] == Chunk(2, 1, b"b") and reader.cursor == 2


def test_a_reader_that_does_not_follow_reads_what_is_there() -> None:
    process, run, _ = make()
    run.childDataReceived(1, b"abc")
    events: list[ReaderEvent] = []
    reader = process.reader(1, False, events.append)
    run.childDataReceived(1, b"later")  # after the reader was made: not its concern
    reader.resume()
    assert events == [Chunk(1, 1, b"bc"), CaughtUp(3)]
    run.processEnded(Failure(ProcessDone(0)))
    assert read(process, 0, follow=False)[-1] == Ended(0)
    assert read(process, None, follow=True) == [Ended(0)]


def test_an_offset_past_the_end_is_refused() -> None:
    process, run, _ = make()
    run.childDataReceived(1, b"abc")
    with pytest.raises(BadRequest):
        process.reader(4, True, lambda e: None)


def test_readers_of_a_killed_sandbox_are_told_it_is_gone() -> None:
    process, _, signals = make()
    events = read(process)
    assert events == []
    process.close()
    assert events == [SandboxGone()] and (Transport.pid, signal.SIGKILL) in signals
    assert read(process) == [SandboxGone()]


def test_a_paused_reader_is_told_at_once_that_its_sandbox_is_gone() -> None:
    process, run, _ = make()
    events: list[ReaderEvent] = []
    reader = process.reader(0, True, events.append)
    reader.resume()
    run.childDataReceived(1, b"ab")
    reader.pause()  # its client reads slowly
    run.childDataReceived(1, b"cd")
    process.close()
    assert events == [Chunk(1, 0, b"ab"), SandboxGone()] and reader.done


def test_a_stopped_reader_is_told_nothing_more() -> None:
    process, run, _ = make()
    events: list[ReaderEvent] = []
    reader = process.reader(0, True, events.append)
    reader.resume()
    reader.stop()
    run.childDataReceived(1, b"x")
    run.processEnded(Failure(ProcessDone(0)))
    assert events == []


def test_a_process_that_never_started_ends_without_a_code() -> None:
    process, run, _ = make()
    run._end(SpawnFailed("no fork"))
    assert read(process) == [Ended(None, "no fork")]


def test_stdin_and_signals() -> None:
    process, run, signals = make(stdin=True)
    process.write_stdin(b"abc")
    process.write_stdin(b"")
    assert run.transport.written == [b"abc"]  # type: ignore[union-attr]
    process.signal("INT")
    assert signals == [(Transport.pid, signal.SIGINT)]
    process.close_stdin()
    assert run.transport.stdin_closed  # type: ignore[union-attr]
    with pytest.raises(ProcessConflict, match="already closed"):
        process.write_stdin(b"more")
    run.processEnded(Failure(ProcessDone(0)))
    with pytest.raises(ProcessConflict, match="ended"):
        process.signal("TERM")
    with pytest.raises(ProcessConflict, match="ended"):
        process.close_stdin()
    without, _, _ = make(stdin=False)
    with pytest.raises(ProcessConflict, match="without stdin"):
        without.write_stdin(b"x")


def test_the_table_pushes_out_the_oldest_ended_record() -> None:
    table = ProcessTable(2)
    first, first_run, _ = make()
    second, _, _ = make()
    third, _, _ = make()
    first.id, second.id, third.id = table.new_id(), table.new_id(), table.new_id()
    second.tag = "web"
    table.add(first)
    table.add(second)
    with pytest.raises(TooMany):
        table.add(third)  # both still running
    first_run.processEnded(Failure(ProcessDone(0)))
    table.add(third)
    assert table.all() == [second, third] and table.running == [second, third]
    assert table.by_tag("web") is second and table.by_pid(Transport.pid) is third
    for lookup in (lambda: table.get(first.id), lambda: table.by_pid(1), lambda: table.by_tag("x")):
        with pytest.raises(ProcessNotFound):
            lookup()
    table.close()
    assert table.running == []


def test_a_signalled_process_ends_with_128_plus_n_and_names_the_signal() -> None:
    process, run, _ = make()
    run.processEnded(Failure(ProcessTerminated(signal=signal.SIGINT)))
    assert read(process) == [Ended(130, signal=signal.SIGINT)]


def test_a_stopped_reader_resumed_reads_nothing() -> None:
    process, run, _ = make()
    run.childDataReceived(1, b"abc")
    events: list[ReaderEvent] = []
    reader = process.reader(0, True, events.append)
    reader.stop()
    reader.resume()  # its consumer's producer resumed after it went away
    assert events == []


def test_a_consumer_resuming_from_inside_deliver_gets_each_chunk_once_in_order() -> None:
    process, run, _ = make(limit=100)
    for fd, data in ((1, b"a"), (2, b"b"), (1, b"c")):
        run.childDataReceived(fd, data)
    events: list[ReaderEvent] = []

    def deliver(event: ReaderEvent) -> None:
        events.append(event)
        reader.resume()  # e.g. a transport that drained at once: the running pump goes on

    reader = process.reader(0, True, deliver)
    reader.resume()
    assert events == [Chunk(1, 0, b"a"), Chunk(2, 1, b"b"), Chunk(1, 2, b"c")]
    run.childDataReceived(2, b"d")
    assert events[3:] == [Chunk(2, 3, b"d")]


def test_a_log_of_no_bytes_counts_offsets_and_keeps_nothing() -> None:
    log = OutputLog(0)  # SANDBOXD_PROCESS_LOG_MAX=0
    log.append(STDOUT, b"abc")
    assert (log.written, log.kept, log.start) == (3, 0, 3)
    assert log.read(0).dropped == 3 and log.read(0).chunks == ()


def test_a_new_id_is_drawn_again_when_it_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    table = ProcessTable(4)
    taken, _, _ = make()
    taken.id = "aaaaaaaaaaaa"
    table.add(taken)
    draws = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    monkeypatch.setattr("sandboxd.core.processes.table.secrets.token_hex", lambda n: next(draws))
    assert table.new_id() == "bbbbbbbbbbbb"
