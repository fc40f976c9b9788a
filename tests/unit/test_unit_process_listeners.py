"""A terminal's output fan-out isolates its listeners (docs/extensions.rst, "Terminals"): a
reader whose consumer raises (a WebSocket, an NDJSON follower, the E2B stream gone wrong) is
logged once and dropped; the pty's reader, the process and its other readers go on.

The run is a real :class:`TerminalRun` fed as Twisted's pty reader feeds it
(``childDataReceived``), its output going into the process's log as the daemon wires it.
"""

from collections.abc import Iterator
from typing import cast

import pytest
from twisted.internet.error import ProcessDone
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from twisted.python.failure import Failure

from sandboxd.core.processes.log import Chunk, OutputLog
from sandboxd.core.processes.process import Dropped, Ended, Process, ReaderEvent
from sandboxd.core.processes.terminal import TerminalRun


class Transport:
    pid = 4242

    def loseConnection(self) -> None:
        pass


def terminal(scrollback: int = 100) -> tuple[Process, TerminalRun]:
    log = OutputLog(scrollback)
    run = TerminalRun(Clock(), log.append, max_output=0, log_timeout=None, timeout=None)
    run.transport = Transport()  # type: ignore[assignment]
    run.pid = Transport.pid
    process = Process("t1", None, ("sh",), 0.0, run, log, True)
    run.on_end = process.ended
    return process, run


@pytest.fixture
def failures() -> Iterator[list[str]]:
    """What the daemon logs as failures meanwhile."""
    said: list[str] = []

    def observe(event: LogEvent) -> None:
        if "log_failure" in event:
            said.append(str(formatEvent(event)))

    observer = cast(ILogObserver, observe)
    globalLogPublisher.addObserver(observer)
    try:
        yield said
    finally:
        globalLogPublisher.removeObserver(observer)


class Raising:
    """A consumer that raises at its ``n``-th event (from 1), and records what it was told."""

    def __init__(self, n: int = 1) -> None:
        self.n = n
        self.told: list[ReaderEvent] = []

    def __call__(self, event: ReaderEvent) -> None:
        self.told.append(event)
        if len(self.told) == self.n:
            raise RuntimeError("the socket is gone")


def test_a_raising_reader_is_dropped_and_the_terminal_reads_on(failures: list[str]) -> None:
    process, run = terminal()
    raising, kept = Raising(2), list[ReaderEvent]()
    process.reader(None, True, raising).resume()
    process.reader(None, True, kept.append).resume()
    for data in (b"one", b"two", b"three"):
        run.childDataReceived(1, data)  # as the pty's reader does: nothing reaches it
    run.processEnded(Failure(ProcessDone(0)))
    assert raising.told == [Chunk(1, 0, b"one"), Chunk(1, 3, b"two")]
    assert kept == [Chunk(1, 0, b"one"), Chunk(1, 3, b"two"), Chunk(1, 6, b"three"), Ended(0)]
    assert failures == ["a reader of process t1 raised: it reads no more"]
    assert process.end == Ended(0) and not process.running


def test_a_reader_raising_at_a_gap_or_its_last_chunk_is_told_no_more(
    failures: list[str],
) -> None:
    process, run = terminal(scrollback=4)
    run.childDataReceived(1, b"abcdefgh")  # the first 4 bytes fall out
    at_the_gap = Raising(1)
    process.reader(0, True, at_the_gap).resume()
    at_the_end = Raising(1)
    process.reader(4, False, at_the_end).resume()  # not following: "efgh" is its last chunk
    run.childDataReceived(1, b"ij")
    assert at_the_gap.told == [Dropped(4)]
    assert at_the_end.told == [Chunk(1, 4, b"efgh")]
    assert len(failures) == 2


def test_any_listener_that_raises_is_dropped_the_others_told(failures: list[str]) -> None:
    process, run = terminal()
    told: list[str] = []

    def boom() -> None:
        raise RuntimeError("a listener's bug")

    process.log.listen(boom)
    process.log.listen(lambda: told.append("log"))
    process._end_listeners.add(boom)
    process._end_listeners.add(lambda: told.append("end"))
    run.childDataReceived(1, b"x")
    run.childDataReceived(1, b"y")
    run.processEnded(Failure(ProcessDone(0)))
    assert told == ["log", "log", "end"]
    assert failures == [
        "a listener of an output log raised: it is told no more",
        "a listener of process t1's end raised: it is told no more",
    ]
