"""Choosing the bundle at start-up: loud refusals, never a silent fallback to no isolation."""

import os
import socket
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest
from attrs import evolve
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python.threadpool import ThreadPool

from sandboxd.config import Config
from sandboxd.core.layout import Layout
from sandboxd.isolation import layers
from sandboxd.isolation.base import Identity, IsolationUnavailable, plain_env
from sandboxd.isolation.cgroups.cgroup1 import Cgroup1Driver
from sandboxd.isolation.cgroups.cgroup2 import Cgroup2Driver
from sandboxd.isolation.exec.helper import HelperSession, HelperWrapper
from sandboxd.isolation.exec.spawn_server import Answers, Spawner, SpawnServer
from sandboxd.isolation.exec.wrapper import Wrapper, spawn_env
from sandboxd.isolation.exec.zygotes import Zygote, Zygotes
from sandboxd.isolation.fscreds import FsCredentialThreads
from sandboxd.isolation.none import CountingPool, SweptUidPool, live_processes_of
from sandboxd.isolation.select import DAEMON_OOM_SCORE_ADJ, Host, build_isolation, protect_daemon
from sandboxd.isolation.uids import NumericUidPool
from tests.support.kernel_fakes import FakeKernel, write


class Machine:
    """A fake host: mountinfo and /proc/self/cgroup texts, and records of what was changed."""

    def __init__(self, tmp: Path, v2: str | None, v1: bool, euid: int = 0) -> None:
        self.tmp = tmp
        self.oom: list[int] = []
        self.groups: list[list[int]] = []
        mountinfo = []
        proc = []
        self.fake = FakeKernel(tmp / ("v1" if v1 else "cg"), 1 if v1 else 2, euid=euid)
        if v1:
            self.fake.make_root("memory", "cpu,cpuacct", "pids", "cpuset")
            for n, name in enumerate(("memory", "cpu,cpuacct", "pids", "cpuset")):
                point = self.fake.base / name
                mountinfo.append(f"{30 + n} 1 0:{n} / {point} rw - cgroup cgroup rw,{name}")
                proc.append(f"{n + 1}:{name}:/")
        if v2 is not None:
            point = tmp / "cg"
            if v1:
                point.mkdir()
                write(point / "cgroup.controllers", v2)
            else:
                self.fake.make_root()
                write(point / "cgroup.controllers", v2)
                self.fake.spawn(point)
            mountinfo.append(f"40 1 0:40 / {point} rw - cgroup2 cgroup2 rw")
            proc.append("0::/")
        self.files = {
            "/proc/self/mountinfo": "\n".join(mountinfo) + "\n",
            "/proc/self/cgroup": "\n".join(proc) + "\n",
            "/proc/cmdline": "root=/dev/vda rw quiet\n",
            "/proc/sys/fs/protected_symlinks": "1\n",
            "/proc/sys/fs/protected_hardlinks": "1\n",
            "/proc/sys/fs/protected_regular": "2\n",
        }
        self.ran: list[list[str]] = []
        self.seccomp_check = (0, "seccomp: enforced")

    def run(self, argv: Sequence[str]) -> tuple[int, str]:
        self.ran.append(list(argv))
        return self.seccomp_check

    def read(self, path: str) -> str:
        if path not in self.files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return self.files[path]

    def host(self, missing: str | None = None, helper: str | None = None) -> Host:
        """The host; without ``helper``, the exec helper is missing (the shell chain is used)."""

        def which(name: str) -> str:
            if name == missing:
                raise IsolationUnavailable(f"{name} not found (install util-linux)")
            return f"/usr/bin/{name}"

        return Host(
            kernel=self.fake.kernel(),
            read=self.read,
            which=which,
            set_oom_score_adj=self.oom.append,
            setgroups=self.groups.append,
            fsids=lambda: "libc",  # type: ignore[arg-type,return-value]
            helper=helper or str(self.tmp / "no-such-helper"),
            lstat=fake_lstat,
            run=self.run,
        )


def stat_of(mode: int, uid: int = 0) -> os.stat_result:
    return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))


