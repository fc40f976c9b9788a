"""The end of a sandbox's PID namespace (docs/isolation.rst, "Namespaces").

The exec helper's ``namespaces`` mode (``sandboxd_exec_ns.h``) forks each PID namespace's init
(pid 1: it mounts the namespace's ``/proc`` in the sandbox's mount namespace and then only
sleeps, the kernel reaping the orphans it inherits) and writes its pid, as the host numbers it,
into ``init`` beside the pins. The namespace lives as long as its init: once init is killed, the
kernel kills every process left inside, and no process can enter any more. So :func:`kill_init`
ends it at the sandbox's end (and at start-up, for a crashed predecessor's sandbox, whose init
outlived it): the pid is trusted only while ``/proc/PID/ns/pid`` is the pinned namespace itself,
so a pid the kernel has since handed to another process is never signalled.
"""

import os
import signal
from collections.abc import Callable

INIT_FILE = "init"
"""The file beside the pins holding init's pid."""


def kill_init(
    directory: str,
    pin: str,
    proc: str = "/proc",
    kill: Callable[[int, int], None] = os.kill,
) -> bool:
    """SIGKILL the init of the PID namespace pinned at ``pin`` (its pid read from ``init`` in
    ``directory``), which takes every process of the namespace with it. ``False`` when there is
    nothing to kill: no pid recorded, init gone, or the pid now another namespace's process."""
    try:
        with open(os.path.join(directory, INIT_FILE)) as f:
            pid = int(f.read().strip())
        pinned = os.stat(pin)
        held = os.stat(os.path.join(proc, str(pid), "ns", "pid"))
    except (OSError, ValueError):
        return False
    if (held.st_dev, held.st_ino) != (pinned.st_dev, pinned.st_ino):
        return False
    try:
        kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True
