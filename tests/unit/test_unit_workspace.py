"""Workspace file operations (``sandboxd.core.files.workspace``), called directly on a real
directory.

Races (an entry removed or a directory moved while a call runs) are made deterministic either
by stepping the walk generator or by a stand-in for the module's ``os`` that fails on cue.
"""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sandboxd.core.files import tree as trees
from sandboxd.core.files import walking, workspace
from sandboxd.errors import BadRequest, InsufficientStorage, PathNotFound, TooManyEntries
from sandboxd.http import wire
from sandboxd.http.routes.files import measure_walk
from sandboxd.web.site import Spool

OTHER_UID = os.getuid() + 4242
SECRET = b"outside secret"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret").write_bytes(SECRET)
    return path


class FaultyOs:
    """Stands in for ``os`` in the workspace module: named calls go through a fault function
    ``fault(real, *args, **kwargs)`` that may raise or call the real one."""

    def __init__(self, **faults: Callable[..., Any]) -> None:
        self._faults = faults

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        fault = self._faults.get(name)
        if fault is None:
            return real
        return lambda *args, **kwargs: fault(real, *args, **kwargs)


def fault_os(monkeypatch: pytest.MonkeyPatch, faulty: FaultyOs) -> None:
    """``faulty`` in place of ``os`` for the file operations and the tree walks they use."""
    monkeypatch.setattr(workspace, "os", faulty)
    monkeypatch.setattr(walking, "os", faulty)
    monkeypatch.setattr(trees, "os", faulty)


