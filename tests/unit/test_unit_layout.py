"""The on-disk layout of a sandbox (``sandboxd.core.layout``), ``chown`` injected."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.core.layout import RID_PATTERN, SUBDIRS, Layout, RootInUse
from sandboxd.isolation.base import Identity

RID = "0123456789abcdef"
IDENTITY = Identity(uid=200123, gid=200123)


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def chowns() -> list[tuple[str, int, int]]:
    return []


@pytest.fixture
def searchable() -> Iterator[Path]:
    """A directory every ancestor of which sandbox uids may pass (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="sandboxd-layout-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def layout(searchable: Path, chowns: list[tuple[str, int, int]]) -> Layout:
    def chown(path: str, uid: int, gid: int) -> None:
        chowns.append((path, uid, gid))

    return Layout(str(searchable / "root"), owns_files=True, chown=chown)


@pytest.fixture
def umask_077() -> Iterator[None]:
    previous = os.umask(0o077)
    yield
    os.umask(previous)


def test_paths(layout: Layout) -> None:
    top = os.path.join(layout.root, RID)
    assert layout.directory(RID) == top
    assert layout.workspace(RID) == os.path.join(top, "workspace")
    assert layout.home(RID) == os.path.join(top, "home")
    assert layout.tmp(RID) == os.path.join(top, "tmp")
    assert layout.ready_marker(RID) == os.path.join(top, ".ready")


def test_prepare_root(layout: Layout, umask_077: None) -> None:
    layout.prepare_root()
    assert mode(layout.root) == 0o711
    layout.prepare_root()  # already there: fine


def test_prepare_root_refuses_an_ancestor_sandboxes_cannot_pass(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    layout = Layout(str(closed / "root"), owns_files=True)
    with pytest.raises(PermissionError, match=f"^{closed} is not searchable"):
        layout.prepare_root()


def test_prepare_root_without_owning_files(tmp_path: Path) -> None:
    layout = Layout(str(tmp_path / "a" / "root"), owns_files=False)
    layout.prepare_root()
    assert os.path.isdir(layout.root)


def test_create_gives_the_sandbox_its_directories(
    layout: Layout, chowns: list[tuple[str, int, int]], umask_077: None
) -> None:
    layout.prepare_root()
    layout.create(RID, IDENTITY)
    top = layout.directory(RID)
    assert sorted(os.listdir(top)) == sorted(SUBDIRS)
    assert mode(top) == 0o710
    for name in SUBDIRS:
        assert mode(os.path.join(top, name)) == 0o700
    assert chowns == [
        (top, 0, IDENTITY.gid),
        *[(os.path.join(top, name), IDENTITY.uid, IDENTITY.gid) for name in SUBDIRS],
    ]


def test_create_as_the_daemons_own_user_chowns_nothing(tmp_path: Path) -> None:
    def chown(path: str, uid: int, gid: int) -> None:
        raise AssertionError("no chown without owns_files")

    layout = Layout(str(tmp_path), owns_files=False, chown=chown)
    layout.create(RID, IDENTITY)
    assert sorted(os.listdir(layout.directory(RID))) == sorted(SUBDIRS)


def test_create_twice_fails(layout: Layout) -> None:
    layout.prepare_root()
    layout.create(RID, IDENTITY)
    with pytest.raises(FileExistsError):
        layout.create(RID, IDENTITY)


def test_ready_marker(layout: Layout) -> None:
    layout.prepare_root()
    layout.create(RID, IDENTITY)
    assert not layout.is_ready(RID)
    layout.mark_ready(RID)
    layout.mark_ready(RID)
    assert layout.is_ready(RID)
    assert os.listdir(layout.workspace(RID)) == []


def test_a_symlinked_marker_is_not_ready(layout: Layout, searchable: Path) -> None:
    layout.prepare_root()
    layout.create(RID, IDENTITY)
    target = searchable / "elsewhere"
    target.write_bytes(b"")
    os.symlink(target, layout.ready_marker(RID))
    assert not layout.is_ready(RID)
    with pytest.raises(OSError):
        layout.mark_ready(RID)


def test_destroy(layout: Layout) -> None:
    layout.prepare_root()
    layout.create(RID, IDENTITY)
    layout.mark_ready(RID)
    Path(layout.workspace(RID), "f").write_bytes(b"x")
    layout.destroy(RID)
    assert not os.path.exists(layout.directory(RID))
    layout.destroy(RID)  # nothing left: fine


def test_leftovers(layout: Layout) -> None:
    assert layout.leftovers() == []  # no root yet
    layout.prepare_root()
    others = ["fedcba9876543210", RID]
    for name in [*others, "not-a-rid", "0123456789ABCDEF", "0123456789abcde", ".ready"]:
        os.mkdir(os.path.join(layout.root, name))
    assert layout.leftovers() == sorted(others)
    assert all(RID_PATTERN.match(rid) for rid in layout.leftovers())


def test_one_daemon_per_root(layout: Layout) -> None:
    layout.prepare_root()
    held = layout.lock()
    try:
        with pytest.raises(RootInUse, match="another sandboxd"):
            layout.lock()
    finally:
        os.close(held)
    os.close(layout.lock())  # released with its descriptor
