"""Where large request bodies are stored, and how they are written there off the reactor.

A body of :data:`SPOOL_MIN` bytes or more is stored in a :class:`Spool`: an unnamed file
(``O_TMPFILE``) in the daemon's state root, on the workspaces' own filesystem, so that an
upload can be linked into its workspace once complete instead of being written a second time.

A request whose headers name a sandbox has its body spooled in that sandbox's own place instead
(:class:`SpoolPlace`: its top directory, under its disk limits), so that what arrives counts
against its quota, not the state root's free space (docs/operating.rst, "Disk limits").

Its bytes are written by a :class:`SpoolWriter`, in a thread pool (:class:`SpoolThreads`),
never on the reactor thread: a neighbour's upload of a gigabyte does not stall every other
sandbox's requests behind its disk writes (see docs/performance.rst).
"""

import io
import mmap
import os
from collections.abc import Callable
from contextlib import suppress
from functools import partial
from typing import IO, Protocol, TypeVar

from attrs import frozen
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool
from twisted.web.http_headers import Headers

T = TypeVar("T")

SPOOL_MIN = 100_000
"""Bodies at least this long (or of unknown length) are stored in a :class:`Spool`; shorter
ones in memory, as twisted.web does."""

AHEAD = 2 << 20
"""Bytes of a body received but not yet written past which its connection stops reading. A
body holds two batches at most (the one being written, the one filled meanwhile), each of at
most this plus one read, however fast its client sends."""


class Spool(io.BufferedRandom):
    """A request body in an unnamed file (``O_TMPFILE``, mode 0644) of ``directory``.

    Nothing is visible in the directory, and the space is given back when the file is closed,
    unless the file was linked somewhere meanwhile (an upload, once complete).
    """

    def __init__(self, directory: str, charge: "Charge | None" = None) -> None:
        def make() -> int:
            return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o644)

        fd = make() if charge is None else charge(make)()
        super().__init__(io.FileIO(fd, "r+"))


class Charge(Protocol):
    """Makes file work subject to a sandbox's disk limits where the daemon's privilege would
    exempt it (a disk driver's ``charged``)."""

    def __call__(self, work: Callable[[], T], /) -> Callable[[], T]: ...


def uncharged(work: Callable[[], T]) -> Callable[[], T]:
    """File work as it is (no sandbox's limits to apply)."""
    return work


class SpoolPlace(Protocol):
    """Where the body of a request naming a sandbox is spooled: ``directory`` (the sandbox's
    top directory, on its disk limits, out of its sight), each write made through ``charged``;
    ``bodies`` holds an abort for each body arriving there, which the sandbox's end calls."""

    @property
    def directory(self) -> str: ...

    @property
    def bodies(self) -> set[Callable[[], object]]: ...

    def charged(self, work: Callable[[], T]) -> Callable[[], T]: ...


SpoolPlaces = Callable[[bytes, Headers], SpoolPlace | None]
"""A front's rule: a request's path and headers → the place of the sandbox it names, where
its body is spooled (``None``: it names none, or one the front does not hold)."""


def can_spool(directory: str) -> bool:
    """Whether request bodies can be spooled in ``directory`` (its filesystem takes unnamed
    files, ``O_TMPFILE``)."""
    try:
        Spool(directory).close()
    except OSError:
        return False
    return True


SLACK = 1 << 20
"""Bytes a batch holds beyond ``ahead`` before it must grow: what one read of a connection
brings at most (``READ_SIZE``) once its reading stops."""


def _write(file: IO[bytes], batch: mmap.mmap, length: int) -> None:
    """Write a batch's first ``length`` bytes to ``file`` (run in a pool's thread); nothing
    stays buffered in ``file``."""
    with memoryview(batch) as whole, whole[:length] as data:
        file.write(data)
    file.flush()