def fail_on(name: str, error: OSError) -> Callable[..., Any]:
    """A fault raising ``error`` when the call's first argument is ``name``."""

    def fault(real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if args and args[0] == name:
            raise error
        return real(*args, **kwargs)

    return fault


def files(ws: Path) -> set[str]:
    return {e.path for e in walking.walk(str(ws), ())}


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.fixture
def alarm() -> Iterator[None]:
    """A hang guard for calls that used to block forever (not a timing assertion)."""

    def hung(signum: int, frame: object) -> None:
        raise AssertionError("the call blocked")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# translate


@pytest.mark.parametrize(
    ("code", "kind", "status"),
    [
        (errno.ENOENT, PathNotFound, 404),
        (errno.ENOTDIR, PathNotFound, 404),
        (errno.ELOOP, PathNotFound, 404),
        (errno.ENOSPC, InsufficientStorage, 507),
        (errno.EDQUOT, InsufficientStorage, 507),
        (errno.EACCES, BadRequest, 400),
        (errno.EPERM, BadRequest, 400),
        (errno.EINVAL, BadRequest, 400),
        (errno.ENAMETOOLONG, BadRequest, 400),
    ],
)
def test_translate(code: int, kind: type, status: int) -> None:
    error = workspace.translate(OSError(code, os.strerror(code)), ("a", "b"))
    assert type(error) is kind
    assert wire.status_and_type(error)[0] == status
    assert error.detail.startswith("/a/b: ")


def test_translate_without_errno() -> None:
    error = workspace.translate(OSError("odd"), ())
    assert isinstance(error, BadRequest)
    assert error.detail.startswith("/: ")


# open_for_reading


def test_open_for_reading(ws: Path) -> None:
    (ws / "d").mkdir()
    (ws / "d" / "f").write_bytes(b"hello")
    source, length = workspace.open_for_reading(str(ws), ("d", "f"), os.getuid())
    with source:
        assert (source.read(), length) == (b"hello", 5)


@pytest.mark.parametrize("parts", [("missing",), ("no", "such"), ("file", "below")])
def test_open_for_reading_missing(ws: Path, parts: tuple[str, ...]) -> None:
    (ws / "file").write_bytes(b"x")
    with pytest.raises(PathNotFound):
        workspace.open_for_reading(str(ws), parts, os.getuid())


def test_open_for_reading_refuses_non_files(ws: Path, alarm: None) -> None:
    (ws / "dir").mkdir()
    os.mkfifo(ws / "fifo")
    for parts in [(), ("dir",), ("fifo",)]:
        with pytest.raises(BadRequest):
            workspace.open_for_reading(str(ws), parts, os.getuid())


def test_open_for_reading_never_follows_links(ws: Path, outside: Path) -> None:
    (ws / "link").symlink_to(outside / "secret")
    (ws / "dirlink").symlink_to(outside)
    for parts in [("link",), ("dirlink", "secret")]:
        with pytest.raises(PathNotFound):
            workspace.open_for_reading(str(ws), parts, os.getuid())


def test_open_for_reading_refuses_a_foreign_hardlink(ws: Path, outside: Path) -> None:
    os.link(outside / "secret", ws / "hard")
    owner = os.stat(outside / "secret").st_uid
    with pytest.raises(BadRequest, match="hard link"):
        workspace.open_for_reading(str(ws), ("hard",), owner + 1)
    # The sandbox's own file with several links is fine.
    source, _ = workspace.open_for_reading(str(ws), ("hard",), owner)
    source.close()


def test_a_single_link_file_of_another_owner_is_readable(ws: Path) -> None:
    (ws / "f").write_bytes(b"x")
    source, length = workspace.open_for_reading(str(ws), ("f",), OTHER_UID)
    source.close()
    assert length == 1


# write_from


def test_write_from_creates_parents_and_replaces(ws: Path) -> None:
    workspace.write_from(str(ws), ("a", "b", "c"), io.BytesIO(b"one"))
    assert (ws / "a" / "b" / "c").read_bytes() == b"one"
    workspace.write_from(str(ws), ("a", "b", "c"), io.BytesIO(b"two"))
    assert (ws / "a" / "b" / "c").read_bytes() == b"two"
    assert tree(ws) == ["a", "a/b", "a/b/c"]


def test_write_from_refuses_root_and_directories(ws: Path) -> None:
    (ws / "d").mkdir()
    for parts in [(), ("d",)]:
        with pytest.raises(BadRequest, match="is a directory"):
            workspace.write_from(str(ws), parts, io.BytesIO(b"x"))
    assert tree(ws) == ["d"]


def test_write_from_under_a_file_is_not_found(ws: Path) -> None:
    (ws / "f").write_bytes(b"x")
    with pytest.raises(PathNotFound):
        workspace.write_from(str(ws), ("f", "g"), io.BytesIO(b"y"))


class Exploding(io.RawIOBase):
    """A source that gives some bytes, then fails."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.calls = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.calls += 1
        if self.calls > 1:
            raise self.error
        buffer[:4] = b"part"
        return 4


def test_write_from_cleans_its_temporary_file_on_failure(ws: Path) -> None:
    (ws / "f").write_bytes(b"original")
    with pytest.raises(ValueError, match="client went away"):
        workspace.write_from(str(ws), ("f",), Exploding(ValueError("client went away")))  # type: ignore[arg-type]
    assert tree(ws) == ["f"]
    assert (ws / "f").read_bytes() == b"original"


def test_write_from_disk_full_is_507_and_leaves_nothing(ws: Path) -> None:
    with pytest.raises(InsufficientStorage):
        workspace.write_from(str(ws), ("d", "f"), Exploding(OSError(errno.ENOSPC, "full")))  # type: ignore[arg-type]
    assert tree(ws) == ["d"]


def test_write_from_cleanup_survives_a_failing_unlink(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_unlink(real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EIO, "I/O error")

    fault_os(monkeypatch, FaultyOs(unlink=no_unlink))
    with pytest.raises(InsufficientStorage):
        workspace.write_from(str(ws), ("f",), Exploding(OSError(errno.EDQUOT, "quota")))  # type: ignore[arg-type]


def test_write_from_onto_a_symlink_replaces_the_link(ws: Path, outside: Path) -> None:
    (ws / "link").symlink_to(outside / "secret")
    workspace.write_from(str(ws), ("link",), io.BytesIO(b"mine"))
    assert not (ws / "link").is_symlink()
    assert (ws / "link").read_bytes() == b"mine"
    assert (outside / "secret").read_bytes() == SECRET


def test_write_from_through_a_symlinked_directory_is_refused(ws: Path, outside: Path) -> None:
    (ws / "dirlink").symlink_to(outside)
    with pytest.raises(PathNotFound):
        workspace.write_from(str(ws), ("dirlink", "secret"), io.BytesIO(b"pwned"))
    assert tree(outside) == ["secret"]
    assert (outside / "secret").read_bytes() == SECRET


# exists and size


def test_exists(ws: Path, outside: Path) -> None:
    (ws / "d").mkdir()
    (ws / "d" / "f").write_bytes(b"x")
    (ws / "link").symlink_to(outside / "secret")
    os.mkfifo(ws / "fifo")
    assert workspace.exists(str(ws), ())
    assert workspace.exists(str(ws), ("d",))
    assert workspace.exists(str(ws), ("d", "f"))
    assert not workspace.exists(str(ws), ("nope",))
    assert not workspace.exists(str(ws), ("nope", "f"))
    assert not workspace.exists(str(ws), ("link",))
    assert not workspace.exists(str(ws), ("fifo",))


def test_size(ws: Path, outside: Path) -> None:
    (ws / "d").mkdir()
    (ws / "d" / "f").write_bytes(b"12345")
    (ws / "link").symlink_to(outside / "secret")
    assert workspace.size(str(ws), ("d", "f")) == 5
    assert workspace.size(str(ws), ()) is None
    assert workspace.size(str(ws), ("d",)) is None
    assert workspace.size(str(ws), ("link",)) is None
    assert workspace.size(str(ws), ("nope",)) is None
    assert workspace.size(str(ws), ("nope", "f")) is None


# walk and disk_usage


def test_walk_lists_regular_files_only(ws: Path, outside: Path) -> None:
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "f").write_bytes(b"123")
    (ws / "top").write_bytes(b"1")
    (ws / "empty").mkdir()
    (ws / "link").symlink_to(outside / "secret")
    (ws / "dirlink").symlink_to(outside)
    os.mkfifo(ws / "fifo")
    (ws / ".sandboxd-upload-0123456789abcdef").write_bytes(b"half an upload")
    (ws / "a" / ".sandboxd-upload-feedfacefeedface").write_bytes(b"half")
    entries = {e.path: e for e in walking.walk(str(ws), ())}
    assert set(entries) == {"/a/b/f", "/top"}
    assert entries["/a/b/f"].size == 3
    assert walking.disk_usage(str(ws)) == 4


def test_walk_from_a_root(ws: Path) -> None:
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "f").write_bytes(b"123")
    (ws / "a" / "g").write_bytes(b"1")
    os.mkfifo(ws / "fifo")
    assert {e.path for e in walking.walk(str(ws), ("a",))} == {"/a/b/f", "/a/g"}
    (only,) = walking.walk(str(ws), ("a", "g"))
    assert (only.path, only.size) == ("/a/g", 1)
    assert walking.walk(str(ws), ("missing",)) == []
    assert walking.walk(str(ws), ("missing", "deeper")) == []
    assert walking.walk(str(ws), ("fifo",)) == []


def test_walk_version_changes_with_content(ws: Path) -> None:
    workspace.write_from(str(ws), ("f",), io.BytesIO(b"aaaa"))
    (first,) = walking.walk(str(ws), ())
    (again,) = walking.walk(str(ws), ())
    assert first == again
    workspace.write_from(str(ws), ("f",), io.BytesIO(b"bbbb"))
    (second,) = walking.walk(str(ws), ())
    assert second.version != first.version
    os.truncate(ws / "f", 2)
    (third,) = walking.walk(str(ws), ())
    assert third.version != second.version


def test_version_of_uses_inode_times_and_size(ws: Path) -> None:
    (ws / "f").write_bytes(b"x")
    st = os.stat(ws / "f")
    parts = walking.version_of(st).split(".")
    assert [int(p, 16) for p in parts] == [st.st_ino, st.st_mtime_ns, st.st_ctime_ns, 1]


def make_deep(root: Path, depth: int) -> None:
    """``root/d/d/.../d/f``, deeper than Python's recursion limit."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


DEPTH = 300


@contextmanager
def shallow_stack(room: int = 100) -> Iterator[None]:
    """Lower the recursion limit to ``room`` frames above the caller: a tree DEPTH deep can
    then only be handled by code that does not recurse per level."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back  # type: ignore[assignment]
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + room)
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)


def test_walk_is_not_limited_by_recursion(ws: Path) -> None:
    make_deep(ws, DEPTH)
    with shallow_stack():
        (entry,) = walking.walk(str(ws), ())
        assert entry.path == "/d" * DEPTH + "/f"
        assert walking.disk_usage(str(ws)) == 0
        trees.remove_tree(str(ws / "d"))
    assert tree(ws) == []


def test_walk_skips_entries_removed_while_it_runs(ws: Path) -> None:
    (ws / "f").write_bytes(b"x")
    for name in ("d1", "d2"):
        (ws / name).mkdir()
        (ws / name / "g").write_bytes(b"y")
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        scan = trees.scan_dirs(fd, "")
        first = next(scan)  # the root's files come before its subdirectories
        assert first[0] == ""
        assert [name for name, _ in first[1]] == ["f"]
        (ws / "d1" / "g").unlink()
        (ws / "d1").rmdir()
        (ws / "d2" / "g").unlink()
        (ws / "d2").rmdir()
        assert list(scan) == []
    finally:
        os.close(fd)


def test_walk_skips_a_file_whose_stat_fails(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (ws / "gone").write_bytes(b"x")
    (ws / "kept").write_bytes(b"y")

    class Entry:
        def __init__(self, entry: os.DirEntry[str]) -> None:
            self._entry = entry
            self.name = entry.name

        def is_dir(self, follow_symlinks: bool = True) -> bool:
            return self._entry.is_dir(follow_symlinks=follow_symlinks)

        def is_file(self, follow_symlinks: bool = True) -> bool:
            return self._entry.is_file(follow_symlinks=follow_symlinks)

        def stat(self, follow_symlinks: bool = True) -> os.stat_result:
            if self.name == "gone":
                raise FileNotFoundError(errno.ENOENT, "removed")
            return self._entry.stat(follow_symlinks=follow_symlinks)

    class Listing:
        def __init__(self, fd: int) -> None:
            self._it = os.scandir(fd)

        def __enter__(self) -> Iterator[Entry]:
            return (Entry(e) for e in self._it)

        def __exit__(self, *exc: object) -> None:
            self._it.close()

    fault_os(monkeypatch, FaultyOs(scandir=lambda real, fd: Listing(fd)))
    assert [e.path for e in walking.walk(str(ws), ())] == ["/kept"]


def test_walk_stops_when_a_directory_is_moved_away(ws: Path, tmp_path: Path) -> None:
    (ws / "a").mkdir()
    (ws / "a" / "f").write_bytes(b"x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        scan = trees.scan_dirs(fd, "")
        path, found = next(scan)
        assert (path, [name for name, _ in found]) == ("/a", ["f"])
        os.rename(ws / "a", elsewhere / "a")  # ".." of the walk's directory is not ws now
        with pytest.raises(OSError) as caught:
            next(scan)
        assert caught.value.errno == errno.ESTALE
    finally:
        os.close(fd)


def test_walk_answers_nothing_when_the_tree_changes_under_it(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "a").mkdir()
    (ws / "a" / "f").write_bytes(b"x")

    def moved(real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if args and args[0] == "..":
            raise OSError(errno.ESTALE, "moved")
        return real(*args, **kwargs)

    assert measure_walk(str(ws), (), 10, 1 << 20) == len(walk_body(str(ws), ()))
    fault_os(monkeypatch, FaultyOs(open=moved))
    assert walking.walk(str(ws), ()) == []
    assert walk_body(str(ws), ()) == b'{"entries": []}'
    assert measure_walk(str(ws), (), 10, 1 << 20) == 0  # as the walk answers: nothing
    assert [e.path for e in walking.walk(str(ws), ("a",))] == ["/a/f"]


# delete, mkdir, rmdir


def test_delete(ws: Path, outside: Path) -> None:
    (ws / "d").mkdir()
    (ws / "d" / "f").write_bytes(b"x")
    (ws / "link").symlink_to(outside / "secret")
    workspace.delete(str(ws), ("d", "f"))
    workspace.delete(str(ws), ("link",))
    assert tree(ws) == ["d"]
    assert (outside / "secret").read_bytes() == SECRET
    with pytest.raises(PathNotFound):
        workspace.delete(str(ws), ("d", "f"))
    with pytest.raises(PathNotFound):
        workspace.delete(str(ws), ("x", "f"))
    with pytest.raises(BadRequest, match="is a directory"):
        workspace.delete(str(ws), ("d",))
    with pytest.raises(BadRequest, match="is a directory"):
        workspace.delete(str(ws), ())
    assert tree(ws) == ["d"]


def test_mkdir(ws: Path, outside: Path) -> None:
    workspace.mkdir(str(ws), ("a", "b", "c"))
    workspace.mkdir(str(ws), ("a", "b", "c"))
    workspace.mkdir(str(ws), ())
    assert tree(ws) == ["a", "a/b", "a/b/c"]
    (ws / "f").write_bytes(b"x")
    (ws / "link").symlink_to(outside)
    with pytest.raises(BadRequest, match="not a directory"):
        workspace.mkdir(str(ws), ("f",))
    with pytest.raises(BadRequest, match="not a directory"):
        workspace.mkdir(str(ws), ("link",))
    with pytest.raises(PathNotFound):
        workspace.mkdir(str(ws), ("f", "sub"))
    with pytest.raises(PathNotFound):
        workspace.mkdir(str(ws), ("link", "sub"))
    assert tree(outside) == ["secret"]


def test_mkdir_tolerates_a_concurrent_mkdir(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def racing(real: Callable[..., Any], name: str, *args: Any, **kwargs: Any) -> Any:
        real(name, *args, **kwargs)  # someone else made it first
        raise FileExistsError(errno.EEXIST, "exists")

    fault_os(monkeypatch, FaultyOs(mkdir=racing))
    workspace.mkdir(str(ws), ("a", "b"))
    assert tree(ws) == ["a", "a/b"]


def test_mkdir_of_an_entry_that_vanishes_is_refused(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault_os(monkeypatch, FaultyOs(mkdir=fail_on("x", FileExistsError(errno.EEXIST, "exists"))))
    with pytest.raises(BadRequest, match="not a directory"):
        workspace.mkdir(str(ws), ("x",))


def test_rmdir(ws: Path, outside: Path) -> None:
    deep = ws / "d" / "e" / "f"
    deep.mkdir(parents=True)
    (deep / "file").write_bytes(b"x")
    (ws / "d" / "link-out").symlink_to(outside)
    (ws / "keep").write_bytes(b"x")
    workspace.rmdir(str(ws), ("d",))
    assert tree(ws) == ["keep"]
    assert tree(outside) == ["secret"]
    with pytest.raises(PathNotFound):
        workspace.rmdir(str(ws), ("d",))
    with pytest.raises(PathNotFound):
        workspace.rmdir(str(ws), ("d", "e"))
    with pytest.raises(BadRequest, match="not a directory"):
        workspace.rmdir(str(ws), ("keep",))
    with pytest.raises(BadRequest, match="root cannot be removed"):
        workspace.rmdir(str(ws), ())
    assert ws.is_dir()


def test_rmdir_of_a_link_to_a_directory_is_refused(ws: Path, outside: Path) -> None:
    (ws / "link").symlink_to(outside)
    with pytest.raises(BadRequest, match="not a directory"):
        workspace.rmdir(str(ws), ("link",))
    assert tree(outside) == ["secret"]


def test_rmdir_is_not_limited_by_recursion(ws: Path) -> None:
    make_deep(ws, DEPTH)
    with shallow_stack():
        workspace.rmdir(str(ws), ("d",))
    assert tree(ws) == []


def test_rmdir_reports_what_it_cannot_remove(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (ws / "d" / "e").mkdir(parents=True)
    (ws / "d" / "e" / "stuck").write_bytes(b"x")
    fault_os(monkeypatch, FaultyOs(unlink=fail_on("stuck", PermissionError(errno.EPERM, "no"))))
    with pytest.raises(BadRequest, match="permission denied"):
        workspace.rmdir(str(ws), ("d",))


def test_rmdir_strict_subdirectory_open_failure(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (ws / "d" / "e").mkdir(parents=True)
    fault_os(monkeypatch, FaultyOs(open=fail_on("e", PermissionError(errno.EACCES, "no"))))
    with pytest.raises(BadRequest, match="permission denied"):
        workspace.rmdir(str(ws), ("d",))


def test_rmdir_strict_rmdir_failure(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (ws / "d" / "e").mkdir(parents=True)
    fault_os(monkeypatch, FaultyOs(rmdir=fail_on("e", OSError(errno.EBUSY, "busy"))))
    with pytest.raises(BadRequest):
        workspace.rmdir(str(ws), ("d",))


def test_rmdir_tolerates_entries_removed_concurrently(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "d" / "e").mkdir(parents=True)
    (ws / "d" / "f").write_bytes(b"x")
    (ws / "d" / "g").mkdir()

    def gone_first(name: str, call: str) -> Callable[..., Any]:
        def fault(real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            if args and args[0] == name:
                if call == "rmdir":
                    real(*args, **kwargs)  # removed by someone else first
                raise FileNotFoundError(errno.ENOENT, "gone")
            return real(*args, **kwargs)

        return fault

    def open_gone(real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if args and args[0] == "g":
            os.rmdir(ws / "d" / "g")
            raise FileNotFoundError(errno.ENOENT, "gone")
        return real(*args, **kwargs)

    def unlink_gone(real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise FileNotFoundError(errno.ENOENT, "gone")

    fault_os(
        monkeypatch,
        FaultyOs(rmdir=gone_first("e", "rmdir"), open=open_gone, unlink=unlink_gone),
    )
    workspace.rmdir(str(ws), ("d",))
    assert tree(ws) == []


def test_removal_stops_when_a_directory_is_swapped(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "d" / "e").mkdir(parents=True)
    decoy = tmp_path / "decoy"
    decoy.mkdir()

    def swapped(real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if args and args[0] == "..":
            return real(str(decoy), os.O_RDONLY | os.O_DIRECTORY)
        return real(*args, **kwargs)

    fault_os(monkeypatch, FaultyOs(open=swapped))
    with pytest.raises(BadRequest):
        workspace.rmdir(str(ws), ("d",))
    assert decoy.is_dir()


# remove_tree (best effort, for a killed sandbox's directory)


def test_remove_tree(tmp_path: Path, outside: Path) -> None:
    top = tmp_path / "sandbox"
    (top / "workspace" / "a").mkdir(parents=True)
    (top / "workspace" / "a" / "f").write_bytes(b"x")
    (top / "workspace" / "out").symlink_to(outside)
    (top / ".ready").write_bytes(b"")
    trees.remove_tree(str(top))
    assert not top.exists()
    assert tree(outside) == ["secret"]
    trees.remove_tree(str(top))  # a missing tree is fine
    trees.remove_tree(str(tmp_path / "no" / "such" / "parent"))


def test_remove_tree_is_best_effort(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    top = tmp_path / "sandbox"
    for name in ("a", "b", "c"):
        (top / name).mkdir(parents=True)
        (top / name / "f").write_bytes(b"x")
    (top / "b" / "stuck").write_bytes(b"x")
    fault_os(
        monkeypatch,
        FaultyOs(
            unlink=fail_on("stuck", PermissionError(errno.EPERM, "no")),
            open=fail_on("c", PermissionError(errno.EACCES, "no")),
            rmdir=fail_on("b", OSError(errno.ENOTEMPTY, "not empty")),
        ),
    )
    trees.remove_tree(str(top))
    monkeypatch.undo()
    assert tree(top) == ["b", "b/stuck", "c", "c/f"]


def test_remove_tree_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rel" / "x").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    trees.remove_tree("rel")
    assert not (tmp_path / "rel").exists()


# rename


def test_rename_moves_and_creates_parents(ws: Path) -> None:
    (ws / "src").write_bytes(b"data")
    workspace.rename(str(ws), ("src",), ("a", "b", "dst"))
    assert tree(ws) == ["a", "a/b", "a/b/dst"]
    assert (ws / "a" / "b" / "dst").read_bytes() == b"data"


def test_rename_replaces_files_and_directories(ws: Path) -> None:
    (ws / "f").write_bytes(b"new")
    (ws / "old").write_bytes(b"old")
    workspace.rename(str(ws), ("f",), ("old",))
    assert (ws / "old").read_bytes() == b"new"
    (ws / "dir" / "sub").mkdir(parents=True)
    (ws / "dir" / "sub" / "x").write_bytes(b"x")
    workspace.rename(str(ws), ("old",), ("dir",))
    assert tree(ws) == ["dir"]
    assert (ws / "dir").read_bytes() == b"new"
    (ws / "d2").mkdir()
    (ws / "d2" / "y").write_bytes(b"y")
    workspace.rename(str(ws), ("d2",), ("dir",))
    assert tree(ws) == ["dir", "dir/y"]


def test_rename_onto_itself_is_a_no_op(ws: Path) -> None:
    (ws / "f").write_bytes(b"x")
    workspace.rename(str(ws), ("f",), ("f",))
    assert (ws / "f").read_bytes() == b"x"


def test_rename_refusals(ws: Path) -> None:
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "f").write_bytes(b"x")
    for source, target in [((), ("x",)), (("a",), ())]:
        with pytest.raises(BadRequest, match="root"):
            workspace.rename(str(ws), source, target)
    with pytest.raises(BadRequest, match="inside"):
        workspace.rename(str(ws), ("a",), ("a", "b", "c"))
    with pytest.raises(BadRequest, match="inside"):
        workspace.rename(str(ws), ("a", "b"), ("a",))
    with pytest.raises(BadRequest, match="inside"):
        workspace.rename(str(ws), ("a", "b", "f"), ("a",))
    assert tree(ws) == ["a", "a/b", "a/b/f"]


def test_rename_missing_source_names_the_source(ws: Path) -> None:
    with pytest.raises(PathNotFound, match=r"^/missing:"):
        workspace.rename(str(ws), ("missing",), ("x",))
    with pytest.raises(PathNotFound, match=r"^/no/such:"):
        workspace.rename(str(ws), ("no", "such"), ("x",))


def test_rename_to_under_a_file_names_the_target(ws: Path) -> None:
    (ws / "f").write_bytes(b"x")
    (ws / "g").write_bytes(b"y")
    with pytest.raises(PathNotFound, match=r"^/g/h:"):
        workspace.rename(str(ws), ("f",), ("g", "h"))
    assert tree(ws) == ["f", "g"]


def test_rename_never_follows_links(ws: Path, outside: Path) -> None:
    (ws / "mine").write_bytes(b"mine")
    (ws / "dirlink").symlink_to(outside)
    (ws / "filelink").symlink_to(outside / "secret")
    with pytest.raises(PathNotFound):
        workspace.rename(str(ws), ("mine",), ("dirlink", "secret"))
    with pytest.raises(PathNotFound):
        workspace.rename(str(ws), ("dirlink", "secret"), ("stolen",))
    workspace.rename(str(ws), ("mine",), ("filelink",))
    assert (ws / "filelink").read_bytes() == b"mine"
    assert tree(outside) == ["secret"]
    assert (outside / "secret").read_bytes() == SECRET


# The walk's JSON body


def walk_body(ws: str, root: tuple[str, ...]) -> bytes:
    return wire.walk_body(walking.walk_map(ws, root, wire.walk_entries))


@pytest.mark.parametrize("root", [(), ("d",), ("d", "f"), ("missing",)])
def test_walk_body_is_json_dumps_of_walk(ws: Path, root: tuple[str, ...]) -> None:
    (ws / "d").mkdir()
    names = ["plain", 'quo"te', "back\\slash", "tab\tnew\nline", "é ü 中", "\x01ctl", "emoji 🎉"]
    for name in names:
        (ws / "d" / name).write_bytes(name.encode())
    (ws / "d" / "f").write_bytes(b"f")
    os.close(os.open(os.path.join(os.fsencode(ws), b"d", b"bad-\xff-utf8"), os.O_CREAT, 0o644))
    entries = [
        {"path": e.path, "size": e.size, "version": e.version} for e in walking.walk(str(ws), root)
    ]
    body = walk_body(str(ws), root)
    assert body == json.dumps({"entries": entries}).encode()
    assert json.loads(body) == {"entries": entries}


# Uploads from twisted.web's temporary body file: copied with sendfile


@pytest.fixture
def body_file() -> Iterator[Any]:
    with tempfile.TemporaryFile() as f:
        f.write(b"header-to-skip")
        f.write(bytes(range(256)) * 1000)
        f.seek(len(b"header-to-skip"))
        yield f


def test_write_from_a_file_uses_its_remaining_bytes(ws: Path, body_file: Any) -> None:
    workspace.write_from(str(ws), ("f",), body_file)
    assert (ws / "f").read_bytes() == bytes(range(256)) * 1000


def sendfile_fails(code: int, after: int = 0) -> Callable[..., Any]:
    calls = {"n": 0}

    def fault(real: Callable[..., Any], out_fd: int, in_fd: int, offset: int, count: int) -> int:
        calls["n"] += 1
        if calls["n"] > after:
            raise OSError(code, os.strerror(code))
        return int(real(out_fd, in_fd, offset, min(count, 1000)))

    return fault


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOSYS])
def test_write_from_falls_back_when_sendfile_cannot(
    ws: Path, body_file: Any, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    fault_os(monkeypatch, FaultyOs(sendfile=sendfile_fails(code)))
    workspace.write_from(str(ws), ("f",), body_file)
    monkeypatch.undo()
    assert (ws / "f").read_bytes() == bytes(range(256)) * 1000


def test_write_from_never_falls_back_half_way(
    ws: Path, body_file: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault_os(monkeypatch, FaultyOs(sendfile=sendfile_fails(errno.EINVAL, 3)))
    with pytest.raises(BadRequest):
        workspace.write_from(str(ws), ("f",), body_file)
    monkeypatch.undo()
    assert tree(ws) == []


def test_write_from_a_file_on_a_full_disk_is_507(
    ws: Path, body_file: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault_os(monkeypatch, FaultyOs(sendfile=sendfile_fails(errno.ENOSPC, 2)))
    with pytest.raises(InsufficientStorage):
        workspace.write_from(str(ws), ("d", "f"), body_file)
    monkeypatch.undo()
    assert tree(ws) == ["d"]


# Uploads spooled in an unnamed file on the workspace's filesystem: linked into place


BODY = bytes(range(256)) * 1000


def spooled(directory: Path, data: bytes = BODY) -> Any:
    """A complete body in an unnamed file (``O_TMPFILE``) of ``directory``, as twisted.web
    leaves it (the offset at the end, some bytes still in the buffer)."""
    spool = Spool(str(directory))
    spool.write(data)
    spool.write(b"!")  # smaller than the buffer: still in it
    spool.seek(0)
    return spool


def test_a_spooled_body_is_linked_into_place_not_copied(ws: Path, tmp_path: Path) -> None:
    (ws / "d").mkdir()
    (ws / "d" / "f").write_bytes(b"old")
    with spooled(tmp_path) as spool:
        workspace.write_from(str(ws), ("d", "f"), spool, linkable=True)
        st = os.fstat(spool.fileno())
    assert (ws / "d" / "f").read_bytes() == BODY + b"!"
    assert (ws / "d" / "f").stat().st_ino == st.st_ino  # the very file the body was spooled to
    assert st.st_nlink == 1
    assert tree(ws) == ["d", "d/f"]


def test_a_spooled_body_on_another_filesystem_is_copied(ws: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(ws).st_dev:
        pytest.skip("needs /dev/shm on a filesystem of its own")
    with spooled(shm) as spool:
        workspace.write_from(str(ws), ("f",), spool, linkable=True)
        assert (ws / "f").stat().st_ino != os.fstat(spool.fileno()).st_ino
    assert (ws / "f").read_bytes() == BODY + b"!"
    assert tree(ws) == ["f"]


def test_a_linked_body_whose_rename_fails_leaves_nothing(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_rename(real: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "full")

    (ws / "f").write_bytes(b"old")
    fault_os(monkeypatch, FaultyOs(rename=no_rename))
    with spooled(tmp_path) as spool, pytest.raises(InsufficientStorage):
        workspace.write_from(str(ws), ("f",), spool, linkable=True)
    monkeypatch.undo()
    assert tree(ws) == ["f"]
    assert (ws / "f").read_bytes() == b"old"


# Walk bounds: SANDBOXD_WALK_MAX and PATH_MAX


def test_a_walk_past_its_limit_raises_naming_it(ws: Path) -> None:
    for n in range(5):
        (ws / f"f{n}").write_bytes(b"")
    assert len(walking.walk_map(str(ws), (), wire.walk_entries, limit=5)) == 5
    with pytest.raises(TooManyEntries, match=r"more than 4 files \(SANDBOXD_WALK_MAX\)"):
        walking.walk_map(str(ws), (), wire.walk_entries, limit=4)


def test_a_directory_of_long_paths_is_walked_a_slice_at_a_time(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / ("d" * 200)).mkdir()
    for n in range(5):
        (ws / ("d" * 200) / f"f{n}").write_bytes(b"")
    monkeypatch.setattr(walking, "BATCH_CHARS", 2 * (201 + walking.NAME_MAX))
    batches = list(walking.walk_batches(str(ws), (), wire.walk_entries))
    assert [len(b) for b in batches] == [2, 2, 1]
    assert wire.walk_body([e for b in batches for e in b]) == walk_body(str(ws), ())


def test_the_walk_size_is_the_length_of_its_body() -> None:
    for batches in ([], [["a"]], [["a", "bb"], ["ccc"]]):
        body = wire.walk_body([e for b in batches for e in b])
        assert wire.walk_size(iter(batches), len(body)) == len(body)
        if batches:
            with pytest.raises(TooManyEntries, match=f"passes {len(body) - 1} bytes"):
                wire.walk_size(iter(batches), len(body) - 1)
