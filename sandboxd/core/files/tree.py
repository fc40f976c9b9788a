"""Directory trees walked and removed without recursion and without following a link.

A sandbox can nest directories far beyond ``PATH_MAX`` and Python's recursion limit: these
walks hold two descriptors at most and go back up through ``..`` only to the very directory
they came down from (:func:`climb`).
"""

import errno
import os
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager, suppress
from typing import TypeVar

T = TypeVar("T")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
UPLOAD_PREFIX = ".sandboxd-upload-"
"""Uploads in progress (unfinished files a walk never lists)."""

DirFiles = tuple[str, list[tuple[str, os.stat_result]]]
"""One directory of a walk: its ``/``-rooted path (``""`` for the top), and the name and
lstat of each regular file in it."""


@contextmanager
def opened_dir(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def climb(fd: int, expected: tuple[int, int]) -> int:
    """The parent of directory ``fd`` (``fd`` is closed), checked to be the one we came from.

    Trees are walked without recursion and with one descriptor at a time, however deep they
    are (a sandbox can nest directories far beyond ``PATH_MAX``). Going back up through ``..``
    is safe because the parent must be the very directory (device and inode) the walk came
    down from; else the walk stops.
    """
    try:
        up = os.open("..", _DIR_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    if identity(up) != expected:
        os.close(up)
        raise OSError(errno.ESTALE, "a directory was moved while the tree was walked")
    return up


def depth_first(
    top: int,
    prefix: str,
    visit: Callable[[int, str], Generator[T, None, list[str]]],
    below: Callable[[str, str], str],
) -> Iterator[T]:
    """Every directory below the directory ``top`` (a descriptor the caller keeps), depth first:
    ``visit(fd, prefix)`` yields what the walk yields for one directory and returns the names
    of its subdirectories to enter, in the order to enter them; ``below(prefix, name)`` is a
    subdirectory's prefix, which starts with ``prefix``. A subdirectory that cannot be
    entered (removed, swapped for a link) is passed over; links are never followed.

    Iterative (see :func:`climb`): no recursion limit, and two descriptors at most. A
    subdirectory's prefix extends its parent's, so one prefix is kept, the current one, and
    each frame keeps its length: memory grows with the deepest path, not with the sum of the
    prefixes of every level (a deep tree of long names would hold its depth squared).
    """
    fd = os.dup(top)
    # One frame per directory from ``top`` down to ``fd``: its prefix's length, its identity,
    # and the subdirectories still to visit. ``prefix`` is the last frame's.
    stack: list[tuple[int, tuple[int, int], list[str]]] = []
    try:
        while True:
            subdirs = yield from visit(fd, prefix)
            subdirs.reverse()  # taken with pop(): visited in the order given
            stack.append((len(prefix), identity(fd), subdirs))
            while True:
                pending = stack[-1][2]
                if pending:
                    name = pending.pop()
                    try:
                        child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                    except OSError:
                        continue  # removed or swapped while walking
                    os.close(fd)
                    fd, prefix = child, below(prefix, name)
                    break
                stack.pop()
                if not stack:
                    return
                prefix = prefix[: stack[-1][0]]
                up, fd = fd, -1
                fd = climb(up, stack[-1][1])
    finally:
        if fd >= 0:
            os.close(fd)


def _regular_files(fd: int, path: str) -> Generator[DirFiles, None, list[str]]:
    """One directory of :func:`scan_dirs`: its regular files, if any; its subdirectories."""
    found: list[tuple[str, os.stat_result]] = []
    subdirs: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            name = entry.name
            if name.startswith(UPLOAD_PREFIX):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(name)
                elif entry.is_file(follow_symlinks=False):
                    found.append((name, entry.stat(follow_symlinks=False)))
            except OSError:
                continue  # removed or swapped while walking: not a file under root
    if found:
        yield path, found
    return subdirs


def scan_dirs(dir_fd: int, prefix: str) -> Iterator[DirFiles]:
    """The regular files below ``dir_fd``, one directory at a time: its ``/``-rooted path
    and its files' (name, lstat), for each directory that has any. Links are not followed.
    A directory's files come before its subdirectories, which are visited in listing order
    (:func:`depth_first`)."""
    return depth_first(dir_fd, prefix, _regular_files, lambda path, name: f"{path}/{name}")


def remove_dir(parent: int, name: str, strict: bool = True) -> None:
    """``rm -rf`` of the directory ``name`` in ``parent``: no symlink is followed, and no
    recursion (see :func:`climb`), so any depth is removed.

    Not ``strict``: an entry that cannot be removed is left and the rest still goes.
    """
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    # One frame per directory from ``name`` down to ``fd``: its name, its identity, and the
    # subdirectories still to empty and remove.
    stack: list[tuple[str, tuple[int, int], list[str]]] = []
    current = name
    try:
        while True:
            subdirs: list[str] = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            subdirs.append(entry.name)
                        else:
                            os.unlink(entry.name, dir_fd=fd)
                    except FileNotFoundError:
                        continue
                    except OSError:
                        if strict:
                            raise
            stack.append((current, identity(fd), subdirs))
            while True:
                done, _, pending = stack[-1]
                if pending:
                    current = pending.pop()
                    try:
                        child = os.open(current, _DIR_FLAGS, dir_fd=fd)
                    except FileNotFoundError:
                        continue
                    except OSError:
                        if strict:
                            raise
                        continue
                    os.close(fd)
                    fd = child
                    break
                stack.pop()
                below, fd = fd, -1
                if not stack:
                    os.close(below)
                    _rmdir(parent, done, strict)
                    return
                fd = climb(below, stack[-1][1])
                _rmdir(fd, done, strict)
    finally:
        if fd >= 0:
            os.close(fd)


def _rmdir(parent: int, name: str, strict: bool) -> None:
    try:
        os.rmdir(name, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError:
        if strict:
            raise


def remove_tree(path: str) -> None:
    """Remove the directory ``path`` and everything in it, best effort (what cannot be
    removed is left), at any depth and without following symlinks. A missing path is fine.
    """
    head, name = os.path.split(os.path.normpath(path))
    with suppress(OSError), opened_dir(os.open(head or ".", _DIR_FLAGS)) as parent:
        remove_dir(parent, name, strict=False)
