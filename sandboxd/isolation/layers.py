"""The isolation layers beyond uid + cgroup that this package provides, by capability name.

Each is listed in ``/healthz`` while in force and each can be turned off by name
(``SANDBOXD_SECCOMP=off``, ``SANDBOXD_UMASK=022``, ``SANDBOXD_SOCKET_BUFFERS=off``,
``SANDBOXD_CPU_PLACEMENT=shared``); start-up
logs every one that is off. The ``fs.protected_*`` sysctls are the host's, not ours: start-up
only warns when they are off.
"""

from collections.abc import Callable

UID = "isolation.uid"
"""Every command runs as the sandbox's own uid of the pool, never the daemon's: listed where
that is the only layer (``--isolation=none`` started as root), implied by a cgroup driver's."""

SECCOMP = "isolation.seccomp"
"""Every command runs under the default system call filter (``sandboxd_seccomp.h``)."""

UMASK = "isolation.umask"
"""Every command starts with a umask that gives other uids nothing (``SANDBOXD_UMASK``)."""

SOCKET_BUFFERS = "isolation.socket-buffers"
"""A sandbox's socket buffers are charged to its memory limit (v1: ``memory.kmem.tcp``)."""

CPU_PLACEMENT = "isolation.cpu-placement"
"""Each sandbox runs only on the CPUs its quota covers (its cpuset), the ones the fewest
other sandboxes hold (``SANDBOXD_CPU_PLACEMENT``)."""

PROTECTED_SYSCTLS = ("fs.protected_symlinks", "fs.protected_hardlinks", "fs.protected_regular")
"""What keeps one uid's links and files in sticky shared directories (``/tmp``) from
redirecting another uid's opens and writes."""


def umask_isolates(umask: int) -> bool:
    """True when files and directories made under ``umask`` give other uids no access."""
    return umask & 0o007 == 0o007


def unprotected(read: Callable[[str], str]) -> list[str]:
    """The :data:`PROTECTED_SYSCTLS` that are off (0) on this host (unreadable ones are
    skipped: there is nothing to warn about where the kernel has no such setting)."""
    off = []
    for name in PROTECTED_SYSCTLS:
        try:
            value = read("/proc/sys/" + name.replace(".", "/")).strip()
        except OSError:
            continue
        if value == "0":
            off.append(name)
    return off


def v2_sockets_uncharged(cmdline: str) -> bool:
    """True when the kernel command line turns off cgroup v2's charging of socket memory."""
    return any(
        word.startswith("cgroup.memory=") and "nosocket" in word.split("=", 1)[1].split(",")
        for word in cmdline.split()
    )
