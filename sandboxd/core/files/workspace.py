"""Blocking file operations on one workspace, safe against links and swapped components.

Every function here runs in a worker thread, under the sandbox's own filesystem credentials
(``Isolation.fs``). Each walks from the workspace root one component at a time with
``O_NOFOLLOW | O_DIRECTORY`` relative to the previous directory's descriptor, so no symlink is
ever followed, and a component the sandbox swaps for a symlink while the call runs makes the
call fail instead of leading it elsewhere. Regular files with several links that the sandbox
does not own are refused too (a hardlink to a file outside).
"""

import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import BinaryIO, TypeVar

from sandboxd.core.files.paths import Parts, display
from sandboxd.core.files.tree import UPLOAD_PREFIX, remove_dir
from sandboxd.errors import (
    BadRequest,
    InsufficientStorage,
    PathNotFound,
    SandboxdError,
)

T = TypeVar("T")

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_MODE = 0o644
DIR_MODE = 0o755
"""The modes of the files and directories the file calls make (envd's), whatever the
daemon's umask: the workspace itself (0700) keeps other uids out."""
_COPY_CHUNK = 1 << 20
_SENDFILE_CHUNK = 1 << 26


def translate(error: OSError, parts: Parts) -> SandboxdError:
    """Map an OS error of a file call to the answer the contract gives."""
    where = display(parts)
    if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
        return PathNotFound(f"{where}: no such file or directory")
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientStorage(f"{where}: no space left")
    if error.errno in (errno.EACCES, errno.EPERM):
        return BadRequest(f"{where}: permission denied")
    return BadRequest(f"{where}: {os.strerror(error.errno or 0)}")


@contextmanager
def parent_of(workspace: str, parts: Parts, create: bool = False) -> Iterator[int]:
    """A descriptor of the directory holding ``parts[-1]`` (the root itself for ``()``).

    With ``create``, missing directories on the way are made (``mkdir -p``).
    """
    fd = open_dir(workspace, parts[:-1], create)
    try:
        yield fd
    finally:
        os.close(fd)


def open_dir(workspace: str, parts: Parts, create: bool = False) -> int:
    """A descriptor of the directory ``parts`` (the caller closes it), reached one component
    at a time without following a link; with ``create``, missing directories are made."""
    fd = os.open(workspace, DIR_FLAGS)
    try:
        for name in parts:
            try:
                next_fd = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with suppress(FileExistsError):
                    make_directory(fd, name)
                next_fd = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_directory(parent: int, name: str) -> None:
    """Make the directory ``name`` in ``parent``, of mode :data:`DIR_MODE` exactly;
    ``FileExistsError`` when something is there already."""
    os.mkdir(name, DIR_MODE, dir_fd=parent)
    fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    try:
        os.fchmod(fd, DIR_MODE)  # mkdir's mode went through the umask
    finally:
        os.close(fd)


def lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_for_reading(workspace: str, parts: Parts, owner: int) -> tuple[BinaryIO, int]:
    """Open a regular file for download; returns the file and its size.

    A file with several links that ``owner`` (the sandbox's uid) does not own is refused: it
    can only be a hard link to something from outside the workspace.
    """
    if not parts:
        raise BadRequest("/: is a directory")
    try:
        with parent_of(workspace, parts) as parent:
            # O_NONBLOCK: opening a FIFO the sandbox made must not block the worker thread
            # (it is then refused as not a regular file); regular files ignore the flag.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(parts[-1], flags, dir_fd=parent)
    except OSError as e:
        raise translate(e, parts) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise BadRequest(f"{display(parts)}: not a regular file")
    if st.st_nlink > 1 and st.st_uid != owner:
        os.close(fd)
        raise BadRequest(f"{display(parts)}: a hard link to a file the sandbox does not own")
    return os.fdopen(fd, "rb"), st.st_size


