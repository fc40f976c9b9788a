"""Entries of a sandbox's tree as plain values: one path's stat, a directory's listing.

Like :mod:`~sandboxd.core.files.workspace`, these run in a worker thread with the sandbox's
filesystem credentials and walk from the root without following a symlink (a symlink is
reported as one, with its target, never entered).
"""

import errno
import os
import stat

from attrs import define, field, frozen

from sandboxd.core.files.paths import Parts
from sandboxd.core.files.tree import UPLOAD_PREFIX, opened_dir, remove_dir
from sandboxd.core.files.workspace import make_directory, parent_of, translate
from sandboxd.errors import TooManyEntries

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

ENTRIES_MAX = 100_000
"""Entries one listing gives at most (a deeper listing stops there)."""

LISTING_BYTES_MAX = 16 << 20
"""About the most bytes the answer of one listing may take (``TooManyEntries`` past it):
each entry repeats its whole path, so a deep tree of long names would answer thousands of
times its own size (docs/e2b.rst, "Coverage")."""

ENTRY_BYTES = 256
"""What an entry of a listing takes beyond its name, its path and its link's target (the
other fields of an ``EntryInfo`` and the path's area, ``/home/user``), rounded up."""


@frozen
class Entry:
    """One entry: its path components under the root, kind (``file``, ``dir``, ``symlink``,
    ``other``), size, mode bits, owner and group ids, modification time (ns), link target."""

    parts: Parts
    kind: str
    size: int
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    target: str | None = None


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def _entry(dir_fd: int, name: str, parts: Parts) -> Entry:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    target = None
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(name, dir_fd=dir_fd)
    return Entry(
        parts,
        _kind(st.st_mode),
        st.st_size,
        st.st_mode,
        st.st_uid,
        st.st_gid,
        st.st_mtime_ns,
        target,
    )


def stat_entry(root: str, parts: Parts) -> Entry:
    """The entry at the path (``PathNotFound`` when there is none)."""
    try:
        with parent_of(root, parts) as parent:
            if not parts:
                return _entry(parent, ".", parts)
            return _entry(parent, parts[-1], parts)
    except OSError as e:
        raise translate(e, parts) from None


def list_dir(root: str, parts: Parts, depth: int) -> list[Entry]:
    """The entries of the directory, and of its subdirectories down to ``depth`` levels
    (1: its own entries), at most :data:`ENTRIES_MAX`; ``PathNotFound`` when it is missing,
    ``BadRequest`` when it is not a directory, ``TooManyEntries`` once the answer would pass
    :data:`LISTING_BYTES_MAX` (counted as the listing goes, before it holds more)."""
    listing = _Listing(len("/".join(parts)), LISTING_BYTES_MAX)
    try:
        with parent_of(root, parts) as parent:
            top = os.open(parts[-1] if parts else ".", _DIR_FLAGS, dir_fd=parent)
        with opened_dir(top) as fd:
            _list_into(fd, parts, max(depth, 1), listing, listing.shown)
    except OSError as e:
        raise translate(e, parts) from None
    return listing.found


@define
class _Listing:
    """A listing as it is made: its entries, and the bytes its answer would take."""

    shown: int
    """The length of the listed directory's path."""
    most: int
    found: list[Entry] = field(factory=list)
    size: int = 0

    def add(self, entry: Entry, path_length: int) -> None:
        self.size += ENTRY_BYTES + len(entry.parts[-1]) + path_length + len(entry.target or "")
        if self.size > self.most:
            raise TooManyEntries(
                f"the listing passes {self.most} bytes (each entry repeats its path):"
                " list a narrower path or fewer levels"
            )
        self.found.append(entry)


def _list_into(fd: int, parts: Parts, depth: int, listing: _Listing, shown: int) -> None:
    """Add the entries of the directory ``fd`` at ``parts`` (its path ``shown`` characters
    long) and of its subdirectories down to ``depth`` levels."""
    with os.scandir(fd) as scan:
        names = sorted(e.name for e in scan if not e.name.startswith(UPLOAD_PREFIX))
    for name in names:
        if len(listing.found) >= ENTRIES_MAX:
            return
        try:
            entry = _entry(fd, name, (*parts, name))
        except FileNotFoundError:
            continue  # removed meanwhile
        path_length = shown + 1 + len(name)
        listing.add(entry, path_length)
        if entry.kind == "dir" and depth > 1:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # swapped or unreadable meanwhile: not entered
            with opened_dir(child) as child_fd:
                _list_into(child_fd, (*parts, name), depth - 1, listing, path_length)


def make_dir(root: str, parts: Parts) -> bool:
    """Create the directory and its parents; ``False`` when it was there already."""
    try:
        with parent_of(root, parts, create=True) as parent:
            if not parts:
                return False
            try:
                make_directory(parent, parts[-1])
            except FileExistsError:
                return False
    except OSError as e:
        raise translate(e, parts) from None
    return True


def remove(root: str, parts: Parts) -> None:
    """Remove the file, link or directory (with what it holds) at the path."""
    try:
        with parent_of(root, parts) as parent:
            if not parts:
                raise OSError(errno.EBUSY, "the root cannot be removed")
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                remove_dir(parent, parts[-1])
            else:
                os.unlink(parts[-1], dir_fd=parent)
    except OSError as e:
        raise translate(e, parts) from None
