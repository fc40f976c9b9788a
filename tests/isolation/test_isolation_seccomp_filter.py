"""The default seccomp filter, read from the built helper (``sandboxd-exec seccomp-dump``) and run
on every case by a classic-BPF interpreter: each system call of the tables below, per ABI.

This checks the whole program, including what a test cannot try on this kernel (kexec, module
loading, swap, reboot: refused by the capability check before the filter matters, and never
tried for real here). That the kernel enforces the same program is ``tests/kernel/test_seccomp``.
The numbers are x86_64's, written here from the kernel's table, not taken from the C headers
the helper was built with: a wrong or missing ``__NR_`` there shows as a failure here.
"""

import errno
import struct
import subprocess
from pathlib import Path

import pytest
from attrs import frozen

from sandboxd.isolation.exec.helper import HELPER

pytestmark = pytest.mark.skipif(not Path(HELPER).exists(), reason="the helper is not built")

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
X32_BIT = 0x40000000

ALLOW = 0x7FFF0000
KILL_PROCESS = 0x80000000
ERRNO = 0x00050000

DENIED = {
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "userfaultfd": 323, "bpf": 321, "perf_event_open": 298, "fanotify_init": 300,
    "add_key": 248, "request_key": 249, "keyctl": 250,
    "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "open_tree_attr": 467,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "create_module": 174, "get_kernel_syms": 177, "query_module": 178,
    "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163, "settimeofday": 164,
    "clock_settime": 227, "iopl": 172, "ioperm": 173, "syslog": 103, "quotactl": 179,
    "vhangup": 153, "open_by_handle_at": 304, "lookup_dcookie": 212, "uselib": 134,
    "ustat": 136, "sysfs": 139, "nfsservctl": 180, "_sysctl": 156,
}  # fmt: skip

ALLOWED = {
    "read": 0, "write": 1, "openat": 257, "mmap": 9, "execve": 59, "fork": 57, "vfork": 58,
    "ptrace": 101, "process_vm_readv": 310, "kill": 62, "wait4": 61, "prctl": 157,
    "seccomp": 317, "chroot": 161, "name_to_handle_at": 303, "adjtimex": 159,
    "landlock_create_ruleset": 444, "memfd_create": 319, "pidfd_open": 434,
    "futex_waitv": 449, "fchmodat2": 452, "file_setattr": 469,
}  # fmt: skip