class SpoolWriter:
    """A body's file (``file``), written in ``pool`` in the order its chunks were given.

    One write is in flight at a time; the chunks given meanwhile are joined into the next, in
    an anonymous mapping rather than the heap: a chunk's memory is free again as soon as it is
    copied, so that however long an upload the daemon's heap is not scattered with chunks
    freed out of turn. A writer has two mappings at most, the one being written and the one
    being filled, and each written one is filled again: its pages are not faulted in anew for
    every batch (figures: docs/performance.rst); both are unmapped once the body is all
    written (:meth:`release`) or the writer closed.
    Each write runs through ``charge`` (a sandbox's limits held, see :class:`SpoolPlace`).
    Once more than ``ahead`` bytes given are not yet written, ``pause`` is called (the
    connection stops reading), and ``resume`` once they are back under it (or the writer is
    closed). A write that fails is reported once to ``on_error`` (an :class:`OSError`), and the
    writer closed: what was given and what is given afterwards is dropped.

    :meth:`close` drops what is not yet written, and closes the file (giving a spool's space
    back) as soon as no thread is writing to it.
    """

    def __init__(
        self,
        file: IO[bytes],
        threads: "SpoolThreads",
        on_error: Callable[[OSError], object],
        pause: Callable[[], object],
        resume: Callable[[], object],
        charge: Charge = uncharged,
    ) -> None:
        self.file = file
        self.charge = charge
        self.threads = threads
        self._on_error = on_error
        self._pause = pause
        self._resume = resume
        self._queue: mmap.mmap | None = None
        self._spare: mmap.mmap | None = None
        """The batch last written, filled again next (``None``: none is free)."""
        self._batch: mmap.mmap | None = None
        """The batch being written."""
        self._queued = 0
        self._writing = 0
        self._paused = False
        self._closed = False
        self._waiters: list[Deferred[None]] = []

    @property
    def unwritten(self) -> int:
        """Bytes given and not yet written (in flight or waiting)."""
        return self._writing + self._queued

    def write(self, data: bytes) -> None:
        """Write ``data`` after what was given before (dropped once closed)."""
        if self._closed:
            return
        end = self._queued + len(data)
        queue = self._queue
        if queue is None:
            queue, self._spare = self._spare, None
            if queue is None:
                room = max(end, self.threads.ahead + SLACK)
                queue = mmap.mmap(-1, room, flags=mmap.MAP_PRIVATE)
            self._queue = queue
        if end > len(queue):
            queue.resize(end)
        queue[self._queued : end] = data
        self._queued = end
        if not self._writing:
            self._next(queue)
        if not self._paused and self.unwritten > self.threads.ahead:
            self._paused = True
            self._pause()

    def written(self) -> Deferred[None]:
        """Fires once every byte given so far is written, or the writer is closed and no
        thread writes to its file any more."""
        if not self.unwritten:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append(waiter)
        return waiter

    def release(self) -> None:
        """Unmap the spare batch: nothing more is given (a body all written; its file is
        the request's now)."""
        if self._spare is not None:
            self._spare.close()
            self._spare = None

    def close(self) -> None:
        """Drop what is not written yet; close the file once no write is in flight."""
        if self._closed:
            return
        self._closed = True
        for batch in (self._queue, self._spare):
            if batch is not None:
                batch.close()
        self._queue, self._spare, self._queued = None, None, 0
        if self._paused:
            self._paused = False
            self._resume()
        if not self._writing:
            self._finish()

    def _next(self, batch: mmap.mmap) -> None:
        self._queue, self._batch = None, batch
        self._writing, self._queued = self._queued, 0
        threads = self.threads
        write = self.charge(partial(_write, self.file, batch, self._writing))
        done = deferToThreadPool(threads.reactor, threads.pool, write)
        done.addBoth(self._returned)

    def _returned(self, result: Failure | None) -> None:
        self._writing = 0
        batch, self._batch = self._batch, None
        assert batch is not None, "one write in flight"
        if self._closed or isinstance(result, Failure) or self._spare is not None:
            batch.close()  # (two spare: one is enough)
        else:
            self._spare = batch
        if self._closed:
            self._finish()  # what failed meanwhile no longer matters
        elif isinstance(result, Failure):
            error = result.value
            if not isinstance(error, OSError):
                error = OSError(f"{type(error).__name__}: {error}")
            self._on_error(error)
            self.close()
        else:
            self._wrote()

    def _wrote(self) -> None:
        if self._queue is not None:
            self._next(self._queue)
        if self._paused and self.unwritten <= self.threads.ahead:
            self._paused = False
            self._resume()
        if not self.unwritten:
            self._fire()

    def _finish(self) -> None:
        with suppress(OSError):
            self.file.close()  # what it held is dropped: its space is given back
        self._fire()

    def _fire(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)


@frozen
class SpoolThreads:
    """Where request bodies are written: ``pool``'s threads, reporting to ``reactor``; each
    body's connection reads at most ``ahead`` bytes beyond what is written."""

    reactor: IReactorFromThreads
    pool: ThreadPool
    ahead: int = AHEAD

    def writer(
        self,
        file: IO[bytes],
        on_error: Callable[[OSError], object],
        pause: Callable[[], object],
        resume: Callable[[], object],
        charge: Charge = uncharged,
    ) -> SpoolWriter:
        """A writer of ``file`` in these threads (see :class:`SpoolWriter`)."""
        return SpoolWriter(file, self, on_error, pause, resume, charge)
