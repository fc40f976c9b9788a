"""Writing a file in place, as envd writes one (the E2B front's ``POST /files``), so that the
kernel reports it as it reports envd's writes.

envd opens the target itself (``O_CREAT | O_TRUNC``), gives it to the user (``chown``), then
writes the bytes; a watch sees exactly that: a new file is ``CREATE``, ``CHMOD``, ``WRITE``,
an existing one ``WRITE`` (the truncation), ``CHMOD``, ``WRITE``. E2B's clients count on
those events (its suite checks a new file's three), so the front writes the same way rather
than through the core's hidden temporary file renamed into place (which a watch sees as one
``CREATE``). As on E2B, a reader may see a file half written, and a failed write (disk full)
leaves what was written.

Like the core's file functions, this runs in a file thread with the sandbox's filesystem
credentials and never follows a link: the path is walked without following one, a link at
the target is replaced by the file (as the core's writes replace it), the file is opened
``O_NOFOLLOW``, and anything else but a regular file there is refused (opened
non-blocking, a FIFO cannot hold the thread).
"""

import os
import shutil
import stat
from typing import Protocol

from sandboxd.core.files.paths import Parts
from sandboxd.core.files.workspace import parent_of, translate
from sandboxd.errors import BadRequest

COPY_CHUNK = 1 << 20
"""Bytes copied at a time."""


class Source(Protocol):
    """Where a file's bytes are read from, ``size`` at most at a time (``b""``: no more)."""

    def read(self, size: int = -1, /) -> bytes: ...


_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _where(parts: Parts) -> str:
    return "/" + "/".join(parts)


def write_in_place(workspace: str, parts: Parts, source: Source) -> None:
    """Create or overwrite the file at ``parts`` with the bytes of ``source`` (parent
    directories made), as envd does: open, give it to its owner, write."""
    if not parts:
        raise BadRequest("/: is a directory")
    try:
        with parent_of(workspace, parts, create=True) as parent:
            try:
                st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                os.unlink(parts[-1], dir_fd=parent)  # a link is replaced, never followed
            elif st is not None and not stat.S_ISREG(st.st_mode):
                kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
                raise BadRequest(f"{_where(parts)}: is {kind}")
            fd = os.open(parts[-1], _FLAGS, 0o644, dir_fd=parent)
            try:
                opened = os.fstat(fd)
                if not stat.S_ISREG(opened.st_mode):  # pragma: no cover  # swapped meanwhile
                    raise BadRequest(f"{_where(parts)}: is not a regular file")
                os.set_blocking(fd, True)
                created = st is None or stat.S_ISLNK(st.st_mode)
                if created and stat.S_IMODE(opened.st_mode) != 0o644:
                    # A new file is envd's 0644 whatever the umask; this change of mode is the
                    # one CHMOD event a watch sees, where envd's chown makes it.
                    os.fchmod(fd, 0o644)
                else:
                    os.fchown(fd, opened.st_uid, opened.st_gid)  # envd's chown: the CHMOD event
                with os.fdopen(fd, "wb", closefd=False) as target:
                    shutil.copyfileobj(source, target, COPY_CHUNK)
            finally:
                os.close(fd)
    except OSError as e:
        raise translate(e, parts) from None
