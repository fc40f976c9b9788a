"""Request bodies written off the reactor thread (``sandboxd.web.spool``): in order, batched,
with the connection paused while too much is unwritten, and a request handled only once its
whole body is written.

The pool is a stand-in that runs each write only when told (``StepPool.step``), on the test's
own thread, so that every interleaving is chosen by the test; ``tests/process`` sends a real
gigabyte through the daemon's real pool.
"""

import errno
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool
from twisted.web.resource import Resource
from twisted.web.test.requesthelper import DummyChannel
from zope.interface import implementer

from sandboxd.errors import InsufficientStorage
from sandboxd.http import parse
from sandboxd.web.site import (
    SPOOL_MIN,
    LimitedRequest,
    Spool,
    SpoolingSite,
    Utf8URLs,
    _Discard,
    make_site,
)
from sandboxd.web.spool import AHEAD, SLACK, SpoolThreads, SpoolWriter


class StepPool(ThreadPool):
    """A thread pool that holds each call until :meth:`step` runs it (on the caller's thread)."""

    def __init__(self) -> None:
        super().__init__(0, 1, "step")
        self.calls: list[tuple[Any, Callable[..., Any], tuple[Any, ...]]] = []

    def callInThreadWithCallback(
        self, onResult: Any, func: Callable[..., Any], *args: Any, **kw: Any
    ) -> None:
        self.calls.append((onResult, func, args))

    def step(self) -> None:
        on_result, func, args = self.calls.pop(0)
        try:
            result = func(*args)
        except Exception:
            on_result(False, Failure())
        else:
            on_result(True, result)


@implementer(IReactorFromThreads)
class Now:
    """A reactor stand-in that runs what a thread hands it at once."""

    def callFromThread(self, callable: Callable[..., Any], *args: object, **kwargs: object) -> None:
        callable(*args, **kwargs)


class Flow:
    """What a writer asked of its connection, and the errors it reported."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.errors: list[OSError] = []

    def writer(self, file: Any, ahead: int = 10) -> tuple[SpoolWriter, StepPool]:
        pool = StepPool()
        threads = SpoolThreads(Now(), pool, ahead)
        writer = threads.writer(
            file,
            self.errors.append,
            lambda: self.calls.append("pause"),
            lambda: self.calls.append("resume"),
        )
        return writer, pool


class Recording(io.BytesIO):
    """A content file that keeps each write it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: Any) -> int:
        self.writes.append(bytes(data))
        return super().write(data)

    def close(self) -> None:
        self.contents = self.getvalue()
        super().close()


class Failing(Recording):
    """A content file on a full disk."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def write(self, data: Any) -> int:
        raise self.error

    def close(self) -> None:
        super().close()
        raise OSError(errno.ENOSPC, "No space left on device")  # its buffer, again


def test_writes_run_in_the_pool_in_order_and_batch_what_came_meanwhile() -> None:
    flow = Flow()
    file = Recording()
    writer, pool = flow.writer(file, ahead=1 << 20)
    writer.write(b"a")
    assert file.writes == [] and len(pool.calls) == 1  # handed to the pool, not written
    writer.write(b"bb")
    writer.write(b"ccc")
    assert len(pool.calls) == 1  # one write in flight at a time
    assert writer.unwritten == 6
    written = writer.written()
    pool.step()
    assert file.writes == [b"a"] and len(pool.calls) == 1
    assert not written.called
    pool.step()
    assert file.writes == [b"a", b"bbccc"]  # joined into one write
    assert written.called and writer.unwritten == 0
    assert writer.written().called  # nothing left: at once
    writer.write(b"d")
    pool.step()
    assert file.getvalue() == b"abbcccd"
    assert flow.calls == [] and flow.errors == []
    writer.close()
    assert file.contents == b"abbcccd"


def test_a_batch_grows_past_its_room() -> None:
    flow = Flow()
    file = Recording()
    writer, pool = flow.writer(file, ahead=10)
    writer.write(b"a")
    writer.write(b"b")
    big = bytes(range(256)) * (SLACK // 256 + 1)  # more than the batch's room
    writer.write(big)
    pool.step()
    pool.step()
    assert file.writes == [b"a", b"b" + big]


def test_the_connection_pauses_past_the_bound_and_resumes_once_under_it() -> None:
    flow = Flow()
    file = Recording()
    writer, pool = flow.writer(file, ahead=10)
    writer.write(b"x" * 8)
    writer.write(b"y" * 2)
    assert flow.calls == []  # at the bound, not past it
    writer.write(b"z" * 8)
    assert flow.calls == ["pause"]
    writer.write(b"w")
    assert flow.calls == ["pause"]  # once
    pool.step()  # the 8 written; the next 11 still past the bound
    assert flow.calls == ["pause"] and writer.unwritten == 11
    pool.step()
    assert flow.calls == ["pause", "resume"]
    assert file.writes == [b"x" * 8, b"yy" + b"z" * 8 + b"w"]


def test_the_connection_resumes_as_soon_as_what_is_left_is_under_the_bound() -> None:
    flow = Flow()
    writer, pool = flow.writer(Recording(), ahead=10)
    writer.write(b"x" * 11)
    assert flow.calls == ["pause"]
    writer.write(b"y" * 3)
    pool.step()
    assert flow.calls == ["pause", "resume"] and writer.unwritten == 3


def batch_of(pool: StepPool) -> Any:
    """The mapping the pool's next write writes."""
    write: Any = pool.calls[0][1]
    return write.args[1]


