"""An inotify instance charged to a sandbox's uid rather than to the daemon's root.

The kernel counts inotify instances and watches per user (``fs.inotify.max_user_instances``,
``fs.inotify.max_user_watches``): since Linux 4.11 an instance, and every watch later added to
it, is charged to the *effective* uid of the task that created the instance
(``fs/notify/inotify/inotify_user.c``: ``inotify_new_group`` takes
``inc_ucount(current_user_ns(), current_euid(), UCOUNT_INOTIFY_INSTANCES)`` and each new watch
``inc_inotify_watches`` of that same count). Created by a daemon running as root, the watches of
every sandbox would count against the one limit every root process of the host shares: a few
sandboxes' trees would leave the host's own services without a watch.

So the instance is created in a thread of its own whose *effective* uid alone is the sandbox's,
set by the raw ``setresuid`` system call (which changes the calling thread only; the C
library's wrapper changes every thread of the process). The sandbox's own limit then bounds
what its watches take. The thread's real and saved uids stay root's, so a process of the
sandbox's uid can neither signal (``kill`` looks at the target's real and saved uid) nor trace
(``ptrace`` wants all three) it meanwhile, and the thread ends right after the call: no thread of
the daemon carries the sandbox's uid afterwards (docs/isolation.rst, "Kernel quotas").
"""

import ctypes
import ctypes.util
import functools
import os
import platform
import threading
from collections.abc import Callable

SETRESUID = {"x86_64": 117, "aarch64": 147}
"""The ``setresuid`` system call's number per machine (``asm/unistd``)."""

UNCHANGED = -1
"""An id ``setresuid`` leaves as it is."""


class ThreadEuid:
    """Sets the calling thread's effective uid (and with it its fsuid), nothing else."""

    def __init__(self, number: int) -> None:
        """Through system call ``number`` (``setresuid``'s) of the process's C library."""
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._number = number
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long

    def set(self, uid: int) -> None:
        """Make ``uid`` the calling thread's effective uid; ``OSError`` when refused."""
        keep = ctypes.c_long(UNCHANGED)
        if self._syscall(ctypes.c_long(self._number), keep, ctypes.c_long(uid), keep) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))


@functools.cache
def thread_euid(machine: str | None = None) -> ThreadEuid | None:
    """The switch for ``machine`` (default: this one), once; ``None`` where ``setresuid``'s
    number is not known here (the daemon's own uid is then charged)."""
    number = SETRESUID.get(machine or platform.machine())
    return None if number is None else ThreadEuid(number)


def open_charged_to(
    uid: int, open_instance: Callable[[], int], set_euid: Callable[[int], None]
) -> int:
    """``open_instance()`` called in a new thread whose effective uid is ``uid`` (set by
    ``set_euid``), so that the instance it opens is charged to ``uid``; its descriptor, or what
    it (or the switch) raised. The caller waits for the thread, which ends with the call."""
    outcome: list[int | BaseException] = []

    def as_uid() -> None:
        try:
            set_euid(uid)
            outcome.append(open_instance())
        except BaseException as e:  # handed to the caller's thread
            outcome.append(e)

    thread = threading.Thread(target=as_uid, name=f"inotify-as-{uid}", daemon=True)
    thread.start()
    thread.join()
    (result,) = outcome
    if isinstance(result, BaseException):
        raise result
    return result
