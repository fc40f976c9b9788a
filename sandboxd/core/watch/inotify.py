"""The Linux inotify calls (through ctypes) and the parsing of the events it reads.

Watches are added on a directory *descriptor* (``/proc/self/fd/N``, which the kernel lets a
process resolve for itself), opened beforehand by a walk that never follows a link and runs
with the sandbox's filesystem credentials: a watch can only be on a directory the sandbox
itself could open, inside its workspace.
"""

import ctypes
import ctypes.util
import os
import struct
from collections.abc import Iterator

from attrs import frozen

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

WATCH_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_DONT_FOLLOW
    | IN_EXCL_UNLINK
)
"""What each watched directory reports: its entries' changes, and its own removal."""

_HEADER = struct.Struct("iIII")

KINDS = (
    (IN_CREATE, "create"),
    (IN_MOVED_TO, "create"),
    (IN_MODIFY, "write"),
    (IN_DELETE, "remove"),
    (IN_MOVED_FROM, "rename"),
    (IN_ATTRIB, "chmod"),
)
"""inotify's mask bits to the wire's event names (a rename's new name is a create, as
fsnotify and E2B report it)."""


@frozen
class RawEvent:
    """One inotify event: watch descriptor, mask, and the entry's name (``""``: the
    watched directory itself)."""

    wd: int
    mask: int
    name: str


def parse(buffer: bytes) -> Iterator[RawEvent]:
    """The events in what one ``read`` of the inotify descriptor returned."""
    at = 0
    while at + _HEADER.size <= len(buffer):
        wd, mask, _cookie, length = _HEADER.unpack_from(buffer, at)
        at += _HEADER.size
        raw = buffer[at : at + length].split(b"\0", 1)[0]
        at += length
        yield RawEvent(wd, mask, os.fsdecode(raw))


def kind_of(mask: int) -> str | None:
    """The wire's event name for a mask (``None``: not one the wire reports)."""
    for bit, name in KINDS:
        if mask & bit:
            return name
    return None


class Inotify:
    """The C library's ``inotify_init1`` and ``inotify_add_watch``."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._init = libc.inotify_init1
        self._init.argtypes = [ctypes.c_int]
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]

    def open(self) -> int:
        """A new non-blocking inotify descriptor; ``OSError`` (``EMFILE``...) when refused."""
        fd = int(self._init(IN_NONBLOCK | IN_CLOEXEC))
        if fd < 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))
        return fd

    def watch_dir(self, fd: int, dir_fd: int) -> int:
        """Watch the directory open as ``dir_fd`` on ``fd``; its watch descriptor."""
        wd = int(self._add(fd, f"/proc/self/fd/{dir_fd}".encode(), WATCH_MASK & ~IN_DONT_FOLLOW))
        if wd < 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))
        return wd
