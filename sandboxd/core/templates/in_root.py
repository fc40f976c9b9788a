"""A path of a template's tree opened as if the tree were ``/`` (docs/extensions.rst,
"Building a template"): ``COPY`` writes through the links of the tree, as a process whose
root the tree is would (Debian's ``/bin`` is a link to ``usr/bin``).

``openat2`` with ``RESOLVE_IN_ROOT`` (Linux 5.6): the kernel resolves every component from
the tree's own directory, an absolute link's target as a path from that directory and ``..``
stopped at it, so nothing outside the tree is ever reached, whatever its links point at
(``/etc``, ``../../..``); ``RESOLVE_NO_MAGICLINKS`` refuses ``/proc``'s links to elsewhere.
"""

import ctypes
import os
from collections.abc import Sequence

SYS_OPENAT2 = 437
"""``openat2``'s number, the same on every architecture (the syscalls added after 424 are)."""
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10

_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    """``struct open_how``."""

    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


def open_directory(root_fd: int, parts: Sequence[str]) -> int:
    """The directory at ``parts`` (components from the tree's top; ``()``: the top itself),
    its links resolved inside the tree whose directory ``root_fd`` is open: ``OSError`` as
    ``openat`` would raise it (``ENOENT`` for a link to nothing, ``ENOTDIR`` for a file)."""
    how = _OpenHow(os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0, RESOLVE_IN_ROOT)
    how.resolve |= RESOLVE_NO_MAGICLINKS
    path = "/".join(parts) or "."
    fd: int = _libc.syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(root_fd),
        path.encode(),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error), path)
    return fd
