#!/usr/bin/env python3
"""The spawner prototype's bench (docs/spawner-design.rst); root; not wired into the daemon.

    sudo nice -n 19 python3 bench/spawner/run.py --rounds 300

Builds ``spawner.c`` and the exec helper, makes one sandbox's worth of isolation by hand (a
cgroup in every v1 hierarchy beneath this process's own, namespaces made and pinned by the
helper's own ``namespaces`` step), then times ``true`` from this Python process, interleaved
round by round, the way the daemon would see it (spawn or request, stdout and stderr pipes read
to their end, ``waitpid``):

- ``direct``: ``posix_spawn`` of ``/bin/true`` (no isolation: the spawn floor);
- ``helper``: ``posix_spawn`` of the very argv the isolated daemon spawns today
  (``sandboxd-exec enter 3 PINS.. sandbox UID GID CWD 5 JOINS.. true``);
- ``server``: a request to a per-daemon pre-forked root server, which forks a child doing every
  step of the helper (``spawner.c server``);
- ``zygote``: a request to a per-sandbox zygote already inside the cgroups, the namespaces, the
  uid and the seccomp filter, whose child only does setsid, chdir and exec (``spawner.c zygote``).

Then the helper's steps one by one (``spawner.c steps``), and the memory one idle zygote costs
(``--zygotes`` of them at once: the cgroup's charge and the host's ``MemAvailable``).
Everything it makes is removed at its end; processes are stopped by pid.
"""

import argparse
import contextlib
import ctypes
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
HELPER_SOURCE = REPO / "sandboxd" / "isolation" / "exec" / "sandboxd_exec.c"
UID = 612998
"""Outside every bench daemon's pool (bench/sbench/procs.py) and the default one."""
HIERARCHIES = ("memory", "cpu", "cpuacct", "pids", "freezer")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/user", "LANG": "C.UTF-8"}
MNT_DETACH = 2
libc = ctypes.CDLL("libc.so.6", use_errno=True)


def build(source: Path, target: Path) -> None:
    subprocess.run(
        [
            "nice",
            "-n",
            "19",
            "gcc",
            "-O2",
            "-s",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-static",
            "-o",
            str(target),
            str(source),
        ],
        check=True,
    )


def own_cgroup(controller: str) -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return f"/sys/fs/cgroup/{controller}{path}"
    raise SystemExit(f"no v1 {controller} hierarchy")