def write_from(workspace: str, parts: Parts, source: BinaryIO, linkable: bool = False) -> None:
    """Replace (or create) a file with the bytes of ``source``, creating parent directories.

    The data goes to a hidden temporary file beside the target, renamed over it once complete,
    so a reader never sees half a file and a failed write (disk full) leaves nothing behind.

    ``linkable``: ``source`` is a complete unnamed file (``O_TMPFILE``) that the caller made
    the sandbox's own; it is linked into place as that temporary file, nothing is copied. Where
    it cannot be linked (another filesystem), its bytes from the current offset are copied.
    """
    if not parts:
        raise BadRequest("/: is a directory")
    temp = UPLOAD_PREFIX + secrets.token_hex(8)
    try:
        with parent_of(workspace, parts, create=True) as parent:
            existing = lstat(parent, parts[-1])
            if existing is not None and stat.S_ISDIR(existing.st_mode):
                raise BadRequest(f"{display(parts)}: is a directory")
            if linkable and _link(source, parent, temp):
                fd = -1  # linked: nothing to copy
            else:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(temp, flags, FILE_MODE, dir_fd=parent)
                os.fchmod(fd, FILE_MODE)  # open's mode went through the umask
            try:
                if fd >= 0:
                    _copy_into(source, fd)
                os.rename(temp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                with suppress(OSError):
                    os.unlink(temp, dir_fd=parent)
                raise
            finally:
                if fd >= 0:
                    os.close(fd)
    except OSError as e:
        raise translate(e, parts) from None


def _link(source: BinaryIO, parent: int, name: str) -> bool:
    """Give the unnamed file ``source`` the name ``name`` in ``parent``; ``False`` when it
    cannot be (another filesystem, no ``/proc``...: the caller copies instead).

    The link is made with the calling thread's credentials: it is refused unless the file
    belongs to the sandbox (``fs.protected_hardlinks``) and ``parent`` is writable to it.
    """
    source.flush()
    try:
        os.fchmod(source.fileno(), FILE_MODE)
        os.link(f"/proc/self/fd/{source.fileno()}", name, dst_dir_fd=parent, follow_symlinks=True)
    except OSError:
        return False
    return True


def _copy_into(source: BinaryIO, fd: int) -> None:
    """Copy the rest of ``source`` to the descriptor ``fd``.

    A large request body arrives in a temporary file (twisted.web's): it is copied in the
    kernel (``sendfile``), without passing through Python's buffers. Anything else (a small
    body in memory, a source ``sendfile`` refuses) is copied in chunks.
    """
    try:
        source.flush()
        in_fd, start = source.fileno(), source.tell()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        in_fd = start = -1
    if in_fd >= 0:
        offset = start
        try:
            while sent := os.sendfile(fd, in_fd, offset, _SENDFILE_CHUNK):
                offset += sent
            return
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS) or offset != start:
                raise
    with os.fdopen(fd, "wb", closefd=False) as target:
        shutil.copyfileobj(source, target, _COPY_CHUNK)


def exists(workspace: str, parts: Parts) -> bool:
    """Whether a regular file or directory is at the path (symlinks do not count)."""
    try:
        with parent_of(workspace, parts) as parent:
            if not parts:
                return True
            st = lstat(parent, parts[-1])
    except OSError:
        return False
    return st is not None and (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode))


def size(workspace: str, parts: Parts) -> int | None:
    """The size of the regular file at the path, or ``None`` when there is none."""
    if not parts:
        return None
    try:
        with parent_of(workspace, parts) as parent:
            st = lstat(parent, parts[-1])
    except OSError:
        return None
    if st is None or not stat.S_ISREG(st.st_mode):
        return None
    return st.st_size


def delete(workspace: str, parts: Parts) -> None:
    """Delete one file (not a directory)."""
    if not parts:
        raise BadRequest("/: is a directory")
    try:
        with parent_of(workspace, parts) as parent:
            st = lstat(parent, parts[-1])
            if st is None:
                raise FileNotFoundError(errno.ENOENT, "missing")
            if stat.S_ISDIR(st.st_mode):
                raise BadRequest(f"{display(parts)}: is a directory")
            os.unlink(parts[-1], dir_fd=parent)
    except OSError as e:
        raise translate(e, parts) from None


def mkdir(workspace: str, parts: Parts) -> None:
    """``mkdir -p``: create the directory and its missing parents."""
    if not parts:
        return
    try:
        with parent_of(workspace, parts, create=True) as parent:
            try:
                make_directory(parent, parts[-1])
            except FileExistsError:
                st = lstat(parent, parts[-1])
                if st is None or not stat.S_ISDIR(st.st_mode):
                    raise BadRequest(f"{display(parts)}: exists and is not a directory") from None
    except OSError as e:
        raise translate(e, parts) from None


def _remove_entry(parent: int, name: str, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        remove_dir(parent, name)
    else:
        os.unlink(name, dir_fd=parent)


def rmdir(workspace: str, parts: Parts) -> None:
    """Remove a directory and everything in it."""
    if not parts:
        raise BadRequest("/: the workspace root cannot be removed")
    try:
        with parent_of(workspace, parts) as parent:
            st = lstat(parent, parts[-1])
            if st is None:
                raise FileNotFoundError(errno.ENOENT, "missing")
            if not stat.S_ISDIR(st.st_mode):
                raise BadRequest(f"{display(parts)}: not a directory")
            remove_dir(parent, parts[-1])
    except OSError as e:
        raise translate(e, parts) from None


def rename(workspace: str, source: Parts, target: Parts) -> None:
    """Move ``source`` to ``target``, replacing what is there and creating its parents."""
    if not source or not target:
        raise BadRequest("the workspace root cannot be renamed or replaced")
    if target[: len(source)] == source and len(target) > len(source):
        raise BadRequest(f"{display(target)}: inside {display(source)}")
    if source[: len(target)] == target and len(source) > len(target):
        # Replacing an ancestor would remove the source along with it.
        raise BadRequest(f"{display(source)}: inside {display(target)}")
    try:
        with parent_of(workspace, source) as src_parent:
            if lstat(src_parent, source[-1]) is None:
                raise FileNotFoundError(errno.ENOENT, "missing")
            try:
                with parent_of(workspace, target, create=True) as dst_parent:
                    existing = lstat(dst_parent, target[-1])
                    if existing is not None and source != target:
                        _remove_entry(dst_parent, target[-1], existing)
                    os.rename(source[-1], target[-1], src_dir_fd=src_parent, dst_dir_fd=dst_parent)
            except OSError as e:
                raise translate(e, target) from None
    except OSError as e:
        raise translate(e, source) from None
