"""Cuts of ipykernel's own time per cell, applied inside both kernels a sandbox runs
(docs/extensions.rst, "Contexts"; the figures in docs/performance.rst, "Contexts").

This file is imported by the daemon only for its text, which begins both kernels' ``python3
-c`` programs (:data:`~sandboxd.core.contexts.languages.PYTHON_PROGRAM`), so it uses nothing
but the standard library and whichever ipykernel the sandbox's python has.

ipykernel redirects the kernel's file descriptors 1 and 2 into pipes, each read by a thread of
its stream (``OutStream``) that adds what it reads to the stream's buffer: that is how what a
child process prints reaches the cell. After each cell it flushes stdout and stderr, twice,
and sleeps half a millisecond (``Kernel._execute_sleep``, kept since 2014 because "on rare
occasions, the flush doesn't seem to make it"). From the kernel's main thread a flush hands the
send to the IOPub thread and waits for it: four thread round trips a cell, also when nothing
was printed. And neither the flush nor the sleep waits for the pipe's thread: output a child
wrote just before the cell ended may be added to the buffer after the cell's end is published,
and never reach the cell. Here, instead:

- the pipe's thread (:func:`watch`) holds the stream's ``watch_lock`` from a read of the pipe
  until what it read is in the buffer, and decodes UTF-8 across reads;
- a flush (:func:`flush`) first waits until, holding that lock, the pipe is seen empty: every
  byte written to the descriptor before the flush is then in the buffer. It then returns at
  once when there is nothing to send (no text buffered, no send scheduled, none under way),
  else flushes as ipykernel does. A send under way is one the IOPub thread began (its
  ``_flush``, run 0.2 s after a write) and has not yet queued: it has taken the buffer, so
  the buffer looks empty, and a flush that returned then would let the cell's ``idle`` be
  queued before the cell's last output, which the daemon would then drop as another cell's;
- the kernels' command lines set ``Kernel._execute_sleep`` to 0
  (:data:`~sandboxd.core.contexts.languages.TUNING_ARGS`).

A stream whose ipykernel lacks what this relies on keeps ipykernel's own reading and flush.
"""

import codecs
import fcntl
import importlib
import os
import select
import struct
import sys
import termios
import threading
from collections.abc import Callable
from typing import Any

DRAIN_WAIT = 0.0002
"""Seconds a flush sleeps while the pipe's thread has bytes left to take (the thread is
woken by them: this only lets it run)."""

DRAIN_TRIES = 50_000
"""Looks at the pipe a flush takes at most before it flushes what it has (ten seconds at
least: on a machine loaded enough, the pipe's thread waited more than one for a core)."""

READ_SIZE = 65536

NEEDS = ("_fid", "_buffer", "_buffer_lock", "_flush_pending", "_subprocess_flush_pending")
"""The attributes of ipykernel's ``OutStream`` the flush relies on (ipykernel 6)."""

WATCH_NEEDS = ("_fid", "_original_stdstream_copy", "_should_watch", "write")
"""Those :func:`watch` relies on; a stream without one keeps ipykernel's own thread."""


def waiting(fd: int) -> int:
    """Bytes waiting in the pipe ``fd``; 0 when that cannot be told."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return 0


def watch(stream: Any) -> None:
    """The pipe's thread: read the redirected descriptor's pipe until it ends, put each read
    in the buffer (``write``) and echo it, as ipykernel does, under ``watch_lock``."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    poller = select.poll()
    poller.register(stream._fid, select.POLLIN)
    try:
        while stream._should_watch:
            poller.poll()
            with stream.watch_lock:
                data = os.read(stream._fid, READ_SIZE)
                if not data:
                    return
                text = decoder.decode(data)
                if text:
                    stream.write(text)
            os.write(stream._original_stdstream_copy, data)
    except Exception:
        stream._exc = sys.exc_info()


def caught_up(stream: Any, sleep: Callable[[float], None]) -> None:
    """Return once every byte written to the stream's descriptor so far is in its buffer (or
    after :data:`DRAIN_TRIES` looks)."""
    for _ in range(DRAIN_TRIES):
        with stream.watch_lock:
            if not waiting(stream._fid):
                return
        sleep(DRAIN_WAIT)


def nothing_to_send(stream: Any) -> bool:
    """Whether the stream has no text buffered, no send scheduled and none under way.

    ``_flush`` marks its send under way (:func:`tune`) before it clears ``_flush_pending``,
    and this reads ``_flush_pending`` first: once it is seen clear, a send that took the
    buffer is seen under way or has queued what it took."""
    if stream._flush_pending or stream._subprocess_flush_pending:
        return False
    if getattr(stream, "sending", False):
        return False
    with stream._buffer_lock:
        return not stream._buffer.tell()


def tune(out_stream: Any, sleep: Callable[[float], None]) -> None:
    """Give ``out_stream`` (ipykernel's class) :func:`watch` as its pipe's thread and a flush
    that waits for it and skips sending nothing; unchanged if it lacks what they need.

    Its ``_flush`` (the send, run by the IOPub thread) marks itself under way in ``sending``
    while it runs; should two ever run at once (ipykernel runs it in the caller's thread once
    the IOPub thread is gone), the first to end clears the mark, and a flush then sends as
    ipykernel does, no worse than before."""
    if not all(hasattr(out_stream, name) for name in ("_watch_pipe_fd", "flush", "_flush")):
        return
    flush_as_before, watch_as_before = out_stream.flush, out_stream._watch_pipe_fd
    send_as_before = out_stream._flush

    def send(self: Any) -> None:
        self.sending = True
        try:
            send_as_before(self)
        finally:
            self.sending = False

    def watch_pipe_fd(self: Any) -> None:
        if not all(hasattr(self, name) for name in WATCH_NEEDS):
            watch_as_before(self)
            return
        self.watch_lock = threading.Lock()
        watch(self)

    def flush(self: Any) -> None:
        if getattr(self, "watch_lock", None) is None or not all(hasattr(self, n) for n in NEEDS):
            flush_as_before(self)
            return
        caught_up(self, sleep)
        if not nothing_to_send(self):
            flush_as_before(self)

    out_stream._watch_pipe_fd, out_stream.flush, out_stream._flush = watch_pipe_fd, flush, send


def tune_ipykernel(find: Callable[[str], Any] = importlib.import_module) -> None:
    """:func:`tune` ipykernel's ``OutStream``, where the python has ipykernel."""
    try:
        iostream = find("ipykernel.iostream")
    except ImportError:
        return
    import time

    tune(iostream.OutStream, time.sleep)