def queue_of(writer: SpoolWriter) -> Any:
    """The mapping being filled (``None``: none)."""
    return writer._queue


def spare_of(writer: SpoolWriter) -> Any:
    """The writer's spare mapping (``None``: none)."""
    return writer._spare


def test_a_written_batch_is_filled_again_and_unmapped_at_the_end() -> None:
    flow = Flow()
    file = Recording()
    writer, pool = flow.writer(file, ahead=1 << 20)
    writer.write(b"a")  # in flight
    writer.write(b"b")  # queued in a second mapping
    first, second = batch_of(pool), queue_of(writer)
    assert second is not None and first is not second
    pool.step()  # "a" written: its mapping is the spare; "b" goes next
    assert spare_of(writer) is first and batch_of(pool) is second
    writer.write(b"c")  # filled into the written mapping, not a new one
    assert queue_of(writer) is first and spare_of(writer) is None
    pool.step()  # "b" written: the spare again, while "c" goes next
    pool.step()  # "c" written: a second spare is one too many
    assert file.getvalue() == b"abc" and spare_of(writer) is second and first.closed
    writer.release()
    assert second.closed and spare_of(writer) is None
    writer.release()  # (nothing left to unmap)
    writer.close()
    assert file.contents == b"abc"


def test_closing_drops_the_spare_and_a_batch_in_flight_once_written() -> None:
    flow = Flow()
    writer, pool = flow.writer(Recording(), ahead=1 << 20)
    writer.write(b"a")
    pool.step()
    writer.write(b"b")
    spare_then_flight = batch_of(pool)
    writer.write(b"c")
    queued = writer._queue
    assert queued is not None
    writer.close()
    assert queued.closed and not spare_then_flight.closed  # a thread still writes it
    pool.step()
    assert spare_then_flight.closed


def test_closing_mid_write_closes_the_file_once_the_thread_returns() -> None:
    flow = Flow()
    file = Recording()
    writer, pool = flow.writer(file, ahead=10)
    writer.write(b"x" * 11)
    writer.write(b"dropped")
    written = writer.written()
    writer.close()
    assert flow.calls == ["pause", "resume"]  # the connection is not left paused
    assert not file.closed and not written.called  # a thread still writes to it
    writer.write(b"after")  # dropped
    writer.close()  # once
    pool.step()
    assert file.closed and file.contents == b"x" * 11
    assert written.called and not pool.calls
    assert flow.errors == []


def test_closing_with_no_write_in_flight_closes_at_once() -> None:
    flow = Flow()
    file = Recording()
    writer, _ = flow.writer(file)
    writer.close()
    assert file.closed and flow.calls == []
    assert writer.written().called


@pytest.mark.parametrize(
    ("raised", "expected"),
    [(OSError(errno.ENOSPC, "No space left on device"), errno.ENOSPC), (ValueError("x"), None)],
)
def test_a_failed_write_is_reported_once_and_drops_the_rest(
    raised: Exception, expected: int | None
) -> None:
    flow = Flow()
    file = Failing(raised)
    writer, pool = flow.writer(file, ahead=10)
    writer.write(b"x" * 11)
    writer.write(b"y")
    written = writer.written()
    pool.step()
    (error,) = flow.errors
    assert isinstance(error, OSError) and error.errno == expected
    assert flow.calls == ["pause", "resume"]
    assert file.closed and written.called and not pool.calls
    writer.write(b"z")
    assert not pool.calls


def test_a_write_that_fails_after_closing_is_not_reported() -> None:
    flow = Flow()
    file = Failing(OSError(errno.EIO, "I/O error"))
    writer, pool = flow.writer(file)
    writer.write(b"x")
    writer.close()
    pool.step()
    assert file.closed and flow.errors == []


# Through a request


class Request(LimitedRequest):
    """A request that records being handled instead of rendering."""

    handled: bytes | None = None

    def process(self) -> None:
        content: Any = self.content
        self.handled = content.read()

    def close_content(self) -> None:
        content: Any = self.content
        content.close()