HELPER_FILES = {
    "/opt/sd/sandboxd-exec": stat_of(stat.S_IFREG | 0o755),
    "/opt/sd": stat_of(stat.S_IFDIR | 0o755),
    "/opt/user/sandboxd-exec": stat_of(stat.S_IFREG | 0o755, uid=1000),
    "/opt/user": stat_of(stat.S_IFDIR | 0o755, uid=1000),
    "/opt/open/sandboxd-exec": stat_of(stat.S_IFREG | 0o755),
    "/opt/open": stat_of(stat.S_IFDIR | 0o777),
    "/opt/plain/sandboxd-exec": stat_of(stat.S_IFREG | 0o644),
    "/opt/plain": stat_of(stat.S_IFDIR | 0o755),
}


def fake_lstat(path: str) -> os.stat_result:
    if path not in HELPER_FILES:
        raise FileNotFoundError(2, "No such file or directory", path)
    return HELPER_FILES[path]


def config(tmp: Path, isolation: str, seccomp: str = "off", **more: str) -> Config:
    """The configuration of one test; the seccomp filter (which needs the helper) off unless
    the test is about it."""
    return Config.load(
        {
            "SANDBOXD_ISOLATION": isolation,
            "SANDBOXD_ROOT": str(tmp / "root"),
            "SANDBOXD_UID_MIN": "300000",
            "SANDBOXD_UID_MAX": "300009",
            "SANDBOXD_SECCOMP": seccomp,
            **{f"SANDBOXD_{name.upper()}": value for name, value in more.items()},
        }
    )


POOL = ThreadPool()
SANDBOX = Identity(300001, 300001)


def test_none_only_when_named_and_touches_nothing(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2=None, v1=False, euid=1000)
    iso = build_isolation(config(tmp_path, "none"), Clock(), POOL, machine.host())
    assert iso.name == "none" and not iso.owns_files
    assert isinstance(iso.uids, CountingPool) and iso.uids.total == 10
    assert iso.spawn_env is plain_env
    env = {"A": "1"}
    assert iso.spawn_env(env) == env and iso.spawn_env(env) is not env
    assert machine.oom == [] and machine.groups == []


@pytest.mark.parametrize("mode", ["auto", "cgroup2", "cgroup1"])
def test_isolation_needs_root_even_for_auto(tmp_path: Path, mode: str) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False, euid=1000)
    with pytest.raises(IsolationUnavailable, match=f"isolation {mode} needs root .*uid 1000"):
        build_isolation(config(tmp_path, mode), Clock(), POOL, machine.host())
    assert machine.oom == []


@pytest.mark.parametrize("program", ["setpriv", "setsid"])
def test_refuses_without_util_linux(tmp_path: Path, program: str) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    with pytest.raises(IsolationUnavailable, match=f"{program} not found"):
        build_isolation(config(tmp_path, "auto"), Clock(), POOL, machine.host(missing=program))


def test_auto_prefers_v2_with_the_controllers(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="cpuset cpu io memory pids", v1=False)
    clock = Clock()
    iso = build_isolation(config(tmp_path, "auto"), clock, POOL, machine.host())
    assert iso.name == "cgroup2" and isinstance(iso.cgroups, Cgroup2Driver)
    assert iso.owns_files
    assert isinstance(iso.uids, NumericUidPool) and (iso.uids.uid_min, iso.uids.total) == (
        300000,
        10,
    )
    assert isinstance(iso.fs, FsCredentialThreads) and iso.fs.pool is POOL
    assert iso.fs.ids == "libc"
    assert isinstance(iso.wrap, Wrapper) and iso.wrap.programs.setpriv == "/usr/bin/setpriv"
    assert iso.spawn_env is spawn_env
    assert Path(iso.cgroups.instance).is_dir()  # preflight ran
    assert machine.oom == [DAEMON_OOM_SCORE_ADJ] and machine.groups == [[]]


def test_a_refusal_after_the_preflight_removes_the_instance_it_made(tmp_path: Path) -> None:
    """The network policy is checked once the driver is prepared: refusing it must not
    leave the instance cgroup behind."""
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    refused = config(tmp_path, "cgroup2", network="none", namespaces="ipc")
    with pytest.raises(IsolationUnavailable, match="SANDBOXD_NETWORK: network mode none"):
        build_isolation(refused, Clock(), POOL, machine.host())
    iso = build_isolation(config(tmp_path, "cgroup2"), Clock(), POOL, machine.host())
    assert isinstance(iso.cgroups, Cgroup2Driver)
    assert iso.cgroups.made == [iso.cgroups.instance]  # made by this build, not left by the first