CLONE, UNSHARE, SOCKET, SOCKETPAIR, PERSONALITY, CLONE3 = 56, 272, 41, 53, 135, 435
SIGCHLD = 17
CLONE_VM, CLONE_FS, CLONE_FILES, CLONE_THREAD = 0x100, 0x200, 0x400, 0x10000
NAMESPACES = {
    "CLONE_NEWNS": 0x20000,
    "CLONE_NEWCGROUP": 0x2000000,
    "CLONE_NEWUTS": 0x4000000,
    "CLONE_NEWIPC": 0x8000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
CLONE_NEWTIME = 0x80


@frozen
class Insn:
    code: int
    jt: int
    jf: int
    k: int


def dump() -> list[Insn]:
    raw = subprocess.run([HELPER, "seccomp-dump"], capture_output=True, check=True).stdout
    assert len(raw) % 8 == 0 and raw
    return [Insn(*fields) for fields in struct.iter_unpack("=HBBI", raw)]


PROGRAM = dump() if Path(HELPER).exists() else []


def run(nr: int, *args: int, arch: int = AUDIT_ARCH_X86_64) -> int:
    """What the filter answers for one system call (struct seccomp_data, little-endian)."""
    return walk(nr, *args, arch=arch)[0]


def walk(nr: int, *args: int, arch: int = AUDIT_ARCH_X86_64) -> tuple[int, int]:
    """The filter's answer and how many instructions it ran to give it."""
    data = struct.pack("=IIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    a, pc, steps = 0, 0, 0
    while True:
        insn = PROGRAM[pc]
        steps += 1
        if insn.code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            assert insn.k % 4 == 0 and insn.k + 4 <= len(data)
            (a,) = struct.unpack_from("=I", data, insn.k)
            pc += 1
        elif insn.code == 0x06:  # BPF_RET | BPF_K
            return insn.k, steps
        elif insn.code in (0x15, 0x25, 0x35, 0x45):  # BPF_JMP | JEQ, JGT, JGE, JSET (K)
            taken = {
                0x15: a == insn.k,
                0x25: a > insn.k,
                0x35: a >= insn.k,
                0x45: a & insn.k != 0,
            }[insn.code]
            pc += 1 + (insn.jt if taken else insn.jf)
        else:
            raise AssertionError(f"instruction {insn} at {pc} is not one the filter should use")
        assert pc < len(PROGRAM), "ran off the end of the program"


def refused(error: int) -> int:
    return ERRNO | error


def test_the_program_fits_and_ends_in_returns() -> None:
    assert 0 < len(PROGRAM) <= 4096
    assert PROGRAM[-1].code == 0x06


def test_every_number_is_found_by_a_short_search() -> None:
    """A binary search over the rules, not one comparison per rule: the kernel runs the filter
    for every number at each exec (to cache those it always allows)."""
    longest = max(walk(nr)[1] for nr in range(512))
    assert longest <= 24, longest  # one comparison per rule: over 60


@pytest.mark.parametrize("name", sorted(DENIED))
def test_denied_calls_answer_eperm(name: str) -> None:
    assert run(DENIED[name]) == refused(errno.EPERM)


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_everyday_calls_are_allowed(name: str) -> None:
    assert run(ALLOWED[name]) == ALLOW


def test_clone3_and_unknown_numbers_answer_enosys() -> None:
    assert run(CLONE3) == refused(errno.ENOSYS)
    for nr in (470, 511, 1000, X32_BIT - 1):
        assert run(nr) == refused(errno.ENOSYS)


def test_foreign_abis_are_killed() -> None:
    assert run(1, arch=AUDIT_ARCH_I386) == KILL_PROCESS
    for nr in (0, 1, CLONE, UNSHARE, DENIED["bpf"], 512, 0x3FFFFFFF):
        assert run(X32_BIT | nr) == KILL_PROCESS
    assert run(0xFFFFFFFE) == KILL_PROCESS
    assert run(59, arch=0) == KILL_PROCESS


def test_a_call_a_tracer_cancelled_passes() -> None:
    assert run(0xFFFFFFFF) == ALLOW  # number -1: the kernel answers ENOSYS itself


@pytest.mark.parametrize("flag", sorted(NAMESPACES))
def test_no_new_namespace_by_clone_or_unshare(flag: str) -> None:
    value = NAMESPACES[flag]
    assert run(CLONE, value | SIGCHLD) == refused(errno.EPERM)
    assert run(UNSHARE, value) == refused(errno.EPERM)
    assert run(UNSHARE, value | CLONE_FILES) == refused(errno.EPERM)


def test_threads_forks_and_plain_unshare_are_allowed() -> None:
    assert run(CLONE, SIGCHLD) == ALLOW  # fork
    thread = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_THREAD | 0x80000 | 0x200000 | 0x100000
    assert run(CLONE, thread) == ALLOW
    assert run(UNSHARE, CLONE_FILES | CLONE_FS) == ALLOW
    assert run(UNSHARE, CLONE_NEWTIME) == refused(errno.EPERM)  # 0x80 is a namespace for unshare


def test_the_high_word_of_flags_is_not_what_the_kernel_reads() -> None:
    # clone and unshare take the low 32 bits; a namespace flag shifted up creates nothing
    assert run(CLONE, NAMESPACES["CLONE_NEWUSER"] << 32 | SIGCHLD) == ALLOW


@pytest.mark.parametrize("call", [SOCKET, SOCKETPAIR])
def test_socket_families(call: int) -> None:
    for family in (1, 2, 10, 16):  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
        assert run(call, family, 1, 0) == ALLOW
    for family in (0, 3, 5, 17, 21, 29, 30, 31, 38, 40, 44, 45, 46, 255):
        assert run(call, family, 1, 0) == refused(errno.EAFNOSUPPORT), family


def test_personality() -> None:
    for persona in (0, 8, 0x20000, 0x40000, 0x40008, 0xFFFFFFFF):
        assert run(PERSONALITY, persona) == ALLOW, hex(persona)
    for persona in (0x0400000, 0x0100000, 0x0200000, 0x1000000, 0x0000001, 0x0040001):
        assert run(PERSONALITY, persona) == refused(errno.EPERM), hex(persona)
