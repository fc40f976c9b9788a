"""The kernels' tuning (sandboxd/core/contexts/kernel_tuning.py) on a stream shaped as
ipykernel 6's ``OutStream`` (the daemon's python has no ipykernel: the real one is run by
tests/process/test_contexts.py), over real pipes and threads."""

import contextlib
import io
import os
import resource
import threading
import time
import types
from typing import Any

import pytest

from sandboxd.core.contexts import kernel_tuning
from sandboxd.core.contexts.kernel_tuning import (
    caught_up,
    nothing_to_send,
    tune,
    tune_ipykernel,
    waiting,
)


class Stream:
    """What of ipykernel's ``OutStream`` the tuning touches: a pipe read by a thread into a
    buffer, a send (``_flush``, run by the IOPub thread) that takes the buffer and queues it
    (here: keeps it in :attr:`sent`), and a flush that has the IOPub thread send and waits
    (here: sends behind any send under way, as the IOPub thread runs one thing at a time)."""

    def __init__(self) -> None:
        self._fid, self.descriptor = os.pipe()
        self._original_stdstream_copy = os.open(os.devnull, os.O_WRONLY)
        self._should_watch = True
        self._buffer = io.StringIO()
        self._buffer_lock = threading.Lock()
        self._flush_pending = False
        self._subprocess_flush_pending = False
        self._exc: Any = None
        self.sent: list[str] = []
        self.flushes = 0
        self.io_thread = threading.Lock()
        self.between_take_and_queue: Any = lambda: None
        self.on_flush: Any = lambda: None

    def write(self, text: str) -> None:
        with self._buffer_lock:
            self._buffer.write(text)

    def _flush(self) -> None:
        with self.io_thread:
            self._flush_pending = False
            with self._buffer_lock:
                data, self._buffer = self._buffer.getvalue(), io.StringIO()
            self.between_take_and_queue()
            if data:
                self.sent.append(data)

    def flush(self) -> None:
        self.flushes += 1
        self.on_flush()
        self._flush()

    def _watch_pipe_fd(self) -> None:
        raise AssertionError("replaced by the tuning")

    def start(self) -> threading.Thread:
        self.thread = threading.Thread(target=self._watch_pipe_fd, daemon=True)
        self.thread.start()
        while getattr(self, "watch_lock", None) is None:
            pass
        return self.thread

    def close_descriptor(self) -> None:
        """Close the pipe's writing end (once): its thread reads the end and stops."""
        if self.descriptor >= 0:
            os.close(self.descriptor)
            self.descriptor = -1

    def close(self) -> None:
        """Stop the pipe's thread, then close every descriptor: a thread left reading would
        read the next test's pipe, which reuses the numbers."""
        self.close_descriptor()
        thread = getattr(self, "thread", None)
        if thread is not None:
            thread.join(60)  # an outer bound only: the end is read at once
            assert not thread.is_alive()
        for fd in (self._fid, self._original_stdstream_copy):
            with contextlib.suppress(OSError):
                os.close(fd)


@pytest.fixture
def tuned() -> Any:
    class Tuned(Stream):
        pass

    tune(Tuned, time.sleep)  # as in the kernel: a sleep lets the pipe's thread take the GIL
    stream = Tuned()
    yield stream
    stream.close()


def test_a_flush_has_every_byte_written_before_it(tuned: Any) -> None:
    thread = tuned.start()
    euro = "€".encode()
    os.write(tuned.descriptor, euro[:1])  # a character cut between two writes
    tuned.flush()
    assert tuned.sent == []  # nothing whole yet
    os.write(tuned.descriptor, euro[1:] + b" said\n")
    tuned.flush()
    assert tuned.sent == ["€ said\n"]
    tuned.close_descriptor()  # the pipe ends: so does its thread
    thread.join(60)  # an outer bound only: it ends at once unless the machine is loaded
    assert not thread.is_alive()


def test_the_thread_stops_when_told(tuned: Any) -> None:
    thread = tuned.start()
    tuned._should_watch = False
    os.write(tuned.descriptor, b"last")
    thread.join(60)  # an outer bound only: it ends at once unless the machine is loaded
    assert not thread.is_alive()


