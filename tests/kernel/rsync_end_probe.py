"""Run inside a sandbox (as its uid, under its filter): catch the archive's rsync end and try
to take it over (test_privdrop_chain.py).

Usage: ``python3 rsync_end_probe.py READY_FILE DEADLINE_SECONDS``. Creates ``READY_FILE`` once
it watches, then scans ``/proc`` for a process of its own uid running ``rsync --server``; the
first it finds is stopped (``SIGSTOP``: a process of the same uid may), its ``Seccomp`` and
``NoNewPrivs`` read from ``/proc/PID/status``, and ``PTRACE_ATTACH`` tried on it (detached again
when it worked), then it is continued. Prints one JSON object: ``found`` false when no such
process showed before the deadline, else ``seccomp``, ``no_new_privs``, ``uid`` and ``ptrace``
(``"attached"``, or the errno name).
"""

import ctypes
import errno
import json
import os
import signal
import sys
import time

PTRACE_ATTACH = 16
PTRACE_DETACH = 17


def status_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in f if ":" in line)}


def rsync_server_end(me: int) -> int | None:
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            uid = int(status_of(int(name))["Uid"].split()[0])
        except (OSError, KeyError, ValueError):
            continue
        if uid == me and argv[0].endswith(b"rsync") and b"--server" in argv:
            return int(name)
    return None


def attach(pid: int) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
        return errno.errorcode[ctypes.get_errno()]
    os.waitpid(pid, 0)
    libc.ptrace(PTRACE_DETACH, pid, None, None)
    return "attached"


def main() -> None:
    ready, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
    me = os.getuid()
    open(ready, "w").close()
    while time.monotonic() < deadline:
        pid = rsync_server_end(me)
        if pid is None:
            continue
        os.kill(pid, signal.SIGSTOP)
        try:
            status = status_of(pid)
            found = {
                "found": True,
                "uid": int(status["Uid"].split()[0]),
                "seccomp": status["Seccomp"],
                "no_new_privs": status["NoNewPrivs"],
                "ptrace": attach(pid),
            }
        finally:
            os.kill(pid, signal.SIGCONT)
        print(json.dumps(found))
        return
    print(json.dumps({"found": False}))


if __name__ == "__main__":
    main()
