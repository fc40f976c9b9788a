"""Which privilege-drop chain the isolated bundles use, for commands and for the daemon's own
work as a sandbox (docs/isolation.rst, "The privilege-drop chain").

Through the exec helper both are the helper's ``sandbox`` mode, the daemon's own work (the
archive's rsync end) with ``--no-ptrace`` as well: its program runs from an execute-only memfd
copy, so the sandbox's processes cannot ptrace it. A kernel that refuses executable memfds
(``vm.memfd_noexec = 2``) cannot give that step: the daemon's own work then runs without it
(still filtered), and start-up says so. Without the helper both are the shell chain of
:mod:`sandboxd.isolation.exec.wrapper`, which has neither the filter nor that step.
"""

from collections.abc import Callable

from twisted.logger import Logger

from sandboxd.isolation.base import Wrap
from sandboxd.isolation.exec.helper import HelperWrapper
from sandboxd.isolation.exec.wrapper import Programs, Wrapper

MEMFD_NOEXEC = "/proc/sys/vm/memfd_noexec"
"""Linux 6.3+: ``2`` refuses every executable memfd (``--no-ptrace`` needs one)."""

log = Logger()


def memfd_exec_refused(read: Callable[[str], str]) -> bool:
    """True when the kernel refuses executable memfds (``read`` reads a file's text)."""
    try:
        return read(MEMFD_NOEXEC).strip() == "2"
    except OSError:
        return False  # a kernel before 6.3: no such policy, executable is the default


def wraps(
    helper: str | None,
    seccomp: bool,
    umask: int,
    which: Callable[[str], str],
    read: Callable[[str], str],
) -> tuple[Wrap, Wrap | None]:
    """``(wrap, own_work_wrap)`` of :class:`~sandboxd.isolation.base.Isolation` for a daemon
    running as root (``which`` finds the shell chain's programs)."""
    if helper is None:
        return Wrapper(Programs.find(which), umask), None
    wrap = HelperWrapper(helper, seccomp, umask)
    if memfd_exec_refused(read):
        log.warn(
            "isolation: vm.memfd_noexec=2 refuses the execute-only copy of --no-ptrace: the"
            " archive's rsync end runs filtered, but the sandbox's processes can ptrace it"
        )
        return wrap, None
    return wrap, HelperWrapper(helper, seccomp, umask, no_ptrace=True)
