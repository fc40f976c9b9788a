"""Layers of tar members written into a template's root, safely (docs/extensions.rst,
"Templates").

Nothing of an archive is ever resolved on the host: every member is reached from the root's
directory descriptor one component at a time (``openat`` with ``O_NOFOLLOW``), so a symlink
in the tree, whatever it points at, is never followed, and no path leaves the root:

- a member whose path holds ``..``, or that goes through a symlink or a file, is refused
  (:class:`~sandboxd.errors.BadArchive` naming it); a leading ``/`` is dropped (a build's
  ``COPY`` instead goes through the tree's links as they resolve with the tree as ``/``,
  never out of it: :attr:`Extraction.links_in_root`);
- symlinks are kept as they are (absolute ones too: they resolve inside the sandbox's own
  root, never on the host);
- a hard link must name a file written earlier by the same layer (not a lower layer's);
- device nodes are skipped (a sandbox gets its own minimal ``/dev``); FIFOs are made;
- modes are kept, setuid and setgid bits included: a template is only ever reached through
  a ``nosuid`` mount, and its directory is root's alone (0700) on the host;
- owners are kept when the daemon runs as root (``keep_owners``), else files are the daemon's;
- the files' bytes plus :data:`ENTRY_COST` per member may not pass ``limit``
  (:class:`~sandboxd.errors.TemplateTooLarge`, before the member is written).

Layers are applied in order with OCI whiteouts: ``.wh.NAME`` removes ``NAME`` from the layers
below, ``.wh..wh..opq`` empties its directory of what the layers below put there.
"""

import errno
import lzma
import os
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterable
from contextlib import suppress

from attrs import define, field

from sandboxd.core.files.tree import remove_dir
from sandboxd.core.templates.in_root import open_directory
from sandboxd.errors import BadArchive, InsufficientStorage, TemplateTooLarge

ENTRY_COST = 512
"""Bytes each member counts towards the limit beside its content (a tar header's size): an
archive of millions of empty files is large too."""

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_COPY_SIZE = 1 << 20

Parts = tuple[str, ...]


class Stopped(Exception):
    """The work was told to stop (its build was cancelled or ran past its time)."""


def never() -> bool:
    """A stop that never comes (an import's)."""
    return False


def member_parts(member: tarfile.TarInfo) -> Parts:
    """The member's path as components below the root (``()`` for the root itself): a
    leading ``/`` and ``.`` components dropped, ``..`` refused."""
    parts = tuple(part for part in member.name.split("/") if part not in ("", "."))
    if ".." in parts:
        raise BadArchive(f"member {member.name!r}: its path holds '..'")
    return parts


def _refuse(member: tarfile.TarInfo, reason: str) -> BadArchive:
    return BadArchive(f"member {member.name!r}: {reason}")


