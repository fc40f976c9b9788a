"""The guest's stand-in for a PID 1 that reaps: run one command, reap every orphan meanwhile.

``python3 tests/vm/reaper.py CGROUP_PROCS ARGV...`` makes itself a child subreaper, starts
ARGV in a session of its own with its pid written to the CGROUP_PROCS file first (so the
command starts inside that cgroup while this process stays where it is), then reaps every
process that ends below it until ARGV's own process has ended, and exits with ARGV's status
(``128 + N`` when a signal ended it).

Why: virtme-ng's init is the guest's PID 1 and does not reap the orphans it inherits. A
sandbox's processes whose parent exits (a fork bomb's children) then stay zombies charged to
the sandbox's ``pids`` for ever, where on a real host PID 1 (systemd) reaps them.
"""

import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36
NOTED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def start(procs: str, argv: list[str]) -> int:
    """Fork ARGV into the cgroup of ``procs`` in a new session; the child's pid."""
    pid = os.fork()
    if pid == 0:
        try:
            for sig in NOTED:
                signal.signal(sig, signal.SIG_DFL)
            with open(procs, "w") as joined:
                joined.write(str(os.getpid()))
            os.setsid()
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    return pid


def reap_until(main: int) -> int:
    """Reap every child until ``main`` is reaped; its exit status as a shell reports it."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 127
        if pid == main:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


def main() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    # Like inside.sh: a stray signal to this group must not lose the status.
    for sig in NOTED:
        signal.signal(sig, signal.SIG_IGN)
    return reap_until(start(sys.argv[1], sys.argv[2:]))


if __name__ == "__main__":
    sys.exit(main())
