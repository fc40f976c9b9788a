"""Unpacking a tool's ``.tar.gz`` into ``{tools_dir}/{sha}/``: safely, atomically, read-only.

Blocking: runs in a worker thread. The archive is unpacked into a fresh private (0700) directory
under ``{tools_dir}/.tmp/`` and renamed to ``{tools_dir}/{sha}`` only once complete, so a
directory named by a sha is always a whole tool. Any bad member refuses the whole artifact
(:class:`~sandboxd.core.tools.fetch.ToolRefused`): an absolute path, a ``..`` component, a link
leading out of the tree (checked again after unpacking, on the real files, so a chain of links
cannot escape either), a device file or FIFO, or more files or bytes than the limits. Members
are written by walking from the top one component at a time with ``O_NOFOLLOW``, never through
a link an earlier member made. Ownership from the archive is ignored (files belong to the
daemon, root in production); directories are 0755, files 0755 when the archive made them
executable for anyone, else 0644: sandboxes can read and run a tool, never change it.
"""

import contextlib
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from typing import IO

from attrs import frozen

from sandboxd.core.tools.fetch import ToolRefused

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20
TEMP = ".tmp"


@frozen
class UnpackLimits:
    """How much one artifact may unpack to."""

    max_members: int = 100_000
    max_bytes: int = 4 << 30


def member_parts(name: str) -> tuple[str, ...]:
    """The components of a member name; ``ToolRefused`` for an absolute path or ``..``."""
    if name.startswith("/"):
        raise ToolRefused(f"artifact: {name!r} is an absolute path")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise ToolRefused(f"artifact: {name!r} climbs out with '..'")
    return parts


def _link_stays_inside(parts: tuple[str, ...], target: str) -> bool:
    if not target or target.startswith("/"):
        return False
    joined = posixpath.normpath(posixpath.join(*parts[:-1], target) if parts[:-1] else target)
    return joined != ".." and not joined.startswith("../")


@contextlib.contextmanager
def _parent(top: int, parts: tuple[str, ...]) -> Iterator[int]:
    """A descriptor of the directory that holds ``parts[-1]``, making missing directories."""
    fd = os.dup(top)
    try:
        for name in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
            try:
                next_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                raise ToolRefused(f"artifact: {'/'.join(parts)!r} goes through a link") from None
            os.close(fd)
            fd = next_fd
        yield fd
    finally:
        os.close(fd)


def _write(parent: int, name: str, source: IO[bytes], mode: int) -> int:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=parent)  # a later member replaces an earlier one
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=parent)
    written = 0
    with os.fdopen(fd, "wb") as target:
        while chunk := source.read(_CHUNK):
            target.write(chunk)
            written += len(chunk)
        os.fchmod(target.fileno(), mode)  # exactly, whatever the daemon's umask
    return written


def unpack(artifact: IO[bytes], into: str, limits: UnpackLimits) -> None:
    """Unpack the ``.tar.gz`` ``artifact`` into the (empty) directory ``into``."""
    total = 0
    links: list[str] = []
    top = os.open(into, _DIR_FLAGS)
    try:
        with tarfile.open(fileobj=artifact, mode="r|gz") as tar:
            for count, member in enumerate(tar, start=1):
                if count > limits.max_members:
                    raise ToolRefused(f"artifact: more than {limits.max_members} entries")
                parts = member_parts(member.name)
                if not parts:
                    continue  # the top directory itself
                name = "/".join(parts)
                with _parent(top, parts) as parent:
                    if member.isdir():
                        with contextlib.suppress(FileExistsError):
                            os.mkdir(parts[-1], 0o755, dir_fd=parent)
                    elif member.isfile():
                        total += member.size
                        if total > limits.max_bytes:
                            raise ToolRefused(f"artifact: unpacks to over {limits.max_bytes} B")
                        source = tar.extractfile(member)
                        assert source is not None
                        mode = 0o755 if member.mode & 0o111 else 0o644
                        _write(parent, parts[-1], source, mode)
                    elif member.issym():
                        if not _link_stays_inside(parts, member.linkname):
                            raise ToolRefused(f"artifact: link {name!r} leaves the tree")
                        os.symlink(member.linkname, parts[-1], dir_fd=parent)
                        links.append(name)
                    elif member.islnk():
                        target = member_parts(member.linkname)
                        with _parent(top, target) as source_dir:
                            if not target or not _is_file(source_dir, target[-1]):
                                raise ToolRefused(f"artifact: {name!r} links to no file")
                            os.link(
                                target[-1],
                                parts[-1],
                                src_dir_fd=source_dir,
                                dst_dir_fd=parent,
                                follow_symlinks=False,
                            )
                    elif member.isdev() or member.isfifo():
                        raise ToolRefused(f"artifact: {name!r} is a device file or FIFO")
                    else:
                        raise ToolRefused(f"artifact: {name!r} is of an unsupported type")
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ToolRefused(f"artifact: not a valid .tar.gz ({e})") from None
    finally:
        os.close(top)
    _check_links(into, links)
    for path, _, _ in os.walk(into):
        os.chmod(path, 0o755)  # mkdir's mode went through the daemon's umask


def _is_file(parent: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _check_links(into: str, links: list[str]) -> None:
    """Every link, resolved on the real tree (chains included), stays inside it."""
    root = os.path.realpath(into)
    for name in links:
        resolved = os.path.realpath(os.path.join(root, name))
        if resolved != root and not resolved.startswith(root + os.sep):
            raise ToolRefused(f"artifact: link {name!r} leaves the tree")


def install(tools_dir: str, sha: str, artifact: IO[bytes], limits: UnpackLimits) -> None:
    """Unpack ``artifact`` to ``{tools_dir}/{sha}`` unless it is there already; atomic."""
    final = os.path.join(tools_dir, sha)
    if os.path.isdir(final):
        return
    staging = os.path.join(tools_dir, TEMP)
    os.makedirs(staging, mode=0o700, exist_ok=True)
    work = tempfile.mkdtemp(prefix=sha[:16] + "-", dir=staging)
    try:
        artifact.seek(0)
        unpack(artifact, work, limits)
        os.chmod(work, 0o755)
        try:
            os.rename(work, final)
        except OSError:
            if not os.path.isdir(final):  # not "someone installed it meanwhile"
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
