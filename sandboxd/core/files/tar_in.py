"""A tar stream unpacked into a workspace, member by member (``PUT /sandboxes/{rid}/tree``).

Runs in a file thread under the sandbox's own filesystem credentials, as every function of
:mod:`sandboxd.core.files.workspace` does, and walks as they do: from the workspace root, one
component at a time with ``O_NOFOLLOW | O_DIRECTORY``. A symlink the archive made (or the
sandbox left) is therefore never followed: a later member named through it is refused, not
written where the link points. The archive is read with :mod:`tarfile` in stream mode
(``r|``): one member's data at a time, never the whole tree in memory.

What lands: regular files (mode and mtime), directories (even empty ones; their mode and
mtime set once the stream ends, so that a read-only directory still takes its members) and
symlinks (as links, with any target). What is refused, naming the member (``400``): absolute
names, ``..`` components, hard links, devices, FIFOs and other special files. Members written
before a refused one stay (each inside the workspace). See docs/openapi.yaml (``/tree``).
"""

import errno
import os
import secrets
import shutil
import stat
import tarfile
from collections.abc import Callable
from contextlib import suppress
from typing import IO

from sandboxd.core.files.paths import Parts, display
from sandboxd.core.files.tree import UPLOAD_PREFIX
from sandboxd.core.files.workspace import lstat, open_dir
from sandboxd.errors import BadRequest, InsufficientStorage, SandboxdError

READ_SIZE = 1 << 20
"""Bytes of the stream read, and of a member's data copied, at a time."""

MODE_BITS = 0o777
"""The permission bits a member keeps (no set-uid, set-gid or sticky bit)."""

DEFERRED_DIRS_MAX = 100_000
"""Directories whose mode and mtime wait for the end of the stream; past it, they are set
at once (a stream of that many directories must not grow the daemon without bound)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def member_parts(name: str) -> Parts:
    """The components of a member's name (``./a/b/`` → ``("a", "b")``): ``400`` naming it
    when it is absolute or holds a ``..``."""
    if name.startswith("/"):
        raise BadRequest(f"member {name!r}: an absolute name (refused)")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise BadRequest(f"member {name!r}: a '..' component (refused)")
    return parts


def _refusal(error: OSError, name: str) -> SandboxdError:
    """The answer to an OS error while a member is written."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientStorage(f"member {name!r}: no space left")
    if error.errno in (errno.ELOOP, errno.ENOTDIR):
        return BadRequest(f"member {name!r}: a symlink or a file is in its way (never followed)")
    return BadRequest(f"member {name!r}: {os.strerror(error.errno or 0)}")


def _mtime_ns(member: tarfile.TarInfo) -> int:
    return int(member.mtime * 1_000_000_000)


