"""A background process's output: a bounded log of stdout and stderr chunks at byte offsets.

Every byte the process writes, stdout and stderr interleaved in arrival order, has one
offset in a single count that starts at 0. The log keeps the most recent ``limit`` bytes;
older chunks fall out whole (a chunk larger than the whole log keeps only its tail). A
reader asks for what lies at or after an offset and is told how many bytes it missed when
that offset fell out (:attr:`Slice.dropped`).

Readers never hold the log's bytes beyond one read, and the process is never paused for
them: a slow reader falls behind, and once what it had not read falls out of the log it is
told ``dropped`` and continues at the oldest byte kept. Daemon memory per process is the
log's bound, whatever the process prints and however many readers read it.
"""

from collections import deque
from collections.abc import Callable

from attrs import frozen

STDOUT = 1
STDERR = 2


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


class OutputLog:
    """The bounded log of one process's output; ``listeners`` are told of each append."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chunks: deque[Chunk] = deque()
        self.kept = 0
        """Bytes held now (at most :attr:`limit`)."""
        self.written = 0
        """Bytes ever appended: the offset the next byte will have."""
        self._listeners: set[Callable[[], None]] = set()

    @property
    def start(self) -> int:
        """The offset of the oldest byte kept (:attr:`written` when nothing is kept)."""
        return self._chunks[0].at if self._chunks else self.written

    def append(self, fd: int, data: bytes) -> None:
        """Add ``data`` written on ``fd``; push the oldest chunks out past the bound."""
        if not data:
            return
        at = self.written
        self.written += len(data)
        if len(data) > self.limit:
            skip = len(data) - self.limit
            data, at = data[skip:], at + skip
        if data:
            self._chunks.append(Chunk(fd, at, data))
            self.kept += len(data)
        while self.kept > self.limit:
            self.kept -= len(self._chunks.popleft().data)
        for listener in list(self._listeners):
            listener()

    def read(self, offset: int, most: int = 1 << 20) -> Slice:
        """The chunks at or after ``offset``, about ``most`` bytes at most (at least one
        chunk when there is one), the first cut to start at ``offset``."""
        start = self.start
        dropped = max(start - offset, 0)
        offset = max(offset, start)
        found: list[Chunk] = []
        size = 0
        for chunk in self._after(offset):
            if chunk.at < offset:
                chunk = Chunk(chunk.fd, offset, chunk.data[offset - chunk.at :])
            found.append(chunk)
            size += len(chunk.data)
            if size >= most:
                break
        return Slice(dropped, tuple(found))

    def _after(self, offset: int) -> list[Chunk]:
        """The kept chunks whose end is past ``offset`` (a bisection over the deque)."""
        chunks = self._chunks
        low, high = 0, len(chunks)
        while low < high:
            middle = (low + high) // 2
            if chunks[middle].end <= offset:
                low = middle + 1
            else:
                high = middle
        return [chunks[i] for i in range(low, min(len(chunks), low + 64))]

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` after each append; returns the call that stops it."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)
