"""The workspace watch's inotify parsing and event mapping, on a real inotify descriptor of a
temporary directory (no sandbox: the file work runs in the test's own thread)."""

import errno
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.python.failure import Failure

from sandboxd.core.watch import inotify
from sandboxd.core.watch import watch as watch_module
from sandboxd.core.watch.watch import WatchEvent, WorkspaceWatch, add_tree
from sandboxd.errors import PathNotFound


class Readers:
    def __init__(self) -> None:
        self.readers: set[Any] = set()

    def addReader(self, reader: Any) -> None:
        self.readers.add(reader)

    def removeReader(self, reader: Any) -> None:
        self.readers.discard(reader)


def started(
    tmp_path: Path, root: tuple[str, ...] = (), recursive: bool = True, account: Any = None
) -> Any:
    """A watch of ``tmp_path`` (its file work in the test's own thread, taking from
    ``account`` when given), started: it, its reactor, its events, its start's outcome, and
    its closes."""
    events: list[WatchEvent] = []
    reactor = Readers()
    closed: list[bool] = []

    def as_sandbox(work: Any) -> "Deferred[Any]":
        try:
            return succeed(work(str(tmp_path)))
        except OSError:
            return fail(Failure())

    watch = WorkspaceWatch(
        reactor,  # type: ignore[arg-type]
        as_sandbox,
        root,
        recursive,
        events.append,
        on_close=lambda: closed.append(True),
        account=account,
    )
    done: list[object] = []
    Deferred.fromCoroutine(watch.start()).addBoth(done.append)
    return watch, reactor, events, done, closed


def test_events_are_mapped_with_workspace_paths(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "link").symlink_to("/etc")
    watch, reactor, events, done, closed = started(tmp_path)
    assert done == [None] and watch in reactor.readers
    assert sorted(watch.paths.values()) == [(), ("d",)]  # the link is not followed
    (tmp_path / "d" / "f").write_bytes(b"x")
    os.chmod(tmp_path / "d" / "f", 0o600)
    os.rename(tmp_path / "d" / "f", tmp_path / "g")
    (tmp_path / "g").unlink()
    (tmp_path / "new").mkdir()
    watch.doRead()
    (tmp_path / "new" / "h").write_bytes(b"y")
    watch.doRead()
    watch.doRead()  # nothing waiting: no event, no error
    kinds = [(e.kind, e.path, e.is_dir) for e in events]
    for wanted in [
        ("create", "/d/f", False),
        ("write", "/d/f", False),
        ("chmod", "/d/f", False),
        ("rename", "/d/f", False),
        ("create", "/g", False),
        ("remove", "/g", False),
        ("create", "/new", True),
        ("create", "/new/h", False),
    ]:
        assert wanted in kinds, (wanted, kinds)
    (tmp_path / "new" / "h").unlink()
    (tmp_path / "new").rmdir()
    watch.doRead()  # the removed directory's watch is dropped (IN_IGNORED)
    assert ("new",) not in watch.paths.values()
    watch.close(gone=True)
    watch.close()
    assert events[-1] == WatchEvent("gone", gone=True) and closed == [True]
    assert watch.fileno() == -1 and watch not in reactor.readers
    assert watch.logPrefix() == "WorkspaceWatch"


def test_overflow_and_unknown_watches(tmp_path: Path) -> None:
    watch, _, events, _, _ = started(tmp_path, recursive=False)
    header = struct.Struct("iIII")
    raw = header.pack(-1, inotify.IN_Q_OVERFLOW, 0, 0)
    raw += header.pack(999, inotify.IN_CREATE, 0, 4) + b"x\0\0\0"
    raw += header.pack(1, inotify.IN_DELETE_SELF, 0, 0)
    for event in inotify.parse(raw):
        watch._event(event)
    assert events == [WatchEvent("overflow")]
    assert inotify.kind_of(inotify.IN_DELETE_SELF) is None
    watch._not_added(Failure(OSError(errno.ENOSPC, "full")), ("a",))
    watch._not_added(Failure(OSError(errno.ENOSPC, "full")), ("a",))
    watch._not_added(Failure(OSError(errno.ENOENT, "gone")), ("b",))
    assert events == [WatchEvent("overflow")] * 2
    watch.connectionLost(Failure(ConnectionError()))
    assert watch.closed


def test_a_missing_root_is_path_not_found(tmp_path: Path) -> None:
    _, reactor, _, done, closed = started(tmp_path, root=("missing",))
    assert isinstance(done[0], Failure) and done[0].check(PathNotFound)
    assert closed == [True] and not reactor.readers