class Sandbox:
    """One sandbox's isolation, made by hand the way the daemon makes it."""

    def __init__(self, helper: str, base: Path) -> None:
        self.helper = helper
        self.base = base
        name = f"spawnbench-{os.getpid()}"
        self.cgroups = [os.path.join(own_cgroup(c), name) for c in HIERARCHIES]
        for path in self.cgroups:
            os.mkdir(path)
        memory, _, _, pids, _ = self.cgroups
        Path(memory, "memory.limit_in_bytes").write_text(str(2 << 30))
        Path(pids, "pids.max").write_text("2048")
        self.joins = [os.path.join(p, "tasks") for p in self.cgroups]
        self.nsroot = base / "ns"
        self.nsroot.mkdir(mode=0o700)
        self._mount(str(self.nsroot), str(self.nsroot), 4096)  # MS_BIND
        self._mount(None, str(self.nsroot), 1 << 18)  # MS_PRIVATE
        tmp, work = base / "tmp", base / "work"
        for d in (tmp, work):
            d.mkdir()
            os.chown(d, UID, UID)
        (self.nsroot / "rid").mkdir(mode=0o700)
        done = subprocess.run(
            [helper, "namespaces", str(self.nsroot), "rid", "imn", str(tmp), str(work), "1048576"],
            capture_output=True,
            text=True,
            check=False,
            env={},
        )
        if done.returncode != 0:
            raise SystemExit(f"namespaces: {done.stderr}")
        self.pins = [str(self.nsroot / "rid" / k) for k in ("ipc", "net", "mnt")]
        self.cwd = "/home/user"

    @staticmethod
    def _mount(source: str | None, target: str, flags: int) -> None:
        src = None if source is None else os.fsencode(source)
        if libc.mount(src, os.fsencode(target), None, ctypes.c_ulong(flags), None) != 0:
            raise OSError(ctypes.get_errno(), "mount", target)

    def setup_args(self) -> list[str]:
        """UID GID CWD NJOIN JOIN.. NNS NS.. (spawner.c's arguments)."""
        return [
            str(UID),
            str(UID),
            self.cwd,
            str(len(self.joins)),
            *self.joins,
            str(len(self.pins)),
            *self.pins,
        ]

    def helper_argv(self, argv: Sequence[str]) -> list[str]:
        """What the isolated daemon spawns today (Commands._launch)."""
        return [
            self.helper,
            "enter",
            str(len(self.pins)),
            *self.pins,
            self.helper,
            "--umask=077",
            "--seccomp=default",
            "sandbox",
            str(UID),
            str(UID),
            self.cwd,
            str(len(self.joins)),
            *self.joins,
            *argv,
        ]

    def memory_charge(self) -> int:
        return int(Path(self.cgroups[0], "memory.usage_in_bytes").read_text())

    def close(self) -> None:
        for pin in self.pins:
            libc.umount2(os.fsencode(pin), MNT_DETACH)
            with contextlib.suppress(OSError):
                os.unlink(pin)
        with contextlib.suppress(OSError):
            os.rmdir(self.nsroot / "rid")
        libc.umount2(os.fsencode(str(self.nsroot)), MNT_DETACH)
        for path in self.cgroups:
            for _ in range(100):
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.02)


def drain(out_r: int, err_r: int) -> None:
    open_fds = {out_r, err_r}
    while open_fds:
        ready, _, _ = select.select(list(open_fds), [], [])
        for fd in ready:
            if not os.read(fd, 1 << 16):
                open_fds.discard(fd)
                os.close(fd)


def spawned(argv: Sequence[str], env: dict[str, str]) -> float:
    """posix_spawn (the path reactor.spawnProcess takes), pipes read to EOF, waitpid."""
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, err_w, 2),
    ]
    start = time.perf_counter()
    pid = os.posix_spawn(argv[0], list(argv), env, file_actions=actions)
    os.close(out_w)
    os.close(err_w)
    drain(out_r, err_r)
    _, status = os.waitpid(pid, 0)
    took = time.perf_counter() - start
    assert os.waitstatus_to_exitcode(status) == 0, status
    return took


class Server:
    """A spawner.c server or zygote on one end of a SOCK_SEQPACKET socketpair.

    ``pidfd``: the server answers with the child's pidfd too (``CLONE_PIDFD``), and the child
    is reaped through it (``waitid(P_PIDFD)``). ``join_first``: files to write ``0`` into
    before the server's program starts, so that everything it touches is charged there.
    """

    def __init__(
        self, binary: str, mode: str, setup: list[str], pidfd: bool = False,
        join_first: Sequence[str] = (),
    ) -> None:  # fmt: skip
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {"SPAWNER_FD": str(theirs.fileno())}
        if pidfd:
            env["SPAWNER_PIDFD"] = "1"
        self.pidfd = pidfd

        def join() -> None:
            for path in join_first:
                with open(path, "w") as f:
                    f.write("0\n")

        self.process = subprocess.Popen(
            [binary, mode, *setup],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=join if join_first else None,
        )
        theirs.close()
        self.devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def request(self, argv: Sequence[str], env: dict[str, str]) -> float:
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        body = b"".join(a.encode() + b"\0" for a in argv) + b"\0"
        body += b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
        start = time.perf_counter()
        socket.send_fds(self.sock, [body], [self.devnull, out_w, err_w])
        os.close(out_w)
        os.close(err_w)
        if self.pidfd:
            data, fds, _, _ = socket.recv_fds(self.sock, 4, 1)
        else:
            data, fds = self.sock.recv(4), []
        pid = int.from_bytes(data, sys.byteorder, signed=True)
        assert pid > 0, pid
        drain(out_r, err_r)
        if fds:
            self.last_pidfd_pid = pidfd_pid(fds[0])
            result = os.waitid(os.P_PIDFD, fds[0], os.WEXITED)
            os.close(fds[0])
            assert result is not None and result.si_pid == pid and result.si_status == 0
        else:
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, status
        return time.perf_counter() - start

    def close(self) -> None:
        self.sock.close()
        self.process.wait(10)


