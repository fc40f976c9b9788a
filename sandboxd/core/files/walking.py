"""Listing every regular file under a path of a workspace (the walk), in bounded batches.

Like :mod:`~sandboxd.core.files.workspace`, every function here runs in a worker thread under
the sandbox's own filesystem credentials, and goes from the workspace root one directory
descriptor at a time, never following a link.
"""

import os
import stat
from collections.abc import Callable, Iterator
from typing import TypeVar

from attrs import frozen

from sandboxd.core.files.paths import Parts, display
from sandboxd.core.files.tree import DirFiles, opened_dir, scan_dirs
from sandboxd.core.files.workspace import DIR_FLAGS, lstat, parent_of
from sandboxd.errors import TooManyEntries

T = TypeVar("T")


@frozen
class WalkEntry:
    """One regular file: ``/``-rooted path, size, and a version that changes with content."""

    path: str
    size: int
    version: str


def version_of(st: os.stat_result) -> str:
    """Inode, mtime, ctime and size: any write, replace or rename changes at least one."""
    return f"{st.st_ino:x}.{st.st_mtime_ns:x}.{st.st_ctime_ns:x}.{st.st_size:x}"


def walk_dirs(workspace: str, parts: Parts) -> Iterator[DirFiles]:
    """:func:`~sandboxd.core.files.tree.scan_dirs` of the path, as it goes: directories with
    their files. A regular file at the path is one directory of one file; anything else is
    none. ``OSError`` for a path that cannot be walked, or a tree that changed under the walk
    (see :func:`~sandboxd.core.files.tree.climb`).

    Each directory's stats are dropped once the caller is done with them: a walk of many files
    keeps no stat object per file alive (that many tracked objects also cost garbage
    collections that grow with the walk).
    """
    with parent_of(workspace, parts) as parent:
        if not parts:
            yield from scan_dirs(parent, "")
            return
        st = lstat(parent, parts[-1])
        if st is None:
            return
        if stat.S_ISREG(st.st_mode):
            yield "".join(f"/{p}" for p in parts[:-1]), [(parts[-1], st)]
        elif stat.S_ISDIR(st.st_mode):
            with opened_dir(os.open(parts[-1], DIR_FLAGS, dir_fd=parent)) as top:
                yield from scan_dirs(top, display(parts))


def walk(workspace: str, parts: Parts) -> list[WalkEntry]:
    """Every regular file under the path (none when it is missing, or on any error)."""
    try:
        return [
            WalkEntry(f"{path}/{name}", st.st_size, version_of(st))
            for path, found in walk_dirs(workspace, parts)
            for name, st in found
        ]
    except OSError:
        return []


def walk_map(
    workspace: str,
    parts: Parts,
    each_dir: Callable[[str, list[tuple[str, os.stat_result]]], list[T]],
    limit: int | None = None,
) -> list[T]:
    """``each_dir(path, [(name, stat)...])`` for each directory holding regular files under
    the path (``path`` ``/``-rooted, ``""`` for the workspace root), one directory at a time,
    its results joined: nothing when the path is missing, or on any error (a walk can list
    hundreds of thousands of files: no object per entry is kept, only what ``each_dir`` gives).

    Bounded as :func:`walk_batches` is.
    """
    results: list[T] = []
    try:
        for batch in walk_batches(workspace, parts, each_dir, limit):
            results += batch
    except OSError:
        return []
    return results


BATCH_CHARS = 1 << 20
"""Characters of paths one batch of :func:`walk_batches` holds at most (about)."""

NAME_MAX = 256
"""The longest file name, and its ``/``."""


def walk_batches(
    workspace: str,
    parts: Parts,
    each_dir: Callable[[str, list[tuple[str, os.stat_result]]], list[T]],
    limit: int | None = None,
) -> Iterator[list[T]]:
    """``each_dir``'s results, one directory at a time, as the walk goes (``OSError`` as
    :func:`walk_dirs` raises it). The generator may be resumed from any file thread.

    Paths of any length are listed (a tree deeper than ``PATH_MAX`` too: the walk goes one
    directory at a time). More than ``limit`` files raise
    :class:`~sandboxd.errors.TooManyEntries` naming the limit, as soon as the walk finds one
    more. A directory of many files deep in a tree of long names is given to ``each_dir`` a
    slice at a time, about :data:`BATCH_CHARS` characters of paths each: what one call makes
    stays bounded however long the paths.
    """
    count = 0
    for path, found in walk_dirs(workspace, parts):
        count += len(found)
        if limit is not None and count > limit:
            raise TooManyEntries(
                f"the walk lists more than {limit} files (SANDBOXD_WALK_MAX): walk a narrower root"
            )
        step = max(1, BATCH_CHARS // (len(path) + NAME_MAX))
        for first in range(0, len(found), step):
            yield each_dir(path, found[first : first + step])


def disk_usage(workspace: str) -> int:
    """Total bytes of the regular files in the workspace."""
    with opened_dir(os.open(workspace, DIR_FLAGS)) as root:
        return sum(st.st_size for _, found in scan_dirs(root, "") for _, st in found)