def test_auto_takes_v1_on_a_hybrid_host(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="hugetlb", v1=True)
    iso = build_isolation(config(tmp_path, "auto"), Clock(), POOL, machine.host())
    assert iso.name == "cgroup1" and isinstance(iso.cgroups, Cgroup1Driver)
    assert machine.oom == [DAEMON_OOM_SCORE_ADJ]


def test_auto_takes_v1_without_any_cgroup2_mount(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2=None, v1=True)
    assert build_isolation(config(tmp_path, "auto"), Clock(), POOL, machine.host()).name == (
        "cgroup1"
    )


def test_auto_refuses_in_one_line_naming_both_reasons(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="memory pids", v1=False)
    with pytest.raises(IsolationUnavailable) as caught:
        build_isolation(config(tmp_path, "auto"), Clock(), POOL, machine.host())
    message = str(caught.value)
    assert message.startswith("no usable cgroup hierarchy: cgroup2: controllers cpu not delegated")
    assert "cgroup1: no memory cpu pids hierarchy is mounted" in message
    assert "\n" not in message and machine.oom == []


def test_named_drivers_are_taken_or_refused(tmp_path: Path) -> None:
    hybrid = Machine(tmp_path, v2="hugetlb", v1=True)
    with pytest.raises(IsolationUnavailable, match="cgroup2: controllers memory cpu pids"):
        build_isolation(config(tmp_path, "cgroup2"), Clock(), POOL, hybrid.host())
    assert build_isolation(config(tmp_path, "cgroup1"), Clock(), POOL, hybrid.host()).name == (
        "cgroup1"
    )
    pure = Machine(tmp_path / "pure", v2="memory cpu pids", v1=False)
    with pytest.raises(IsolationUnavailable, match="cgroup1: no memory cpu pids"):
        build_isolation(config(tmp_path, "cgroup1"), Clock(), POOL, pure.host())
    assert build_isolation(config(tmp_path, "cgroup2"), Clock(), POOL, pure.host()).name == (
        "cgroup2"
    )


def test_default_host_is_the_real_machine() -> None:
    host = Host()
    assert host.kernel.geteuid() == os.geteuid()
    assert host.read("/proc/self/mountinfo")
    current = int(host.read("/proc/self/oom_score_adj"))
    host.set_oom_score_adj(current)  # writes the value it already has: changes nothing
    assert int(host.read("/proc/self/oom_score_adj")) == current


def test_daemon_protection_is_best_effort() -> None:
    seen: list[int] = []
    assert protect_daemon(seen.append) is True
    assert seen == [DAEMON_OOM_SCORE_ADJ]

    def refused(_: int) -> None:
        raise PermissionError(13, "Permission denied")

    assert protect_daemon(refused) is False


def test_build_goes_on_when_the_daemon_cannot_be_protected(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)

    def refused(_: int) -> None:
        raise PermissionError(13, "Permission denied")

    host = evolve(machine.host(), set_oom_score_adj=refused)
    assert build_isolation(config(tmp_path, "auto"), Clock(), POOL, host).name == "cgroup2"


