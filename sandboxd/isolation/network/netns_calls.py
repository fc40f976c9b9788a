"""Network namespaces from threads of their own: ``setns`` into one, ``unshare`` a new one.

A thread that enters or makes a network namespace stays in it, and so does every socket it
opens; the daemon's own threads must never move. :func:`in_a_thread_of_its_own` runs such work
on a short-lived thread that ends after it, and hands its result (or its exception) back.
"""

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)


def _checked(result: int, call: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{call}: {os.strerror(code)}")


def setns_net(fd: int) -> None:
    """Move the calling thread into the network namespace ``fd`` names."""
    _checked(_libc.setns(fd, CLONE_NEWNET), "setns")


def unshare_net() -> None:
    """Move the calling thread into a new network namespace."""
    _checked(_libc.unshare(CLONE_NEWNET), "unshare")


def in_a_thread_of_its_own(work: Callable[[], T], name: str) -> T:
    """``work()``'s result, computed by a thread named ``name`` that ends after it (whatever
    namespace it entered dies with it, the caller's thread never leaves its own); what
    ``work`` raised is raised here."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as e:  # handed to the caller
            failure.append(e)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
