"""A workspace tree packed as a tar stream, a part at a time (``GET /sandboxes/{rid}/tree``).

:func:`pack` is a generator of parts of about :data:`PART` bytes: each is made in a file
thread under the sandbox's filesystem credentials, and the next only once the client took the
last (:class:`Stepper`), so a tree of any size holds one part in memory and no thread while
the client is slow. The headers are :mod:`tarfile`'s (``TarInfo.tobuf``, ustar with pax
where needed); a member's data is copied a chunk at a time, as ``w|`` would write it.

The tree is walked as :mod:`sandboxd.core.files.tree` walks: without recursion, without
following a link, going back up only to the very directory it came down from. Members:
directories (empty ones too), regular files and symlinks (as links), with mode and mtime;
FIFOs, sockets and devices are left out, and so is a file with several links that the
sandbox does not own (a hard link to something from outside, as a download refuses it).
"""

import os
import stat
import tarfile
import threading
from collections.abc import Generator, Iterator

from sandboxd.core.files.paths import Parts, display
from sandboxd.core.files.tree import UPLOAD_PREFIX, depth_first
from sandboxd.core.files.workspace import lstat, parent_of, translate
from sandboxd.errors import BadRequest

PART = 1 << 20
"""Bytes of the stream made at a time."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_BLOCK = tarfile.BLOCKSIZE


def _info(name: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    return info


def _header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


class _Parts:
    """The stream being made: bytes gathered until a part is full."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def full(self) -> bool:
        return len(self.buffer) >= PART

    def take(self) -> bytes:
        part, self.buffer = bytes(self.buffer), bytearray()
        return part


def _file(parts: _Parts, dir_fd: int, name: str, path: str, owner: int) -> Iterator[bytes]:
    """One regular file's member: its header, then its data a chunk at a time (exactly the
    size the header gives, however the file changes meanwhile)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return  # removed or swapped since it was listed
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_nlink > 1 and st.st_uid != owner):
            return
        info = _info(path, st, tarfile.REGTYPE)
        info.size = left = st.st_size
        parts.buffer += _header(info)
        while left > 0:
            chunk = os.read(fd, min(left, PART))
            if not chunk:
                chunk = bytes(min(left, PART))  # it shrank: the promised length, in zeros
            parts.buffer += chunk
            left -= len(chunk)
            if parts.full():
                yield parts.take()
        parts.buffer += bytes(-st.st_size % _BLOCK)
    finally:
        os.close(fd)


def _entry(
    parts: _Parts, dir_fd: int, name: str, path: str, owner: int, subdirs: list[str]
) -> Iterator[bytes]:
    """The member of one directory entry (a directory's also goes to ``subdirs``)."""
    st = lstat(dir_fd, name)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        parts.buffer += _header(_info(path, st, tarfile.DIRTYPE))
        subdirs.append(name)
    elif stat.S_ISLNK(st.st_mode):
        info = _info(path, st, tarfile.SYMTYPE)
        try:
            info.linkname = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            return
        parts.buffer += _header(info)
    elif stat.S_ISREG(st.st_mode):
        yield from _file(parts, dir_fd, name, path, owner)


def _tree(parts: _Parts, top: int, owner: int) -> Iterator[bytes]:
    """Every member below the directory ``top``, named relative to it, each directory's in
    name order (:func:`~sandboxd.core.files.tree.depth_first`)."""

    def members(fd: int, prefix: str) -> Generator[bytes, None, list[str]]:
        with os.scandir(fd) as entries:
            names = sorted(e.name for e in entries if not e.name.startswith(UPLOAD_PREFIX))
        subdirs: list[str] = []
        for name in names:
            yield from _entry(parts, fd, name, prefix + name, owner, subdirs)
            if parts.full():
                yield parts.take()
        return subdirs

    return depth_first(top, "", members, lambda path, name: f"{path}{name}/")


def pack(workspace: str, target: Parts, owner: int) -> Generator[bytes, None, None]:
    """The tar stream of ``target``: a directory's members named relative to it, or a file or
    symlink as one member of its own name. ``404`` for a missing path, before any part."""
    parts = _Parts()
    try:
        with parent_of(workspace, target) as parent:
            if not target:
                st: os.stat_result | None = os.fstat(parent)
            else:
                st = lstat(parent, target[-1])
            if st is None:
                raise FileNotFoundError(2, "missing")
            if stat.S_ISDIR(st.st_mode):
                top = parent if not target else os.open(target[-1], _DIR_FLAGS, dir_fd=parent)
                try:
                    yield from _tree(parts, top, owner)
                finally:
                    if top != parent:
                        os.close(top)
            elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                yield from _entry(parts, parent, target[-1], target[-1], owner, [])
            else:
                raise BadRequest(f"{display(target)}: not a file, directory or symlink")
    except OSError as e:
        raise translate(e, target) from None
    parts.buffer += bytes(2 * _BLOCK)
    parts.buffer += bytes(-len(parts.buffer) % tarfile.RECORDSIZE)
    yield parts.take()


class Stepper:
    """Steps a :func:`pack` generator from any file thread, one step at a time; :meth:`close`
    may come from another thread meanwhile (the generator is then closed by that step)."""

    def __init__(self, parts: Generator[bytes, None, None]) -> None:
        self._parts = parts
        self._lock = threading.Lock()
        self._closing = False

    def step(self) -> bytes | None:
        """The next part, or ``None`` at the end (or once closed)."""
        with self._lock:
            if self._closing:
                return None
            try:
                return next(self._parts, None)
            finally:
                if self._closing:
                    self._parts.close()

    def close(self) -> None:
        """Close the generator now, or as soon as the step running ends."""
        self._closing = True
        if self._lock.acquire(blocking=False):
            try:
                self._parts.close()
            finally:
                self._lock.release()
