"""
Local directory trees as tar streams, and tar streams unpacked into local directories: what
``HttpSandbox.upload_tree``/``download_tree`` send and receive (the ``files.tree`` extension).

:func:`pack` makes the stream a part at a time (tar headers from :mod:`tarfile`, each file's
data a chunk at a time, as ``w|`` writes them), so a tree of any size holds one part in memory.
:func:`unpack` reads a stream with :mod:`tarfile` in stream mode (``r|``) and refuses what could
land outside the destination, naming the member (``ValueError``): absolute names, ``..``,
hard links, devices and FIFOs, and any member whose way goes through a symlink (an archive can
hold a link to ``/etc`` and then a file ``link/passwd``: it is refused, never followed).
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import tarfile
from collections.abc import Iterator
from contextlib import suppress
from typing import IO

PART = 1 << 20
"""Bytes of a stream made, and of a member's data copied, at a time."""

MODE_BITS = 0o777
"""The permission bits a member keeps (no set-uid, set-gid or sticky bit)."""

_BLOCK = tarfile.BLOCKSIZE
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _header(name: str, st: os.stat_result, kind: bytes, size: int = 0, link: str = "") -> bytes:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    info.size = size
    info.linkname = link
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _file(path: str, name: str, buffer: bytearray) -> Iterator[bytes]:
    """A regular file's member: exactly the size its header gives, however it changes."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        buffer += _header(name, st, tarfile.REGTYPE, st.st_size)
        left = st.st_size
        while left > 0:
            chunk = f.read(min(left, PART)) or bytes(min(left, PART))  # shrank: zeros
            buffer += chunk
            left -= len(chunk)
            if len(buffer) >= PART:
                yield bytes(buffer)
                buffer.clear()
    buffer += bytes(-st.st_size % _BLOCK)


def pack(root: str) -> Iterator[bytes]:
    """The tar stream of the local directory ``root``: its members named relative to it
    (directories, empty ones too; regular files; symlinks as links), with permission bits and
    mtime, in parts of about :data:`PART` bytes. Sockets, FIFOs and devices are left out."""
    buffer = bytearray()
    pending = [""]
    while pending:
        prefix = pending.pop()
        top = os.path.join(root, prefix)
        with os.scandir(top) as entries:
            names = sorted(e.name for e in entries)
        subdirs = []
        for name in names:
            path, member = os.path.join(top, name), prefix + name
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                buffer += _header(member, st, tarfile.DIRTYPE)
                subdirs.append(member + "/")
            elif stat.S_ISLNK(st.st_mode):
                buffer += _header(member, st, tarfile.SYMTYPE, link=os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                yield from _file(path, member, buffer)
            if len(buffer) >= PART:
                yield bytes(buffer)
                buffer.clear()
        pending.extend(reversed(subdirs))
    buffer += bytes(2 * _BLOCK)
    buffer += bytes(-len(buffer) % tarfile.RECORDSIZE)
    yield bytes(buffer)


class PackReader:
    """The stream of :func:`pack` as a file to ``read(n)`` from (a request body's source)."""

    def __init__(self, parts: Iterator[bytes]) -> None:
        self._parts = parts
        self._pending = b""
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        while not self._pending:
            part = next(self._parts, None)
            if part is None:
                return b""
            self._pending = part
        if size < 0:
            size = len(self._pending)
        data, self._pending = self._pending[:size], self._pending[size:]
        return data

    def close(self) -> None:
        self.closed = True


class StreamReader:
    """A binary stream (a pipe, say) read as a request body of unknown length: only ``read``
    (a request body's producer would ``seek`` to learn a length a pipe does not have)."""

    def __init__(self, source: IO[bytes]) -> None:
        self._source = source

    def read(self, size: int = -1) -> bytes:
        return self._source.read(size)

    def close(self) -> None:
        """Nothing to close: the stream is the caller's."""


def member_parts(name: str) -> list[str]:
    """The components of a member's name; ``ValueError`` naming it when it is absolute or
    holds a ``..``."""
    if name.startswith("/"):
        raise ValueError(f"member {name!r}: an absolute name (refused)")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"member {name!r}: a '..' component (refused)")
    return parts


class _Unpacker:
    def __init__(self, root: str) -> None:
        self.root = root
        self.count = 0
        self.dirs: list[tuple[str, int, int]] = []

    def _way(self, name: str, parts: list[str]) -> str:
        """The directory holding the member, made as needed; never through a symlink."""
        path = self.root
        for part in parts:
            path = os.path.join(path, part)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                os.mkdir(path)
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise ValueError(f"member {name!r}: a symlink or a file is in its way")
        return path

    def write(self, member: tarfile.TarInfo, archive: tarfile.TarFile) -> None:
        name = member.name
        parts = member_parts(name)
        if member.islnk():
            raise ValueError(f"member {name!r}: a hard link (refused)")
        if not (member.isreg() or member.isdir() or member.issym()):
            raise ValueError(f"member {name!r}: a device, FIFO or special file (refused)")
        if not parts:
            return  # "./": the destination itself
        target = os.path.join(self._way(name, parts[:-1]), parts[-1])
        existing = _lstat(target)
        mtime = int(member.mtime * 1_000_000_000)
        if member.isdir():
            if existing is None:
                os.mkdir(target, 0o700)
            elif not stat.S_ISDIR(existing.st_mode):
                raise ValueError(f"member {name!r}: a file or symlink is in its way")
            self.dirs.append((target, member.mode & MODE_BITS, mtime))
        else:
            if existing is not None and stat.S_ISDIR(existing.st_mode):
                raise ValueError(f"member {name!r}: a directory is in its way")
            temp = os.path.join(os.path.dirname(target), f".{secrets.token_hex(8)}.part")
            try:
                if member.issym():
                    os.symlink(member.linkname, temp)
                else:
                    data = archive.extractfile(member)
                    assert data is not None, "a regular member has data"
                    _write(temp, data, member.mode & MODE_BITS)
                os.utime(temp, ns=(mtime, mtime), follow_symlinks=False)
                os.replace(temp, target)
            except BaseException:
                with suppress(OSError):
                    os.unlink(temp)
                raise
        self.count += 1

    def finish(self) -> None:
        """Directories get their mode and mtime last (their members no longer change them)."""
        for path, mode, mtime in reversed(self.dirs):
            fd = os.open(path, _DIR_FLAGS)
            try:
                os.fchmod(fd, mode)
                os.utime(fd, ns=(mtime, mtime))
            finally:
                os.close(fd)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _write(path: str, data: IO[bytes], mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "wb") as out:
        shutil.copyfileobj(data, out, PART)
        os.fchmod(out.fileno(), mode)


def unpack(source: IO[bytes], dest: str) -> int:
    """Unpack the tar stream ``source`` into the local directory ``dest`` (made if missing);
    the members written. ``ValueError`` for a refused member (see the module) or a stream
    that is not a tar."""
    os.makedirs(dest, exist_ok=True)
    unpacker = _Unpacker(dest)
    try:
        with tarfile.open(fileobj=source, mode="r|", bufsize=PART) as archive:
            for member in archive:
                unpacker.write(member, archive)
    except tarfile.TarError as e:
        raise ValueError(f"not a tar stream ({e})") from None
    unpacker.finish()
    return unpacker.count