def test_the_helper_replaces_the_shell_chain_when_only_root_can_change_it(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    for missing in ("setpriv", "setsid"):  # not needed with the helper
        host = machine.host(missing=missing, helper="/opt/sd/sandboxd-exec")
        iso = build_isolation(config(tmp_path, "auto"), Clock(), POOL, host)
        assert isinstance(iso.wrap, HelperWrapper)
        assert iso.wrap.helper == "/opt/sd/sandboxd-exec"
        # execs by default: a zygote per sandbox (SANDBOXD_SPAWNER=zygote)
        served = " (execs: a zygote per sandbox, through its spawn server)"
        assert iso.exec_chain == "helper /opt/sd/sandboxd-exec" + served
        assert iso.spawn_env is spawn_env
        # the daemon's own work as a sandbox: the same chain, and not ptrace-able
        assert iso.own_work_wrap == evolve(iso.wrap, no_ptrace=True)
        sandbox = iso.attach("0123456789abcdef", SANDBOX, Layout(str(tmp_path), False))
        assert sandbox.start_argv("/w", ["/bin/x"], own_work=True)[3] == "--no-ptrace"
        assert "--no-ptrace" not in sandbox.start_argv("/w", ["/bin/x"])
        # its cgroup's join files, derived once for all its commands
        assert sandbox.join_files is sandbox.join_files
        assert sandbox.join_files == tuple(iso.cgroups.join_files("0123456789abcdef"))
        joins = sandbox.start_argv("/w", ["/bin/x"])
        assert joins[joins.index(str(len(sandbox.join_files))) + 1 :][:1] == [sandbox.join_files[0]]


@pytest.mark.parametrize("place", ["user", "open", "plain", "missing"])
def test_a_helper_others_could_change_is_not_run_as_root(tmp_path: Path, place: str) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    host = machine.host(helper=f"/opt/{place}/sandboxd-exec")
    iso = build_isolation(config(tmp_path, "auto"), Clock(), POOL, host)
    assert isinstance(iso.wrap, Wrapper)
    assert iso.exec_chain == "shell"
    assert iso.own_work_wrap is None  # the shell chain has no such step (nor a filter)


@pytest.mark.parametrize(("place", "used"), [("sd", True), ("user", True), ("plain", False)])
def test_none_uses_the_helper_when_it_is_executable(tmp_path: Path, place: str, used: bool) -> None:
    machine = Machine(tmp_path, v2=None, v1=False, euid=1000)
    host = machine.host(helper=f"/opt/{place}/sandboxd-exec")
    iso = build_isolation(config(tmp_path, "none"), Clock(), POOL, host)
    assert isinstance(iso.wrap, HelperSession) is used
    assert iso.exec_chain == (f"helper /opt/{place}/sandboxd-exec" if used else "shell")


@pytest.mark.parametrize(("kinds", "kept"), [("ipc,net", []), ("ipc,mount", ["/tmp/kept"])])
def test_directories_are_kept_only_for_a_mount_namespace(
    tmp_path: Path, kinds: str, kept: list[str]
) -> None:
    """A state root inside /tmp is bound back into each sandbox's own /tmp."""
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    host = machine.host(helper="/opt/sd/sandboxd-exec")
    settings = config(tmp_path, "auto", namespaces=kinds, root="/tmp/kept/root")
    iso = build_isolation(settings, Clock(), POOL, host)
    assert iso.namespaces.kinds == frozenset(kinds.split(","))
    assert iso.namespaces.keep == kept


@pytest.mark.parametrize(
    ("mode", "helper", "served"),
    [
        ("server", "/opt/sd/sandboxd-exec", True),
        ("helper", "/opt/sd/sandboxd-exec", False),
        ("server", "/opt/user/sandboxd-exec", False),  # the shell chain: nothing to serve
    ],
)
def test_the_spawn_server_is_the_helpers_when_asked_for(
    tmp_path: Path, mode: str, helper: str, served: bool
) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    settings = evolve(config(tmp_path, "auto"), spawner=mode)
    iso = build_isolation(settings, Clock(), POOL, machine.host(helper=helper))
    assert isinstance(iso.spawn_server, SpawnServer) is served
    assert iso.exec_chain.endswith("(execs: its spawn server)") is served
    assert getattr(iso.spawn_server, "helper", helper) == helper
    assert getattr(iso.spawn_server, "pid", None) is None  # started at the first exec


def test_zygotes_come_with_their_spawn_server_and_go_with_the_daemon(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    settings = evolve(config(tmp_path, "auto"), spawner="zygote", zygote_quiet=7.0, zygotes_max=9)
    iso = build_isolation(settings, Clock(), POOL, machine.host(helper="/opt/sd/sandboxd-exec"))
    assert iso.exec_chain.endswith("(execs: a zygote per sandbox, through its spawn server)")
    zygotes = iso.zygotes
    assert isinstance(zygotes, Zygotes) and zygotes.server is iso.spawn_server
    assert (zygotes.quiet, zygotes.limit) == (7.0, 9)
    spawner = iso.spawner(Clock())  # type: ignore[arg-type]
    assert isinstance(spawner, Spawner) and spawner.zygotes is zygotes
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    clock = Clock()
    answers = Answers(reactor, ours, lambda: None)
    zygotes.live["a"] = Zygote(1, answers, quiet=clock.callLater(7, lambda: None))
    iso.close()
    assert zygotes.live == {} and theirs.recv(1) == b"", "retired: its socket ended"
    assert clock.getDelayedCalls() == []
    theirs.close()
    server = evolve(settings, spawner="server")
    assert build_isolation(server, Clock(), POOL, machine.host()).zygotes is None


def test_none_has_no_spawn_server(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2=None, v1=False, euid=1000)
    settings = evolve(config(tmp_path, "none"), spawner="server")
    iso = build_isolation(settings, Clock(), POOL, machine.host(helper="/opt/sd/sandboxd-exec"))
    assert iso.spawn_server is None


@pytest.mark.parametrize(
    ("helper", "chain"), [("/opt/sd/sandboxd-exec", "helper"), (None, "shell")]
)
def test_none_as_root_never_runs_a_command_as_root(
    tmp_path: Path, helper: str | None, chain: str
) -> None:
    """Each sandbox gets a uid of the pool, its commands drop to it, its file calls run as it;
    no cgroup, no namespace, no filter; ``/healthz`` lists ``isolation.uid``."""
    machine = Machine(tmp_path, v2=None, v1=False, euid=0)
    host = machine.host(helper=helper or "/opt/user/sandboxd-exec")
    iso = build_isolation(config(tmp_path, "none", seccomp="default"), Clock(), POOL, host)
    assert iso.name == "none" and iso.owns_files
    assert isinstance(iso.uids, SweptUidPool) and iso.uids.total == 10
    assert isinstance(iso.fs, FsCredentialThreads)
    assert iso.spawn_env is spawn_env
    assert iso.layers == (layers.UID, layers.UMASK)
    assert iso.namespaces.kinds == frozenset()
    assert machine.groups == [[]] and machine.oom == [] and machine.ran == []  # no filter check
    if chain == "helper":
        assert isinstance(iso.wrap, HelperWrapper) and not iso.wrap.seccomp
        assert iso.exec_chain == f"helper {helper}"
    else:
        assert isinstance(iso.wrap, Wrapper) and iso.exec_chain == "shell"
    loose = build_isolation(config(tmp_path, "none", umask="022"), Clock(), POOL, host)
    assert loose.layers == (layers.UID,)


def test_a_released_uid_of_none_as_root_is_swept_of_its_processes() -> None:
    running = {300001: [11, 12], 300002: [21]}
    killed: list[tuple[int, int]] = []

    def kill(pid: int, signal_number: int) -> None:
        killed.append((pid, signal_number))
        if pid == 12:
            raise ProcessLookupError  # ended by itself meanwhile
        running[300001] = [13] if pid == 11 else []  # 11 forked 13 before it died

    pool = SweptUidPool(300001, 300002, lambda uid: list(running.get(uid, [])), kill)
    first = pool.allocate()
    pool.release(first)
    assert killed == [(11, 9), (12, 9), (13, 9)]
    assert pool.free == 2
    second = pool.allocate()
    stubborn = SweptUidPool(300001, 300002, lambda uid: [99], lambda pid, sig: None)
    held = stubborn.allocate()
    with pytest.raises(OSError, match="uid 300001 still runs processes after 100 sweeps"):
        stubborn.release(held)
    assert stubborn.free == 1  # kept out of the pool
    assert second.uid == 300002


def test_live_processes_of_reads_real_uids_and_skips_zombies(tmp_path: Path) -> None:
    for pid, uid, state in ((5, 300001, "S (sleeping)"), (6, 300001, "Z (zombie)"), (7, 0, "R")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(
            f"Name:\tx\nState:\t{state}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        )
    (tmp_path / "8").mkdir()  # gone while looked at: no status
    (tmp_path / "self").mkdir()
    assert live_processes_of(300001, str(tmp_path)) == [5]


@pytest.mark.parametrize(("policy", "offered"), [("0\n", True), ("1\n", True), ("2\n", False)])
def test_no_ptrace_only_where_the_kernel_executes_memfds(
    tmp_path: Path, policy: str, offered: bool
) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    machine.files["/proc/sys/vm/memfd_noexec"] = policy
    with capturedLogs() as events:
        iso = build_isolation(
            config(tmp_path, "auto"), Clock(), POOL, machine.host(helper="/opt/sd/sandboxd-exec")
        )
    assert isinstance(iso.wrap, HelperWrapper) and not iso.wrap.no_ptrace
    assert iso.own_work_wrap == (evolve(iso.wrap, no_ptrace=True) if offered else None)
    said = [e["log_format"] for e in events if "memfd_noexec" in e.get("log_format", "")]
    assert len(said) == (0 if offered else 1)