class Unpacker:
    """Writes members below ``target`` of ``workspace``; :meth:`close` when done."""

    def __init__(self, workspace: str, target: Parts) -> None:
        self.workspace = workspace
        self.target = target
        self.members = 0
        self._dirs: list[tuple[Parts, int, int]] = []
        self._cached: tuple[Parts, int] | None = None

    def close(self) -> None:
        """Forget the directory kept open between members."""
        if self._cached is not None:
            os.close(self._cached[1])
            self._cached = None

    def _dir(self, parts: Parts) -> int:
        """The directory ``parts`` (made if missing): kept open for the next member, which is
        most often in the same directory."""
        if self._cached is not None and self._cached[0] == parts:
            return self._cached[1]
        fd = open_dir(self.workspace, parts, create=True)
        self.close()
        self._cached = (parts, fd)
        return fd

    def write(self, member: tarfile.TarInfo, archive: tarfile.TarFile) -> None:
        """Write one member (``400``/``507`` naming it when it cannot be)."""
        name = member.name
        parts = member_parts(name)
        if member.islnk():
            raise BadRequest(f"member {name!r}: a hard link (refused: send the file itself)")
        if not (member.isreg() or member.isdir() or member.issym()):
            raise BadRequest(f"member {name!r}: a device, FIFO or special file (refused)")
        if not parts:
            if member.isdir():
                return  # "./": the target itself, made already
            raise BadRequest(f"member {name!r}: names no file")
        full = self.target + parts
        try:
            parent = self._dir(full[:-1])
            if member.isdir():
                self._mkdir(parent, full, member)
            elif member.issym():
                self._replace(
                    parent, full[-1], name, lambda temp: self._symlink(parent, temp, member)
                )
            else:
                data = archive.extractfile(member)
                assert data is not None, "a regular member has data"
                self._replace(
                    parent, full[-1], name, lambda temp: self._file(parent, temp, data, member)
                )
        except OSError as e:
            raise _refusal(e, name) from None
        self.members += 1

    def _mkdir(self, parent: int, full: Parts, member: tarfile.TarInfo) -> None:
        try:
            os.mkdir(full[-1], 0o700, dir_fd=parent)
        except FileExistsError:
            st = lstat(parent, full[-1])
            if st is None or not stat.S_ISDIR(st.st_mode):
                raise BadRequest(
                    f"member {member.name!r}: a file or symlink is in its way"
                ) from None
        entry = (full, member.mode & MODE_BITS, _mtime_ns(member))
        if len(self._dirs) < DEFERRED_DIRS_MAX:
            self._dirs.append(entry)
        else:
            self._set_dir(*entry)

    def _replace(self, parent: int, name: str, member: str, make: Callable[[str], None]) -> None:
        """Make the entry under a hidden temporary name, then rename it over ``name`` (a file or
        symlink there is replaced; a directory is not)."""
        existing = lstat(parent, name)
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            raise BadRequest(f"member {member!r}: a directory is in its way")
        temp = UPLOAD_PREFIX + secrets.token_hex(8)
        try:
            make(temp)
            os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with suppress(OSError):
                os.unlink(temp, dir_fd=parent)
            raise

    @staticmethod
    def _symlink(parent: int, temp: str, member: tarfile.TarInfo) -> None:
        os.symlink(member.linkname, temp, dir_fd=parent)
        mtime = _mtime_ns(member)
        os.utime(temp, ns=(mtime, mtime), dir_fd=parent, follow_symlinks=False)

    @staticmethod
    def _file(parent: int, temp: str, data: IO[bytes], member: tarfile.TarInfo) -> None:
        fd = os.open(temp, _FILE_FLAGS, 0o600, dir_fd=parent)
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                shutil.copyfileobj(data, out, READ_SIZE)
            os.fchmod(fd, member.mode & MODE_BITS)
            mtime = _mtime_ns(member)
            os.utime(fd, ns=(mtime, mtime))
        finally:
            os.close(fd)

    def finish(self) -> None:
        """Give the directories their mode and mtime, deepest last-seen first (a directory's
        own members no longer change its mtime; a read-only one took them already)."""
        self.close()
        dirs, self._dirs = self._dirs, []
        for full, mode, mtime in reversed(dirs):
            try:
                self._set_dir(full, mode, mtime)
            except OSError as e:
                raise _refusal(e, "/".join(full[len(self.target) :])) from None

    def _set_dir(self, full: Parts, mode: int, mtime: int) -> None:
        fd = open_dir(self.workspace, full)
        try:
            os.fchmod(fd, mode)
            os.utime(fd, ns=(mtime, mtime))
        finally:
            os.close(fd)


def unpack(workspace: str, target: Parts, source: IO[bytes]) -> int:
    """Unpack the tar stream ``source`` below ``target`` (made if missing); the members
    written. ``400`` for a stream that is not a tar, or for a refused member (naming it)."""
    unpacker = Unpacker(workspace, target)
    try:
        try:
            os.close(open_dir(workspace, target, create=True))
        except OSError as e:
            raise BadRequest(f"{display(target)}: {os.strerror(e.errno or 0)}") from None
        with tarfile.open(fileobj=source, mode="r|", bufsize=READ_SIZE) as archive:
            for member in archive:
                unpacker.write(member, archive)
        unpacker.finish()
    except tarfile.TarError as e:
        raise BadRequest(f"body: not a tar stream ({e})") from None
    finally:
        unpacker.close()
    return unpacker.members