def pidfd_pid(fd: int) -> int:
    """The pid a pidfd refers to (``Pid:`` of its fdinfo)."""
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("Pid:"):
            return int(line.split()[1])
    return -1


def summary(name: str, times: list[float]) -> str:
    ms = sorted(t * 1e3 for t in times)

    def p(q: float) -> float:
        return ms[min(len(ms) - 1, int(q * len(ms)))]

    return (
        f"{name:<12} p50 {statistics.median(ms):6.3f} ms  p10 {p(0.1):6.3f}  "
        f"p90 {p(0.9):6.3f}  p99 {p(0.99):6.3f}  min {ms[0]:6.3f}  (n={len(ms)})"
    )


MEMINFO = ("MemAvailable", "KernelStack", "PageTables", "SUnreclaim", "AnonPages")


def meminfo() -> dict[str, int]:
    values = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in MEMINFO:
            values[name] = int(rest.split()[0]) * 1024
    return values


def idle_zygotes(binary: str, sandbox: Sandbox, count: int, join_first: bool) -> str:
    """Start ``count`` zygotes in a memory cgroup of their own (else the sandbox's), let them
    settle, and say what each costs: that cgroup's charge (v1 counts kernel memory too) and
    the host's ``/proc/meminfo``. ``join_first``: each joins that memory cgroup before its
    program starts (as a zygote forked by a server's child that joined first would be), else
    only in its set-up (as one started like today's helper)."""
    memory = os.path.join(sandbox.cgroups[0], "idle")
    os.mkdir(memory)
    setup = sandbox.setup_args()
    setup[4] = os.path.join(memory, "tasks")  # the first join file is the memory hierarchy's

    def usage(name: str) -> int:
        return int(Path(memory, name).read_text())

    try:
        charge0, kmem0, info0 = (
            usage("memory.usage_in_bytes"),
            usage("memory.kmem.usage_in_bytes"),
            meminfo(),
        )
        first = [os.path.join(memory, "tasks")] if join_first else []
        zygotes = [Server(binary, "zygote", setup, join_first=first) for _ in range(count)]
        for z in zygotes:
            z.request(["true"], ENV)  # each is ready once it answered once
        time.sleep(1.0)
        charge1, kmem1, info1 = (
            usage("memory.usage_in_bytes"),
            usage("memory.kmem.usage_in_bytes"),
            meminfo(),
        )
        rollup = Path(f"/proc/{zygotes[0].process.pid}/smaps_rollup").read_text().splitlines()
        rss = [line for line in rollup if line.split(":")[0] in ("Rss", "Pss", "Private_Dirty")]
        for z in zygotes:
            z.close()
    finally:
        for _ in range(100):
            try:
                os.rmdir(memory)
                break
            except OSError:
                time.sleep(0.02)

    def per(a: int, b: int) -> float:
        return (b - a) / count / 1024

    host = ", ".join(f"{k} {per(info0[k], info1[k]):+.1f}" for k in MEMINFO)
    when = "joined before exec" if join_first else "joined in set-up"
    return (
        f"{count} idle zygotes ({when}), KiB each: their memory cgroup's charge"
        f" {per(charge0, charge1):.1f}"
        f" (of which kernel {per(kmem0, kmem1):.1f}); host /proc/meminfo {host}; "
        "one zygote's smaps_rollup " + ", ".join(" ".join(line.split()) for line in rss)
    )