def spooling(tmp_path: Path, ahead: int = 10) -> tuple[Request, StepPool, StringTransport]:
    pool = StepPool()
    site = make_site(
        Utf8URLs(Resource()),
        64,
        spool_dir=str(tmp_path),
        spool_threads=SpoolThreads(Now(), pool, ahead),
    )
    channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
    transport = StringTransport()
    channel.makeConnection(transport)  # the site's Channel: the spool pauses it as one hold
    return Request(channel), pool, transport


def test_the_request_is_handled_once_its_whole_body_is_written(tmp_path: Path) -> None:
    request, pool, transport = spooling(tmp_path)
    request.max_body = 64
    request.gotLength(None)
    writer = request.content
    assert isinstance(writer, SpoolWriter) and isinstance(writer.file, Spool)
    request.handleContentChunk(b"a" * 8)
    request.handleContentChunk(b"b" * 8)
    assert transport.producerState == "paused"
    request.requestReceived(b"PUT", b"/f", b"HTTP/1.1")
    assert request.handled is None  # a write is still in flight
    pool.step()
    assert request.handled is None
    pool.step()
    assert transport.producerState == "producing"
    assert request.handled == b"a" * 8 + b"b" * 8
    assert request.content is writer.file
    request.close_content()


def test_a_body_written_before_the_end_is_handled_at_once(tmp_path: Path) -> None:
    request, pool, _ = spooling(tmp_path)
    request.gotLength(SPOOL_MIN)
    request.handleContentChunk(b"abc")
    pool.step()
    request.requestReceived(b"PUT", b"/f", b"HTTP/1.1")
    assert request.handled == b"abc"
    request.close_content()


def test_a_small_body_stays_in_memory_and_is_handled_at_once(tmp_path: Path) -> None:
    request, pool, _ = spooling(tmp_path)
    request.gotLength(3)
    assert isinstance(request.content, io.BytesIO)
    request.handleContentChunk(b"abc")
    request.requestReceived(b"PUT", b"/f", b"HTTP/1.1")
    assert request.handled == b"abc" and not pool.calls


def test_a_body_over_the_limit_closes_its_writer_and_reads_on(tmp_path: Path) -> None:
    request, pool, transport = spooling(tmp_path)
    request.max_body = 20
    request.gotLength(None)
    writer = request.content
    assert isinstance(writer, SpoolWriter)
    request.handleContentChunk(b"x" * 12)
    assert transport.producerState == "paused"
    request.handleContentChunk(b"x" * 12)
    assert request.too_large and isinstance(request.content, _Discard)
    assert transport.producerState == "producing"  # the rest is read, and dropped
    assert not writer.file.closed  # until its thread is done with it
    pool.step()
    assert writer.file.closed
    request.requestReceived(b"PUT", b"/f", b"HTTP/1.1")
    assert request.handled == b""


def test_a_body_that_fills_the_disk_is_507_once_written(tmp_path: Path) -> None:
    request, pool, transport = spooling(tmp_path)
    request.gotLength(None)
    writer = request.content
    assert isinstance(writer, SpoolWriter)
    writer.file.close()
    file = writer.file = Failing(OSError(errno.ENOSPC, "No space left on device"))
    request.handleContentChunk(b"x" * 12)
    request.requestReceived(b"PUT", b"/f", b"HTTP/1.1")
    pool.step()
    assert file.closed and isinstance(request.content, _Discard)
    assert transport.producerState == "producing"
    assert request.handled == b""  # handled, with the error kept
    with pytest.raises(InsufficientStorage):
        parse.refuse_too_large(request, 1 << 20)


def test_a_connection_lost_mid_write_gives_the_spool_back_and_is_not_handled(
    tmp_path: Path,
) -> None:
    request, pool, transport = spooling(tmp_path)
    request.gotLength(None)
    writer = request.content
    assert isinstance(writer, SpoolWriter)
    request.handleContentChunk(b"x" * 12)
    request.requestReceived(b"PUT", b"/f", b"HTTP/1.1")
    request.connectionLost(Failure(ConnectionDone()))
    assert transport.producerState == "paused"  # a lost connection is not resumed
    assert not writer.file.closed
    pool.step()
    assert writer.file.closed and request.handled is None
    assert list(tmp_path.iterdir()) == []


def test_a_site_without_threads_writes_bodies_as_they_arrive(tmp_path: Path) -> None:
    channel: Any = DummyChannel()
    channel.site = site = SpoolingSite(Utf8URLs(Resource()))
    site.spool_dir = str(tmp_path)
    request = Request(channel)
    request.gotLength(None)
    assert isinstance(request.content, Spool)
    request.close_content()


def test_the_default_bound() -> None:
    assert SpoolThreads(Now(), StepPool()).ahead == AHEAD
