"""Reading and writing cgroup control files, and the privileged calls the drivers make.

Control files are written with one ``write(2)`` on an existing file (never created): the kernel
reports a refused value as the error of that write. :class:`Kernel` gathers the calls that need
root or touch other processes, so tests substitute a temporary directory and fakes.
"""

import contextlib
import errno
import os
import signal
from collections.abc import Callable, Iterable

from attrs import frozen

from sandboxd.isolation.base import IsolationUnavailable


def read_text(path: str) -> str:
    """The whole file, stripped of surrounding whitespace."""
    with open(path, encoding="ascii") as f:
        return f.read().strip()


def read_int(path: str) -> int:
    """A file holding one integer."""
    return int(read_text(path))


def read_keyed(path: str) -> dict[str, int]:
    """A flat-keyed file (``key value`` per line, as ``cpu.stat`` or ``memory.events``)."""
    values = {}
    for line in read_text(path).splitlines():
        key, _, value = line.partition(" ")
        try:
            values[key] = int(value)
        except ValueError:
            continue
    return values


def read_keyed_or_empty(path: str) -> dict[str, int]:
    """:func:`read_keyed`, or nothing for a missing file (a removed cgroup)."""
    try:
        return read_keyed(path)
    except FileNotFoundError:
        return {}


def read_pids(procs_files: Iterable[str]) -> set[int]:
    """Every pid listed in the given ``cgroup.procs`` files (a missing file lists none)."""
    pids: set[int] = set()
    for path in procs_files:
        try:
            text = read_text(path)
        except FileNotFoundError:
            continue
        pids.update(int(word) for word in text.split())
    return pids


def write_text(path: str, text: str) -> None:
    """Write ``text`` to an existing control file in one call; the kernel's refusal raises."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def _pidfd_sigkill(pidfd: int) -> None:
    signal.pidfd_send_signal(pidfd, signal.SIGKILL)


@frozen
class Kernel:
    """The privileged operations of the cgroup drivers; the defaults are the real ones."""

    write: Callable[[str, str], None] = write_text
    mkdir: Callable[[str], None] = os.mkdir
    rmdir: Callable[[str], None] = os.rmdir
    kill: Callable[[int, int], None] = os.kill
    pidfd_open: Callable[[int], int] = os.pidfd_open
    pidfd_sigkill: Callable[[int], None] = _pidfd_sigkill
    close: Callable[[int], None] = os.close
    geteuid: Callable[[], int] = os.geteuid
    getpid: Callable[[], int] = os.getpid


def require_root(kernel: Kernel, driver: str) -> None:
    """Refuse, in one line, to run a cgroup driver without root."""
    euid = kernel.geteuid()
    if euid != 0:
        raise IsolationUnavailable(f"{driver} isolation needs root (running as uid {euid})")


def make_dirs(kernel: Kernel, path: str) -> None:
    """``mkdir`` that accepts an existing directory (for the daemon's own, long-lived ones)."""
    with contextlib.suppress(FileExistsError):
        kernel.mkdir(path)


def make_new_dir(kernel: Kernel, path: str) -> bool:
    """``mkdir``; False when the directory was there already (it is not this call's to undo)."""
    try:
        kernel.mkdir(path)
    except FileExistsError:
        return False
    return True


def remove_made(kernel: Kernel, made: list[str]) -> None:
    """``rmdir`` the directories a preflight made (``made`` is emptied), last made first; one
    gone or in use (a sandbox of another start made in it) is left."""
    while made:
        try:
            kernel.rmdir(made.pop())
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EBUSY, errno.ENOTEMPTY):
                raise


def remove_dir(kernel: Kernel, path: str) -> None:
    """``rmdir`` a cgroup; a missing one is fine, a busy one raises."""
    with contextlib.suppress(FileNotFoundError):
        kernel.rmdir(path)


def sweep(procs_files: Iterable[str], kernel: Kernel) -> int:
    """SIGKILL every process listed in ``procs_files``; return how many were signalled.

    Pids are pinned with pidfds first and the lists read again, so a pid that exits and is
    reused by an unrelated process between the two reads is never signalled: a process alive
    when signalled through its pidfd was the one listed in the second read. Without pidfds
    (kernels before 5.3) the pid is signalled directly after the second read.
    """
    files = list(procs_files)
    pinned: dict[int, int | None] = {}
    try:
        for pid in read_pids(files):
            try:
                pinned[pid] = kernel.pidfd_open(pid)
            except ProcessLookupError:
                continue
            except OSError as e:
                if e.errno != errno.ENOSYS:
                    raise
                pinned[pid] = None
        still = read_pids(files)
        signalled = 0
        for pid, pidfd in pinned.items():
            if pid not in still:
                continue
            try:
                if pidfd is None:
                    kernel.kill(pid, signal.SIGKILL)
                else:
                    kernel.pidfd_sigkill(pidfd)
            except ProcessLookupError:
                continue
            signalled += 1
        return signalled
    finally:
        for pidfd in pinned.values():
            if pidfd is not None:
                kernel.close(pidfd)