def cgroup2_rows(binary: str, rounds: int) -> None:
    """Joining a v2 cgroup against being cloned into it, where a v2 hierarchy is mounted
    (the hybrid host's ``unified`` one holds no controller: a lower bound of the join)."""
    for mount in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if os.path.exists(os.path.join(mount, "cgroup.controllers")):
            break
    else:
        print("\nno cgroup v2 hierarchy: CLONE_INTO_CGROUP rows skipped")
        return
    own = next(
        line.split(":", 2)[2]
        for line in Path("/proc/self/cgroup").read_text().splitlines()
        if line.startswith("0::")
    )
    path = os.path.join(mount + own, f"spawnbench-{os.getpid()}")
    os.mkdir(path)
    controllers = Path(mount, "cgroup.controllers").read_text().split()
    print(f"\ncgroup v2 at {mount} (controllers: {' '.join(controllers) or 'none'}):")
    sys.stdout.flush()
    try:
        subprocess.run([binary, "cgroup2", str(rounds), path], check=True)
    finally:
        os.rmdir(path)


def twisted_times(
    sandbox: Sandbox, true: str, zygote: Server, rounds: int
) -> dict[str, list[float]]:
    from twisted.internet import reactor

    sys.path.insert(0, str(REPO))
    from bench.spawner import twisted_rows

    result: list[object] = []

    def stop(outcome: object) -> None:
        result.append(outcome)
        reactor.stop()

    d = twisted_rows.rows(reactor, sandbox.helper_argv(["true"]), true, zygote, ENV, rounds)
    d.addBoth(stop)
    reactor.run()
    if not isinstance(result[0], dict):
        raise SystemExit(f"twisted rows: {result[0]}")
    return result[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--zygotes", type=int, default=200)
    parser.add_argument("--twisted", action="store_true", help="also the rows from a reactor")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (cgroups, namespaces, uid drop)")
    base = Path(tempfile.mkdtemp(prefix="spawnbench-"))
    os.chmod(base, 0o755)
    helper, binary = str(base / "sandboxd-exec"), str(base / "spawner")
    build(HELPER_SOURCE, Path(helper))
    build(HERE / "spawner.c", Path(binary))
    sandbox = Sandbox(helper, base)
    servers: list[Server] = []
    try:
        print("load average at start:", Path("/proc/loadavg").read_text().strip())
        server = Server(binary, "server", sandbox.setup_args())
        zygote = Server(binary, "zygote", sandbox.setup_args())
        zygote_pidfd = Server(binary, "zygote", sandbox.setup_args(), pidfd=True)
        servers += [server, zygote, zygote_pidfd]
        true = shutil.which("true") or "/bin/true"
        rows: dict[str, Callable[[], float]] = {
            "direct": lambda: spawned([true], ENV),
            "helper": lambda: spawned(sandbox.helper_argv(["true"]), ENV),
            "session": lambda: spawned([helper, "session", "/", true], ENV),
            "server": lambda: server.request(["true"], ENV),
            "zygote": lambda: zygote.request(["true"], ENV),
            "zygote-pidfd": lambda: zygote_pidfd.request(["true"], ENV),
        }
        for run in rows.values():  # warm up
            for _ in range(10):
                run()
        times: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.rounds):
            for name, run in rows.items():
                times[name].append(run())
        if args.twisted:
            times.update(twisted_times(sandbox, true, zygote, args.rounds))
        for name, ts in times.items():
            print(summary(name, ts))
        print("\nthe helper's steps, in a child forked from a small C process:")
        sys.stdout.flush()
        subprocess.run([binary, "steps", str(args.rounds), *sandbox.setup_args()], check=True)
        cgroup2_rows(binary, args.rounds)
        print()
        for join_first in (False, True):
            print(idle_zygotes(binary, sandbox, args.zygotes, join_first))
        print("load average at end:", Path("/proc/loadavg").read_text().strip())
    finally:
        for s in servers:
            s.close()
        sandbox.close()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
