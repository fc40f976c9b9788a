"""Attacks on the kernel's surface, tried inside a sandbox by ``test_seccomp`` (stdlib only).

    python3 seccomp_attacks.py NAME..

Tries each named attack for real (ctypes, raw system calls) and prints one JSON object,
``{NAME: "ok" | "<errno name>"}``: ``ok`` when the kernel did what was asked, else the errno it
answered. Each attack is one system call (or as few as make it meaningful) with arguments
that succeed for an unprivileged uid where the kernel allows it, or that fail on an argument
check the kernel makes before its permission check, so that a refusal by the seccomp filter
(``EPERM``) differs from what the kernel itself answers without the filter.
"""

import ctypes
import errno
import json
import os
import signal
import socket
import sys
from collections.abc import Callable

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

NR = {
    "clone": 56,
    "personality": 135,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "iopl": 172,
    "ioperm": 173,
    "lookup_dcookie": 212,
    "clock_settime": 227,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "setns": 308,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "fsopen": 430,
    "clone3": 435,
}
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
KEY_SPEC_PROCESS_KEYRING = -2
KEY_SPEC_SESSION_KEYRING = -3
UFFD_USER_MODE_ONLY = 1
READ_IMPLIES_EXEC = 0x0400000


def syscall(name: str, *args: object) -> int:
    """The raw system call; ``OSError`` with the kernel's errno when it answers -1."""
    ctypes.set_errno(0)
    result = int(libc.syscall(ctypes.c_long(NR[name]), *args))
    if result == -1:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def new_user_namespace() -> None:
    syscall("unshare", CLONE_NEWUSER)


def clone_user_namespace() -> None:
    pid = syscall("clone", CLONE_NEWUSER | signal.SIGCHLD, None, None, None, None)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def clone3() -> None:
    syscall("clone3", None, 0)  # the kernel: EINVAL (size 0); the filter: ENOSYS


def io_uring() -> None:
    params = ctypes.create_string_buffer(120)
    os.close(syscall("io_uring_setup", 1, params))


def userfaultfd() -> None:
    os.close(syscall("userfaultfd", UFFD_USER_MODE_ONLY | os.O_CLOEXEC))


def bpf() -> None:
    syscall("bpf", 0x7FFF, None, 0)  # the kernel: EINVAL (no such command)


def perf_event_open() -> None:
    attr = (ctypes.c_uint32 * 32)()
    attr[0] = 1  # PERF_TYPE_SOFTWARE
    attr[1] = 128  # size (PERF_ATTR_SIZE_VER7 or less is accepted)
    attr[2] = 1  # PERF_COUNT_SW_TASK_CLOCK
    attr[10] = 1 << 5  # exclude_kernel (allowed at perf_event_paranoid 2)
    os.close(syscall("perf_event_open", attr, 0, -1, -1, 0))


def add_key() -> None:
    syscall("add_key", b"user", b"sandboxd-test", b"x", 1, ctypes.c_int(KEY_SPEC_PROCESS_KEYRING))


def request_key() -> None:
    syscall("request_key", b"user", b"sandboxd-absent", None, 0)  # kernel: ENOKEY


def keyctl() -> None:
    syscall("keyctl", 0, ctypes.c_int(KEY_SPEC_SESSION_KEYRING), 1)  # KEYCTL_GET_KEYRING_ID


def mount() -> None:
    syscall("mount", b"none", b"/sandboxd-absent", b"tmpfs", 0, None)  # kernel: ENOENT


def umount2() -> None:
    syscall("umount2", b"/sandboxd-absent", 0)  # kernel: ENOENT


def fsopen() -> None:
    os.close(syscall("fsopen", b"tmpfs", 0))


def setns() -> None:
    syscall("setns", -1, 0)  # kernel: EBADF


def personality() -> None:
    syscall("personality", READ_IMPLIES_EXEC)
    syscall("personality", 0)


def settimeofday() -> None:
    timeval = (ctypes.c_long * 2)(0, 2_000_000)  # kernel: EINVAL (usec out of range)
    syscall("settimeofday", timeval, None)


def clock_settime() -> None:
    timespec = (ctypes.c_long * 2)(0, -1)  # kernel: EINVAL (nsec out of range)
    syscall("clock_settime", 0, timespec)


def iopl() -> None:
    syscall("iopl", 5)  # kernel: EINVAL (level above 3)


def ioperm() -> None:
    syscall("ioperm", 1 << 20, 1, 1)  # kernel: EINVAL (past the I/O bitmap)


def lookup_dcookie() -> None:
    syscall("lookup_dcookie", 0, None, 0)  # kernel 6.8 and later: ENOSYS (removed)


def packet_socket() -> None:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()  # kernel: EPERM (no CAP_NET_RAW)


def vsock_socket() -> None:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM, 0).close()  # kernel here: ENODEV


def netlink_socket() -> None:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()  # must keep working


def tcp_socket() -> None:
    socket.socket(socket.AF_INET6, socket.SOCK_STREAM, 0).close()  # must keep working


ATTACKS: dict[str, Callable[[], None]] = {
    name: function
    for name, function in list(globals().items())
    if callable(function) and getattr(function, "__module__", None) == __name__
    if name not in ("syscall", "attempt", "main")
}


def attempt(name: str) -> str:
    """The outcome of one attack, tried in a child process of its own (an attack that works,
    such as a new user namespace, must not change the ground the next one is tried on)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            ATTACKS[name]()
            outcome = "ok"
        except OSError as e:
            outcome = errno.errorcode.get(e.errno or 0, str(e.errno))
        os.write(write, outcome.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        outcome = answer.read().decode()
    _, status = os.waitpid(pid, 0)
    return outcome or f"died with status {status}"


def main(names: list[str]) -> None:
    print(json.dumps({name: attempt(name) for name in names}))


if __name__ == "__main__":
    main(sys.argv[1:])
