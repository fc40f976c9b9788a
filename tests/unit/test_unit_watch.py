"""The workspace watch's inotify parsing and event mapping, on a real inotify descriptor of a
temporary directory (no sandbox: the file work runs in the test's own thread)."""

import errno
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.defer import Deferred, fail, succeed
from twisted.python.failure import Failure

from sandboxd.core.watch import inotify
from sandboxd.core.watch.watch import WatchEvent, WorkspaceWatch, add_tree
from sandboxd.errors import PathNotFound


class Readers:
    def __init__(self) -> None:
        self.readers: set[Any] = set()

    def addReader(self, reader: Any) -> None:
        self.readers.add(reader)

    def removeReader(self, reader: Any) -> None:
        self.readers.discard(reader)


def started(tmp_path: Path, root: tuple[str, ...] = (), recursive: bool = True) -> Any:
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