@define
class Extraction:
    """A template's root being written, layer after layer (:meth:`apply`), then
    :meth:`finish`\\ ed: directories get their modes last, so that a read-only directory of
    the archive does not stop what goes in it."""

    root_fd: int
    """The root's directory, open (the caller closes it)."""
    limit: int
    keep_owners: bool
    links_in_root: bool = False
    """Whether a member's path may go through a link of the tree, resolved inside the tree
    (:mod:`~sandboxd.core.templates.in_root`: ``COPY``'s), instead of being refused (an
    archive's). A member's own name is never followed, except a directory's: the directory
    a link there resolves to is the member's."""
    stopped: Callable[[], bool] = never
    """Asked before each member and each MiB of a file: ``True`` ends the extraction with
    :class:`Stopped` (a build's ``COPY`` or ``FROM``, cancelled or past its time)."""
    size: int = 0
    """Bytes of the regular files written so far (hard links counted once)."""
    counted: int = 0
    """What the limit is checked against: :attr:`size` plus :data:`ENTRY_COST` per member."""
    skipped: int = 0
    """Device nodes and other members that were not written."""
    _directories: dict[Parts, tuple[int, int, int]] = field(factory=dict)
    """Each directory's mode, uid and gid, given by :meth:`finish`."""
    _layer: set[Parts] = field(factory=set)

    def apply(self, members: Iterable[tuple[tarfile.TarInfo, tarfile.TarFile]]) -> None:
        """Write one layer: each member with the tar it is read from, in order."""
        self._layer = set()
        for member, tar in members:
            self._go_on()
            self._count(member)
            parts = member_parts(member)
            if not parts:
                if member.isdir():
                    self._directories[parts] = (member.mode, member.uid, member.gid)
                continue
            name = parts[-1]
            if name.startswith(WHITEOUT):
                self._whiteout(member, parts)
                continue
            parent = self._open_parent(member, parts)
            try:
                self._write(member, tar, parent, name)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise InsufficientStorage(f"member {member.name!r}: {e.strerror}") from None
                raise _refuse(member, e.strerror or "cannot be written") from None
            except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as e:
                raise _refuse(member, f"its content is damaged ({e})") from None
            finally:
                os.close(parent)
            self._layer.add(parts)

    def finish(self) -> None:
        """Give the directories their modes (and owners), deepest first."""
        for parts, (mode, uid, gid) in sorted(self._directories.items(), key=lambda i: -len(i[0])):
            try:
                fd = self._open_dir(parts)
            except OSError:
                continue  # removed by a whiteout of a later layer
            try:
                self._attributes(fd, mode, uid, gid)
            finally:
                os.close(fd)

    def _go_on(self) -> None:
        if self.stopped():
            raise Stopped()

    def _count(self, member: tarfile.TarInfo) -> None:
        grows = member.size if member.isreg() else 0
        if self.counted + grows + ENTRY_COST > self.limit:
            raise TemplateTooLarge(
                f"member {member.name!r}: the template passes {self.limit} bytes"
                " (SANDBOXD_TEMPLATE_MAX)"
            )
        self.counted += grows + ENTRY_COST

    def _open_dir(self, parts: Parts) -> int:
        """The directory at ``parts``, reached without following a link (or through links
        resolved inside the tree, :attr:`links_in_root`)."""
        if self.links_in_root:
            return open_directory(self.root_fd, parts)
        fd = os.dup(self.root_fd)
        try:
            for part in parts:
                below = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = below
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_parent(self, member: tarfile.TarInfo, parts: Parts) -> int:
        """The member's directory, made (0755, as tar does) where missing; ``BadArchive`` when
        the path goes through a symlink or a file."""
        fd = os.dup(self.root_fd)
        try:
            for depth, part in enumerate(parts[:-1], 1):
                try:
                    with suppress(FileExistsError):
                        os.mkdir(part, 0o700, dir_fd=fd)
                        self._directories.setdefault(parts[:depth], (0o755, 0, 0))
                    below = self._below(fd, parts[:depth])
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise _refuse(member, "its path goes through a link or a file") from None
                    raise _refuse(member, e.strerror or "its directory cannot be made") from None
                os.close(fd)
                fd = below
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _below(self, parent: int, parts: Parts) -> int:
        """The directory ``parts`` (``parent`` holds its last component), open."""
        if self.links_in_root:
            return open_directory(self.root_fd, parts)
        return os.open(parts[-1], _DIR_FLAGS, dir_fd=parent)

    def _clear(self, parent: int, name: str, keep_directory: bool) -> None:
        """Remove what is at ``name`` (a directory only unless ``keep_directory``)."""
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if not keep_directory:
                remove_dir(parent, name)
        else:
            os.unlink(name, dir_fd=parent)

    def _write(self, member: tarfile.TarInfo, tar: tarfile.TarFile, parent: int, name: str) -> None:
        if not (member.isdir() and self._linked_directory(parent, name, member_parts(member))):
            self._clear(parent, name, keep_directory=member.isdir())
        if member.isdir():
            with suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=parent)
            self._directories[member_parts(member)] = (member.mode, member.uid, member.gid)
        elif member.isreg():
            self._write_file(member, tar, parent, name)
        elif member.issym():
            os.symlink(member.linkname, name, dir_fd=parent)
            if self.keep_owners:
                os.chown(name, member.uid, member.gid, dir_fd=parent, follow_symlinks=False)
        elif member.islnk():
            self._link(member, parent, name)
        elif member.isfifo():
            os.mkfifo(name, 0o600, dir_fd=parent)
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=parent)
            try:
                self._attributes(fd, member.mode, member.uid, member.gid)
            finally:
                os.close(fd)
        else:
            self.skipped += 1  # device nodes: a sandbox gets its own /dev

    def _linked_directory(self, parent: int, name: str, parts: Parts) -> bool:
        """Whether ``name`` is a link that resolves to a directory inside the tree, which a
        directory of a ``COPY`` goes into (:attr:`links_in_root`)."""
        if not self.links_in_root:
            return False
        try:
            if not stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                return False
            os.close(open_directory(self.root_fd, parts))
        except OSError:
            return False  # nothing there, or a link to nothing or to a file: replaced
        return True

    def _write_file(
        self, member: tarfile.TarInfo, tar: tarfile.TarFile, parent: int, name: str
    ) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=parent)
        try:
            source = tar.extractfile(member)
            assert source is not None  # a regular member always has a file
            while chunk := source.read(_COPY_SIZE):
                os.write(fd, chunk)
                self._go_on()
            self._attributes(fd, member.mode, member.uid, member.gid)
            os.utime(fd, (member.mtime, member.mtime))
        finally:
            os.close(fd)
        self.size += member.size

    def _link(self, member: tarfile.TarInfo, parent: int, name: str) -> None:
        """A hard link to a file this very layer wrote (reached without following a link)."""
        target = tuple(part for part in member.linkname.split("/") if part not in ("", "."))
        if ".." in target or target not in self._layer:
            raise _refuse(member, "a hard link to a file outside this layer")
        source = self._open_parent(member, target)
        try:
            st = os.stat(target[-1], dir_fd=source, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise _refuse(member, "a hard link to something other than a file")
            os.link(target[-1], name, src_dir_fd=source, dst_dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(source)

    def _attributes(self, fd: int, mode: int, uid: int, gid: int) -> None:
        """Owner (as root), then mode: ``chown`` clears the setuid bit, so it goes first."""
        if self.keep_owners:
            os.fchown(fd, uid, gid)
        os.fchmod(fd, mode & 0o7777)

    def _whiteout(self, member: tarfile.TarInfo, parts: Parts) -> None:
        """Remove from the layers below what the whiteout names (never the whiteout itself)."""
        try:
            parent = self._open_dir(parts[:-1])
        except OSError:
            return  # nothing below to hide
        try:
            if parts[-1] == OPAQUE:
                with os.scandir(parent) as entries:
                    lower = [e.name for e in entries if (*parts[:-1], e.name) not in self._layer]
                for name in lower:
                    self._clear(parent, name, keep_directory=False)
            else:
                self._clear(parent, parts[-1][len(WHITEOUT) :], keep_directory=False)
        finally:
            os.close(parent)