def test_a_flush_with_nothing_to_send_is_skipped(tuned: Any) -> None:
    tuned.start()
    tuned.flush()
    assert tuned.flushes == 0
    tuned.write("printed")
    tuned.flush()
    assert (tuned.flushes, tuned.sent) == (1, ["printed"])
    tuned._flush_pending = True  # a send scheduled: flushed, whatever the buffer
    tuned.flush()
    assert tuned.flushes == 2


def test_a_flush_waits_for_a_send_the_io_thread_has_begun(tuned: Any) -> None:
    """The IOPub thread's send, 0.2 s after a write, has taken the buffer and not yet queued
    it when the cell's flush looks: the flush must not return before it is queued, or the
    cell's ``idle`` would be queued before the cell's output."""
    tuned.start()
    tuned.write("printed")
    tuned._flush_pending = True  # as ipykernel's write schedules its send
    taken, go_on = threading.Event(), threading.Event()

    def hold() -> None:
        taken.set()
        go_on.wait(60)  # an outer bound only: set below

    tuned.between_take_and_queue = hold
    send = threading.Thread(target=tuned._flush)
    send.start()
    assert taken.wait(60)  # an outer bound only: the send begins at once
    assert tuned.sending
    tuned.on_flush = go_on.set  # the send under way ends once ipykernel's flush is asked for
    try:
        tuned.flush()
        assert tuned.sent == ["printed"]
        assert tuned.flushes == 1
    finally:
        go_on.set()
        send.join(60)
    assert not tuned.sending


def test_a_stream_before_its_thread_runs_flushes_as_before(tuned: Any) -> None:
    tuned.flush()
    assert tuned.flushes == 1


def test_a_failure_of_the_thread_is_kept_for_ipykernel_to_show(tuned: Any) -> None:
    def broken(text: str) -> None:
        raise RuntimeError("no room")

    tuned.write = broken
    thread = tuned.start()
    os.write(tuned.descriptor, b"x")
    thread.join(60)  # an outer bound only: it ends at once unless the machine is loaded
    assert tuned._exc[0] is RuntimeError


def test_nothing_to_send_and_waiting() -> None:
    stream = Stream()
    try:
        assert nothing_to_send(stream)
        stream._subprocess_flush_pending = True
        assert not nothing_to_send(stream)
        assert waiting(stream._fid) == 0
        os.write(stream.descriptor, b"abc")
        assert waiting(stream._fid) == 3
    finally:
        stream.close()
    never_open = resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # past the highest number
    assert waiting(never_open) == 0  # no such descriptor: cannot be told


def test_catching_up_gives_up_when_nobody_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_tuning, "DRAIN_TRIES", 3)
    stream = Stream()
    stream.watch_lock = threading.Lock()  # type: ignore[attr-defined]
    slept: list[float] = []
    try:
        os.write(stream.descriptor, b"unread")
        caught_up(stream, slept.append)
        assert slept == [kernel_tuning.DRAIN_WAIT] * 3
    finally:
        stream.close()


def test_a_stream_without_what_the_thread_needs_keeps_its_own() -> None:
    kept: list[bool] = []

    class Elsewhere(Stream):  # another ipykernel's stream: no _original_stdstream_copy
        def _watch_pipe_fd(self) -> None:
            kept.append(True)

    tune(Elsewhere, lambda seconds: None)
    stream = Elsewhere()
    try:
        os.close(stream._original_stdstream_copy)
        del stream._original_stdstream_copy
        stream._watch_pipe_fd()
        assert kept == [True]
        stream.flush()  # and its flush is ipykernel's
        assert stream.flushes == 1
    finally:
        os.close(stream._fid)
        os.close(stream.descriptor)


def test_an_ipykernel_without_what_it_needs_is_left_alone() -> None:
    class Other:
        def flush(self) -> None:
            pass

    flush = Other.flush
    tune(Other, lambda seconds: None)
    assert Other.flush is flush


def test_tune_ipykernel_finds_its_stream_or_does_nothing() -> None:
    def missing(name: str) -> Any:
        raise ImportError(name)

    tune_ipykernel(missing)

    class Found(Stream):
        pass

    flush = Found.flush
    tune_ipykernel(lambda name: types.SimpleNamespace(OutStream=Found))
    assert Found.flush is not flush