def test_the_walk_is_bounded(tmp_path: Path) -> None:
    for name in "abc":
        (tmp_path / name).mkdir()
    ino = inotify.Inotify()
    fd = ino.open()
    try:
        with pytest.raises(OSError) as full:
            add_tree(ino, fd, str(tmp_path), (), True, 2)
        assert full.value.errno == errno.ENOSPC
        with pytest.raises(OSError):
            ino.watch_dir(fd, 10_000)  # not a descriptor
    finally:
        os.close(fd)


class Walks:
    """File work run when the test says: each walk is queued, then run by :meth:`run`,
    with ``between()`` done after the walk and before its result is handed back (a change
    made while the thread's result travels to the reactor)."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.queued: list[tuple[Any, Deferred[Any]]] = []

    def __call__(self, work: Any) -> "Deferred[Any]":
        waiting: Deferred[Any] = Deferred()
        self.queued.append((work, waiting))
        return waiting

    def run(self, between: Any = lambda: None) -> None:
        work, waiting = self.queued.pop(0)
        try:
            result = work(str(self.workspace))
        except OSError:
            between()
            waiting.errback(Failure())
            return
        between()
        waiting.callback(result)


class RacingInotify(inotify.Inotify):
    """Makes ``raced`` in the directory ``new`` right after its watch is added, before the
    walk lists it: the entry is both listed and announced by an event."""

    def watch_dir(self, fd: int, dir_fd: int) -> int:
        wd = super().watch_dir(fd, dir_fd)
        if os.readlink(f"/proc/self/fd/{dir_fd}").endswith("/new"):
            with open(os.open("raced", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=dir_fd), "wb"):
                pass
        return wd


def queued_watch(tmp_path: Path) -> tuple[WorkspaceWatch, Walks, list[WatchEvent], list[object]]:
    walks = Walks(tmp_path)
    events: list[WatchEvent] = []
    watch = WorkspaceWatch(
        Readers(),  # type: ignore[arg-type]
        walks,
        (),
        True,
        events.append,
        ino=RacingInotify(),
    )
    done: list[object] = []
    Deferred.fromCoroutine(watch.start()).addBoth(done.append)
    return watch, walks, events, done


def is_inotify(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    except OSError:
        return False


def test_what_a_new_directory_held_before_its_watch_is_reported_once(tmp_path: Path) -> None:
    watch, walks, events, done = queued_watch(tmp_path)
    walks.run()
    assert done == [None]
    (tmp_path / "new").mkdir()
    watch.doRead()  # the new directory: its walk is queued
    (tmp_path / "new" / "before").write_bytes(b"")  # before its watch: no event of its own
    (tmp_path / "new" / "sub").mkdir()

    def meanwhile() -> None:  # after the watch, before the walk's result is back
        (tmp_path / "new" / "after").write_bytes(b"x")
        (tmp_path / "new" / "sub" / "deep").write_bytes(b"")

    walks.run(meanwhile)
    watch.doRead()
    seen = [(e.kind, e.path, e.is_dir) for e in events]
    assert seen.count(("create", "/new", True)) == 1
    assert seen.count(("create", "/new/before", False)) == 1
    assert seen.count(("create", "/new/sub", True)) == 1
    assert seen.count(("create", "/new/raced", False)) == 1  # listed and announced: once
    assert seen.count(("create", "/new/after", False)) == 1  # held while the walk was out
    assert seen.count(("create", "/new/sub/deep", False)) == 1
    assert ("write", "/new/after", False) in seen  # held while the walk was out, then told
    assert not walks.queued  # /new/sub was watched by /new's walk, not walked again
    watch.close()


def test_the_descriptor_outlives_a_walk_in_flight(tmp_path: Path) -> None:
    watch, walks, events, _ = queued_watch(tmp_path)
    walks.run()
    fd = watch.fd
    (tmp_path / "new").mkdir()
    watch.doRead()
    watch.close()  # the client went while /new's walk runs on the descriptor
    assert watch.fd_open and is_inotify(fd) and watch.fileno() == -1
    walks.run()
    assert not watch.fd_open and not is_inotify(fd)
    assert events == [WatchEvent("create", "/new", True)]  # nothing after the close


def test_a_cancelled_start_closes_the_watch_once_its_walk_is_back(tmp_path: Path) -> None:
    walks = Walks(tmp_path)
    closed: list[bool] = []
    watch = WorkspaceWatch(
        Readers(),  # type: ignore[arg-type]
        walks,
        (),
        True,
        lambda event: None,
        on_close=lambda: closed.append(True),
    )
    starting = Deferred.fromCoroutine(watch.start())
    outcome: list[Failure] = []
    starting.addErrback(outcome.append)
    starting.cancel()  # the client went during the walk
    assert outcome and outcome[0].check(CancelledError)
    assert watch.closed and closed == [True] and watch.fd_open
    walks.run()
    assert not watch.fd_open


def test_a_failed_follow_walk_frees_the_descriptor_of_a_closed_watch(tmp_path: Path) -> None:
    watch, walks, events, _ = queued_watch(tmp_path)
    walks.run()
    (tmp_path / "gone").mkdir()
    watch.doRead()
    (tmp_path / "gone").rmdir()  # removed before its walk: the walk fails
    watch.close()
    walks.run()
    assert not watch.fd_open and events == [WatchEvent("create", "/gone", True)]


def test_a_watch_closed_during_its_first_walk_never_reads(tmp_path: Path) -> None:
    walks = Walks(tmp_path)
    reactor = Readers()
    watch = WorkspaceWatch(reactor, walks, (), True, lambda event: None)  # type: ignore[arg-type]
    done: list[object] = []
    Deferred.fromCoroutine(watch.start()).addBoth(done.append)
    watch.close()  # the sandbox died while the root was walked
    walks.run()
    assert done == [None]
    assert not reactor.readers and not watch.fd_open and watch.paths == {}


def test_an_event_of_a_walk_still_out_stays_held_while_another_settles(tmp_path: Path) -> None:
    watch, walks, events, _ = queued_watch(tmp_path)
    walks.run()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    watch.doRead()  # both walks queued: a's, then b's
    (work_a, back_a), (work_b, back_b) = walks.queued
    walks.queued.clear()
    found_b = work_b(str(tmp_path))  # b is watched now; its walk's result not yet back
    (tmp_path / "b" / "f").write_bytes(b"")  # an event of b's watch, unknown to the reactor
    back_a.callback(work_a(str(tmp_path)))  # a settles: b's event read, and held on
    assert ("create", "/b/f") not in [(e.kind, e.path) for e in events]
    assert [raw.name for raw in watch._held] == ["f"]
    watch._held.append(inotify.RawEvent(999, inotify.IN_CREATE, "stray"))  # no walk's
    back_b.callback(found_b)
    seen = [(e.kind, e.path) for e in events]
    assert seen.count(("create", "/b/f")) == 1
    assert watch._held == [] and "/stray" not in [e.path for e in events]  # not held forever
    watch.close()


def test_a_watch_its_consumer_closes_mid_read_reports_nothing_more(tmp_path: Path) -> None:
    events: list[WatchEvent] = []
    walks = Walks(tmp_path)
    watch = WorkspaceWatch(Readers(), walks, (), True, events.append)  # type: ignore[arg-type]
    Deferred.fromCoroutine(watch.start())
    walks.run()
    fd = watch.fd
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()

    def first_event_closes(event: WatchEvent) -> None:
        events.append(event)
        watch.close()  # e.g. a consumer that wanted one event

    watch.deliver = first_event_closes
    watch.doRead()
    assert events == [WatchEvent("create", "/x", True)]
    assert walks.queued == []  # no walk of x or y on the closed descriptor
    assert not watch.fd_open and not is_inotify(fd)


def test_a_watch_its_consumer_closes_while_a_walk_settles_reports_nothing_more(
    tmp_path: Path,
) -> None:
    events: list[WatchEvent] = []
    walks = Walks(tmp_path)
    watch = WorkspaceWatch(Readers(), walks, (), True, events.append)  # type: ignore[arg-type]
    Deferred.fromCoroutine(watch.start())
    walks.run()
    (tmp_path / "new").mkdir()
    watch.doRead()  # /new told; its walk queued
    for name in ("p", "q"):
        (tmp_path / "new" / name).write_bytes(b"")  # before its watch: told by the walk

    def one_more_then_close(event: WatchEvent) -> None:
        events.append(event)
        watch.close()

    watch.deliver = one_more_then_close
    walks.run()
    assert len(events) == 2 and events[1].path in ("/new/p", "/new/q")
    assert not watch.fd_open


def test_a_directory_that_cannot_be_opened_during_the_walk_is_not_watched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "gone"):
        (tmp_path / name).mkdir()

    class VanishingOs:
        """The watch module's ``os``, where ``gone`` is removed (or swapped, or unreadable)
        right after the walk listed it."""

        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        @staticmethod
        def open(path: Any, *args: Any, **kwargs: Any) -> int:
            if path == "gone":
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
            return os.open(path, *args, **kwargs)

    monkeypatch.setattr(watch_module, "os", VanishingOs())
    ino = inotify.Inotify()
    fd = ino.open()
    try:
        added = add_tree(ino, fd, str(tmp_path), (), True, 10)
    finally:
        os.close(fd)
    assert sorted(w.parts for w in added) == [(), ("a",)]
