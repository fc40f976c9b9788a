"""A background process's output: a bounded log of stdout and stderr runs at byte offsets.

Every byte the process writes, stdout and stderr interleaved in arrival order, has one
offset in a single count that starts at 0. The log keeps the most recent ``limit`` bytes:
the oldest bytes fall out one byte at a time, not a write at a time (a write larger than
the whole log keeps only its tail). A reader asks for what lies at or after an offset and
is told how many bytes it missed when that offset fell out (:attr:`Slice.dropped`).

Writes are coalesced: consecutive writes on one stream extend one run of bytes (up to
:data:`RUN_MAX`), so a process that writes a byte at a time costs the daemon a byte per byte
kept, not an object per write. A process that alternates streams with each byte makes a run
per byte: each run past a few (:data:`FREE_RUNS`) is charged :data:`RUN_COST` bytes
against ``limit``, so it keeps fewer bytes, and the daemon still holds about ``limit``.

Readers never hold the log's bytes beyond one read, and the process is never paused for
them: a slow reader falls behind, and once what it had not read falls out of the log it is
told ``dropped`` and continues at the oldest byte kept. Daemon memory per process is the
log's bound plus a small constant, whatever the process prints and however many readers
read it (docs/extensions.rst, "Background processes").
"""

from collections import deque
from collections.abc import Callable

from attrs import define, frozen
from twisted.logger import Logger

log = Logger()

STDOUT = 1
STDERR = 2

RUN_MAX = 64 * 1024
"""Bytes one run of one stream grows to before the next write starts another."""

RUN_COST = 192
"""Bytes of daemon memory one run costs beyond its data (its record, its buffer's header,
its offset, its place in the deque), as measured on CPython 3.11-3.13, rounded up."""

FREE_RUNS = 16
"""Runs not charged :data:`RUN_COST` beyond those a full log of whole runs has (``limit //
RUN_MAX``): a log keeps its ``limit`` bytes while its runs are long, and a small one however
its writes alternate, at a constant cost."""


@frozen
class Chunk:
    """``data`` written on ``fd`` (1 stdout, 2 stderr), its first byte at offset ``at``."""

    fd: int
    at: int
    data: bytes

    @property
    def end(self) -> int:
        return self.at + len(self.data)


@frozen
class Slice:
    """What a read found: ``dropped`` bytes fell out before the first chunk, then ``chunks``."""

    dropped: int
    chunks: tuple[Chunk, ...]

    @property
    def end(self) -> int | None:
        """The offset after the last chunk (``None``: no chunk)."""
        return self.chunks[-1].end if self.chunks else None


@define
class _Run:
    """Consecutive bytes of one stream kept, the first at offset ``at``; grows at its end as
    writes come, shrinks at its start as bytes fall out."""

    fd: int
    at: int
    data: bytearray

    @property
    def end(self) -> int:
        return self.at + len(self.data)


class OutputLog:
    """The bounded log of one process's output; ``listeners`` are told of each append."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._runs: deque[_Run] = deque()
        self._free_runs = FREE_RUNS + limit // RUN_MAX
        self.kept = 0
        """Bytes held now (at most :attr:`limit`)."""
        self.written = 0
        """Bytes ever appended: the offset the next byte will have."""
        self._listeners: set[Callable[[], None]] = set()

    @property
    def start(self) -> int:
        """The offset of the oldest byte kept (:attr:`written` when nothing is kept)."""
        return self._runs[0].at if self._runs else self.written

    @property
    def charged(self) -> int:
        """What the log counts against :attr:`limit`: its bytes, and :data:`RUN_COST` for
        each run past its free ones (:data:`FREE_RUNS`)."""
        return self.kept + RUN_COST * max(len(self._runs) - self._free_runs, 0)

    def append(self, fd: int, data: bytes) -> None:
        """Add ``data`` written on ``fd``; push the oldest bytes out past the bound."""
        if not data:
            return
        at = self.written
        self.written += len(data)
        if len(data) > self.limit:
            skip = len(data) - self.limit
            data, at = data[skip:], at + skip
        if data:
            self._keep(fd, at, data)
        self._trim()
        tell_each(self._listeners, "an output log")

    def _keep(self, fd: int, at: int, data: bytes) -> None:
        last = self._runs[-1] if self._runs else None
        if (
            last is not None
            and (last.fd, last.end) == (fd, at)  # not after a write cut to its tail
            and len(last.data) + len(data) <= RUN_MAX
        ):
            last.data += data
        else:
            self._runs.append(_Run(fd, at, bytearray(data)))
        self.kept += len(data)

    def _trim(self) -> None:
        """Drop the oldest bytes (a whole run, or a run's first bytes) until the log's
        charge is within its limit."""
        while self.charged > self.limit:
            oldest = self._runs[0]
            excess = self.charged - self.limit
            if len(oldest.data) <= excess:
                self._runs.popleft()
                self.kept -= len(oldest.data)
            else:
                del oldest.data[:excess]
                oldest.at += excess
                self.kept -= excess

    def read(self, offset: int, most: int = 1 << 20, until: int | None = None) -> Slice:
        """The bytes at or after ``offset`` (and before ``until``, when given) as chunks,
        about ``most`` bytes at most (at least one chunk when there is one), the first cut
        to start at ``offset``. The chunks are copies: the log may grow meanwhile."""
        start = self.start
        dropped = max(start - offset, 0)
        offset = max(offset, start)
        found: list[Chunk] = []
        size = 0
        for run in self._after(offset):
            last = run.end if until is None else min(run.end, until)
            if last <= offset:
                break
            found.append(Chunk(run.fd, offset, bytes(run.data[offset - run.at : last - run.at])))
            size += last - offset
            offset = last
            if size >= most:
                break
        return Slice(dropped, tuple(found))

    def _after(self, offset: int) -> list[_Run]:
        """The kept runs whose end is past ``offset`` (a bisection over the deque)."""
        runs = self._runs
        low, high = 0, len(runs)
        while low < high:
            middle = (low + high) // 2
            if runs[middle].end <= offset:
                low = middle + 1
            else:
                high = middle
        return [runs[i] for i in range(low, min(len(runs), low + 64))]

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` after each append (one that raises is dropped:
        :func:`tell_each`); returns the call that stops it."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)


def tell_each(listeners: set[Callable[[], None]], of: str) -> None:
    """Call each of ``listeners``. One that raises is logged, once, and dropped from the set:
    the others are still told, and nothing reaches the caller, which is the reader of a
    process's pipes or pty: an exception there would stop the output for every reader (a
    terminal's master closed: its command hung up)."""
    for listener in list(listeners):
        try:
            listener()
        except Exception:
            listeners.discard(listener)
            log.failure("a listener of {of} raised: it is told no more", of=of)
