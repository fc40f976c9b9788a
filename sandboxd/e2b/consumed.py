"""A spooled upload body whose space is given back as it is read.

A body of an envd upload is spooled in its sandbox's own directory, under its disk limit
(:mod:`sandboxd.web.spool`), and its files are then copied out of it. Without more, an upload
would count twice against the limit while it is written (the spool, and the files). A
:class:`Consumed` body punches out of its file (``fallocate(PUNCH_HOLE)``) each whole
:data:`GIVE_BACK` bytes that were read, so that what an upload holds of the limit is about
its files, plus a few megabytes.
"""

import ctypes
import ctypes.util
import os
from typing import IO

GIVE_BACK = 1 << 20
"""Bytes read between two punches (the space given back at a time)."""

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


_fallocate = _libc().fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free ``length`` bytes of the file ``fd`` from ``offset`` (its size kept: they read as
    zeros); ``OSError`` when the filesystem cannot."""
    if _fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length):
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


class Consumed:
    """The body in ``file``, read once from where it is sought to: what lies before the
    reads' furthest point is freed behind them, a whole :data:`GIVE_BACK` at a time (best
    effort: a filesystem that cannot punch holes keeps it until the body is closed)."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.freed = 0

    def seek(self, offset: int, whence: int = os.SEEK_SET, /) -> int:
        return self.file.seek(offset, whence)

    def read(self, size: int = -1, /) -> bytes:
        data = self.file.read(size)
        end = self.file.tell() // GIVE_BACK * GIVE_BACK
        if end > self.freed:
            try:
                punch_hole(self.file.fileno(), self.freed, end - self.freed)
            except OSError:
                return data  # kept: tried again at the next read
            self.freed = end
        return data
