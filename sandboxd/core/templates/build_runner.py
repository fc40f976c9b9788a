"""Runs one ``RUN`` of a template build as root inside the template being built
(docs/extensions.rst, "Building a template"). A program of its own (the standard library
only), started by the builder as root:

``python -I build_runner.py [--join=FILE]... ROOTFS NETWORK WORKDIR ARGV...``, its environment
the command's; or ``python -I build_runner.py [--join=FILE]... --host ARGV...``: ``ARGV`` on
the host (``FROM debian:<suite>``'s ``mmdebstrap``), in a mount namespace of its own whose
mounts are private (what it mounts, ``/proc`` or ``/dev`` in the root it makes, goes with its
last process, and is never left for the build's removal to walk into). Each ``--join`` names
a file it writes ``0`` into first (a cgroup's ``tasks`` or ``cgroup.procs``): it and all the
command's processes are in the build's cgroup (:mod:`~sandboxd.core.templates.build_limits`)
before any of them starts.

The command runs as uid 0 of a new user namespace whose ids 0 to 65535 are the host's same ids
(the template's files keep their owners), in new mount, PID, IPC and UTS namespaces and, with
``NETWORK`` ``none``, a network namespace of its own with only a loopback. Its root is
``ROOTFS`` (``pivot_root``, the host's root detached: no host path is reachable, so it writes
nothing outside the build's directory), mounted ``nosuid,nodev``, with a new ``/proc`` and a
``/dev`` on a tmpfs holding null, zero, full, random, urandom and tty. Its capabilities are
its user namespace's (it cannot load modules, make devices, mount a host filesystem, or
change the host's network), and of those only Docker's default set (no ``CAP_SYS_ADMIN``).
Its uid 0 is the host's, which ``/proc/sys`` and a few other files of ``/proc`` check
instead of a capability: those are bound read-only (:data:`READ_ONLY_PROC`), and without
``CAP_SYS_ADMIN`` it cannot unmount them. With ``NETWORK`` ``host``, the host's
``/etc/resolv.conf`` is bound over the root's own during the command (when the root has one).

The outer process forks the namespaces' maker, writes its id maps, and exits with the
command's status (128 + the signal when killed). Everything dies with the daemon: each process
has ``PR_SET_PDEATHSIG`` ``SIGKILL``, and the command is the PID namespace's first process.
"""

import ctypes
import os
import select
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
JOIN = "--join="
HOST = "--host"
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
IDS = "0 0 65536\n"
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
READ_ONLY_PROC = ("bus", "fs", "irq", "sys", "sysrq-trigger")
"""What of ``/proc`` is bound read-only (as Docker does): the command's uid 0 is the host's,
which the kernel lets write host-wide settings there (``/proc/sys`` checks the uid only)."""
PR_CAPBSET_DROP = 24
KEPT_CAPABILITIES = frozenset({0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31})
"""Docker's default capabilities (chown, dac_override, fowner, fsetid, kill, setgid, setuid,
setpcap, net_bind_service, net_raw, sys_chroot, mknod, audit_write, setfcap): the command
keeps no other, ``CAP_SYS_ADMIN`` above all (it cannot unmount the read-only binds of
``/proc``; a user namespace it makes sees them locked)."""

libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def mount(  # pragma: no cover - in the build's children (the RUN tests run it)
    source: str, target: str, kind: str | None, flags: int, data: str | None = None
) -> None:
    check(
        libc.mount(
            source.encode(),
            target.encode(),
            kind.encode() if kind else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def die_with_parent() -> None:
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")


def enter_root(rootfs: str, network: str) -> None:  # pragma: no cover - in the children
    """In the new namespaces, as their root: ``rootfs`` becomes ``/``."""
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    mount(rootfs, rootfs, None, MS_BIND | MS_REC)
    mount(rootfs, rootfs, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)
    for name, mode in (("proc", 0o555), ("dev", 0o755)):
        path = os.path.join(rootfs, name)
        if not os.path.isdir(path) and not os.path.islink(path):
            os.mkdir(path, mode)
    proc = os.path.join(rootfs, "proc")
    mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in READ_ONLY_PROC:
        path = os.path.join(proc, name)
        if os.path.exists(path):
            mount(path, path, None, MS_BIND)
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
            mount(path, path, None, flags)
    dev = os.path.join(rootfs, "dev")
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=65536k")
    for name in DEVICES:
        target = os.path.join(dev, name)
        open(target, "w").close()
        mount(os.path.join("/dev", name), target, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, os.path.join(dev, name))
    os.symlink("/proc/self/fd/1", os.path.join(dev, "stdout"))
    os.symlink("/proc/self/fd/2", os.path.join(dev, "stderr"))
    resolv = os.path.join(rootfs, "etc", "resolv.conf")
    if network == "host" and os.path.isfile(resolv) and not os.path.islink(resolv):
        mount("/etc/resolv.conf", resolv, None, MS_BIND)
    os.chdir(rootfs)
    number = SYS_PIVOT_ROOT[os.uname().machine]
    check(libc.syscall(number, b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "umount the host's root")
    os.chdir("/")
    with open("/proc/sys/kernel/cap_last_cap") as file:
        last = int(file.read())
    for capability in range(last + 1):
        if capability not in KEPT_CAPABILITIES:
            check(libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0), "drop a capability")


def command(  # pragma: no cover - in the build's children, which exec or _exit unmeasured
    rootfs: str, network: str, workdir: str, argv: list[str], ready: int, outer: int
) -> None:
    """The namespaces' maker: waits for its id maps, then starts the command as the PID
    namespace's first process and exits with its status.

    Each follows its parent's death (``PR_SET_PDEATHSIG``) only from the moment it asks, and
    a fork or a change of credentials clears the request: a parent that died before is
    checked for after it (the maker's by its pid, ``outer``; the command's, whose parent is
    outside its PID namespace, by the maker's pidfd), else the command outlived its daemon."""
    die_with_parent()
    os.read(ready, 1)
    os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    die_with_parent()
    if os.getppid() != outer:
        os._exit(128 + signal.SIGKILL)  # the outer process died before this one could follow
    maker = os.pidfd_open(os.getpid())
    pid = os.fork()
    if pid == 0:
        try:
            die_with_parent()
            if select.select([maker], [], [], 0)[0]:  # the maker has ended
                os._exit(128 + signal.SIGKILL)
            os.close(maker)
            enter_root(rootfs, network)
            os.makedirs(workdir, 0o755, exist_ok=True)
            os.chdir(workdir)
            if not argv:
                os._exit(0)  # a WORKDIR: its directory made
            os.execvpe(argv[0], argv, dict(os.environ))
        except OSError as e:
            print(f"sandboxd: cannot run {argv[:1]}: {e}", file=sys.stderr, flush=True)
            os._exit(127)
    os._exit(status(os.waitpid(pid, 0)[1]))


def status(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def join_cgroup(arguments: list[str]) -> list[str]:
    """Write ``0`` into the file of each leading ``--join=FILE`` (this process joins the
    cgroup, before it forks); the arguments after them."""
    while arguments and arguments[0].startswith(JOIN):
        with open(arguments.pop(0)[len(JOIN) :], "w") as file:
            file.write("0")
    return arguments


def on_the_host(argv: list[str]) -> None:  # pragma: no cover - it execs: never measured
    """``argv`` started in place of this process, in a mount namespace of its own."""
    try:
        check(libc.unshare(CLONE_NEWNS), "unshare")
        mount("none", "/", None, MS_REC | MS_PRIVATE)
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"sandboxd: cannot run {argv[:1]}: {e}", file=sys.stderr, flush=True)
        os._exit(127)


def main(arguments: list[str]) -> int:
    arguments = join_cgroup(list(arguments))
    parent = os.getppid()
    die_with_parent()  # a daemon killed mid-build takes its build's processes with it
    if os.getppid() != parent:  # pragma: no cover - a race: the daemon died since the spawn
        return 128 + signal.SIGKILL  # it died before this process could follow it
    if arguments[:1] == [HOST]:  # pragma: no cover - it execs: this process is never measured
        on_the_host(arguments[1:])
    rootfs, network, workdir, *argv = arguments
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if network == "none":
        flags |= CLONE_NEWNET
    ready, go = os.pipe()
    made, told = os.pipe()
    outer = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the namespaces' maker, which _exits unmeasured
        os.close(go)
        os.close(made)
        try:
            check(libc.unshare(flags), "unshare")
        except OSError as e:
            print(f"sandboxd: cannot make the build's namespaces: {e}", file=sys.stderr)
            os._exit(125)
        os.write(told, b"x")
        command(rootfs, network, workdir, argv, ready, outer)
    os.close(ready)
    os.close(told)
    if os.read(made, 1):  # pragma: no branch - else only where the kernel refuses the unshare
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as file:
                file.write(IDS)
        os.write(go, b"x")
    return status(os.waitpid(pid, 0)[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
