"""Real-kernel tests of the isolation drivers, as root, no fakes: the cgroup v1 driver here.

:class:`DriverBehaviour` is the behaviour suite both drivers must pass (``test_drivers_v2``
runs it on cgroup v2, in the VM of ``tests/vm/run.sh``). Each test gets a bundle made by
``build_isolation`` for a fresh state root, so its cgroups live in an instance directory of
their own beneath this process's own cgroup in each hierarchy; the fixture kills and removes
every cgroup it made, whatever happened. Hostile commands run under ``timeout -s KILL`` and a
per-uid process cap, so a driver bug fails the test instead of hurting the machine.

Only the daemon's own process state is left alone (``oom_score_adj``, supplementary groups):
those are injected no-ops.
"""

import contextlib
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from attrs import define, field
from twisted.internet import reactor
from twisted.internet.defer import Deferred, succeed
from twisted.python.threadpool import ThreadPool

from sandboxd.config import Config
from sandboxd.core.layout import Layout
from sandboxd.isolation.base import Identity, Isolation, Limits
from sandboxd.isolation.cgroups.cgfiles import read_pids
from sandboxd.isolation.cgroups.cgroup1 import Cgroup1Driver
from sandboxd.isolation.cgroups.cgroup2 import Cgroup2Driver
from sandboxd.isolation.cgroups.hierarchy import parse_mountinfo, parse_proc_cgroup
from sandboxd.isolation.exec.wrapper import JOIN_FAILED
from sandboxd.isolation.select import Host, build_isolation

pytestmark = pytest.mark.kernel

LIMITS = Limits(memory_bytes=50 << 20, cpu_cores=0.2, pids=20)
BASE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "dumb", "HOME": "/"}
UID_BASE = random.randrange(201000, 209000, 10)
"""Sandbox uids of this run: random, so concurrent runs on one machine rarely share one."""


def own_view() -> tuple[list, dict[str, str]]:
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    return mounts, parse_proc_cgroup(Path("/proc/self/cgroup").read_text())


def driver_problem(mode: str) -> str | None:
    """Why the ``cgroup1``/``cgroup2`` driver cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root"
    mounts, own = own_view()
    try:
        if mode == "cgroup2":
            if set(own) != {""}:
                return "not on a pure cgroup v2 hierarchy"
            return Cgroup2Driver.locate(mounts, own, None, "/x", reactor, None).problem()  # type: ignore[arg-type]
        Cgroup1Driver.locate(mounts, own, None, "/x", reactor, None)  # type: ignore[arg-type]
    except Exception as e:
        return str(e)
    return None


@define
class Bundle:
    """One isolation bundle under test, and what the test made with it."""

    isolation: Isolation
    state_root: Path
    pool: ThreadPool
    rids: list[str] = field(factory=list)
    next_uid: int = UID_BASE

    def sandbox(self, limits: Limits = LIMITS) -> tuple[str, Identity]:
        rid = os.urandom(8).hex()
        self.isolation.cgroups.create(rid, limits)
        self.rids.append(rid)
        identity = Identity(self.next_uid, self.next_uid)
        self.next_uid += 1
        return rid, identity

    def run(
        self,
        rid: str,
        identity: Identity,
        argv: Sequence[str],
        env: Mapping[str, str] = BASE_ENV,
        timeout: float = 60,
        preexec: Callable[[], None] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Spawn ``argv`` the way the daemon does: the wrapper's argv, the carried env."""
        iso = self.isolation
        wrapped = iso.wrap(identity, iso.cgroups.join_files(rid), "/", argv)
        return subprocess.run(
            wrapped,
            env=iso.spawn_env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd="/",
            preexec_fn=preexec,
        )

    def cleanup(self) -> None:
        cgroups = self.isolation.cgroups
        for rid in sorted(set(self.rids) | set(cgroups.leftovers())):
            pytest_twisted.blockon(cgroups.kill(rid))
            cgroups.remove(rid)
        cgroups.remove_instance()
        if self.pool.started:
            self.pool.stop()


def make_bundle(mode: str, **settings: str) -> Iterator[Bundle]:
    problem = driver_problem(mode)
    if problem is not None:
        pytest.skip(f"{mode} driver unavailable here: {problem}")
    state_root = Path(tempfile.mkdtemp(prefix="sandboxd-kernel-"))
    config = Config.load(
        {"SANDBOXD_ISOLATION": mode, "SANDBOXD_ROOT": str(state_root)}
        | {f"SANDBOXD_{name.upper()}": value for name, value in settings.items()}
    )
    pool = ThreadPool(minthreads=1, maxthreads=4, name="kernel-test-files")
    host = Host(set_oom_score_adj=lambda _: None, setgroups=lambda _: None)
    bundle = Bundle(build_isolation(config, reactor, pool, host), state_root, pool)
    try:
        yield bundle
    finally:
        bundle.cleanup()
        os.rmdir(state_root)


def lower_own_oom_score_adj() -> None:
    """In the spawned child only: what the daemon does to itself (the wrapper must undo it).

    Needs ``CAP_SYS_RESOURCE``, which some containers withhold from root: then the child keeps
    the runner's value and the check below proves less.
    """
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("-500")


def shell_status(returncode: int) -> int:
    """A subprocess return code as the shell (and the exec stream) reports it: 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


AFFINITY = """
import os, sys
try:
    os.sched_setaffinity(0, {int(cpu) for cpu in sys.argv[1].split(",")})
except OSError as e:
    print("refused", e.errno)
print(",".join(map(str, sorted(os.sched_getaffinity(0)))))
"""
"""Asks for the CPUs of its first argument, then prints its CPUs (and a refusal first)."""


def move_to(bundle: Bundle, box: tuple[str, Identity], cpus: set[int]) -> list[str]:
    """What a process of sandbox ``box`` says when it asks to run on ``cpus``."""
    wanted = ",".join(map(str, sorted(cpus)))
    done = bundle.run(*box, ["timeout", "-s", "KILL", "20", "python3", "-c", AFFINITY, wanted])
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


ONE_CORE = Limits(memory_bytes=50 << 20, cpu_cores=1.0, pids=20)


class DriverBehaviour:
    """What every cgroup driver must do on a real kernel. Subclasses provide ``bundle`` (and
    ``mode``, the driver's name)."""

    mode: str

    @pytest.fixture
    def shared(self) -> Iterator[Bundle]:
        """A bundle of the same driver with ``SANDBOXD_CPU_PLACEMENT=shared``."""
        yield from make_bundle(self.mode, cpu_placement="shared")

    def test_sandboxes_of_one_core_keep_to_cpus_of_their_own(
        self, bundle: Bundle, shared: Bundle
    ) -> None:
        """CPU placement: two sandboxes of one core each run on different CPUs, and a process
        of either that asks for the other's CPU is refused (the cpuset is the cgroup's, not
        the process's). With ``SANDBOXD_CPU_PLACEMENT=shared`` both run everywhere and the
        same request moves the process (the protection off)."""
        everywhere = os.sched_getaffinity(0)
        if len(everywhere) < 2:
            pytest.skip("one CPU: there is nothing to place")
        first, second = bundle.sandbox(ONE_CORE), bundle.sandbox(ONE_CORE)
        (own,) = [int(c) for c in move_to(bundle, first, everywhere)[-1].split(",")]
        (other,) = [int(c) for c in move_to(bundle, second, everywhere)[-1].split(",")]
        assert own != other
        assert bundle.isolation.cgroups.stats(first[0]).cpus == (own,)
        assert move_to(bundle, first, {other}) == ["refused", "22", str(own)]
        assert move_to(bundle, first, everywhere) == [str(own)]
        first, second = shared.sandbox(ONE_CORE), shared.sandbox(ONE_CORE)
        all_cpus = ",".join(map(str, sorted(everywhere)))
        assert move_to(shared, first, everywhere) == [all_cpus]
        assert move_to(shared, second, everywhere) == [all_cpus]
        assert move_to(shared, first, {other}) == [str(other)]

    def test_commands_run_as_the_sandbox_never_root(self, bundle: Bundle) -> None:
        rid, identity = bundle.sandbox()
        script = "id -u; id -g; id -G; grep -E '^(NoNewPrivs|CapEff)' /proc/self/status"
        done = bundle.run(rid, identity, ["sh", "-c", script], preexec=lower_own_oom_score_adj)
        assert done.returncode == 0, done.stderr
        uid, gid, groups, *status = done.stdout.splitlines()
        assert (int(uid), int(gid), groups) == (identity.uid, identity.gid, str(identity.gid))
        assert dict(line.split(":\t") for line in status) == {
            "NoNewPrivs": "1",
            "CapEff": "0000000000000000",
        }

    def test_oom_score_adj_is_reset_and_the_cgroup_joined_first(self, bundle: Bundle) -> None:
        rid, identity = bundle.sandbox()
        done = bundle.run(
            rid,
            identity,
            ["sh", "-c", "cat /proc/self/oom_score_adj /proc/self/cgroup"],
            preexec=lower_own_oom_score_adj,
        )
        oom, *cgroups = done.stdout.splitlines()
        assert oom == "0"
        joined = [line for line in cgroups if line.endswith(f"/{rid}")]
        assert len(joined) == len(bundle.isolation.cgroups.join_files(rid))

    @pytest_twisted.ensureDeferred
    async def test_a_join_that_fails_never_starts_the_command(self, bundle: Bundle) -> None:
        rid, identity = bundle.sandbox()
        await bundle.isolation.cgroups.kill(rid)
        bundle.isolation.cgroups.remove(rid)
        done = bundle.run(rid, identity, ["sh", "-c", "echo ran"])
        assert done.returncode == JOIN_FAILED
        assert "sandboxd-exec: cannot join cgroup" in done.stderr
        assert done.stdout == ""

    @pytest.mark.parametrize("env", [BASE_ENV, {**BASE_ENV, "LD_LIBRARY_PATH": "/nowhere"}])
    def test_exit_codes_of_missing_and_non_executable_commands(
        self, bundle: Bundle, env: dict[str, str]
    ) -> None:
        rid, identity = bundle.sandbox()
        assert bundle.run(rid, identity, ["no-such-command-xyz"], env).returncode == 127
        assert bundle.run(rid, identity, ["/etc/passwd"], env).returncode == 126
        assert bundle.run(rid, identity, ["sh", "-c", "exit 7"], env).returncode == 7

    def test_the_root_stage_never_sees_the_command_environment(self, bundle: Bundle) -> None:
        rid, identity = bundle.sandbox()
        env = {**BASE_ENV, "LD_PRELOAD": "/nonexistent/evil.so"}
        done = bundle.run(rid, identity, ["sh", "-c", 'echo "$LD_PRELOAD"'], env)
        assert done.stdout == "/nonexistent/evil.so\n"
        # ld.so complains once per program started with LD_PRELOAD set: the command alone,
        # never the root sh, setsid or setpriv, nor the shell that unpacks the environment.
        assert done.stderr.count("cannot be preloaded") == 1, done.stderr

    def test_memory_bomb_is_oom_killed(self, bundle: Bundle) -> None:
        rid, identity = bundle.sandbox()
        bomb = ["timeout", "-s", "KILL", "60", "dd", "if=/dev/zero", "of=/dev/null", "bs=200M"]
        done = bundle.run(rid, identity, [*bomb, "count=1"])
        assert shell_status(done.returncode) == 137, done.stderr
        stats = bundle.isolation.cgroups.stats(rid)
        assert stats.oom_kills == 1
        assert stats.memory_peak_bytes <= LIMITS.memory_bytes  # type: ignore[operator]

    def test_fork_bomb_is_stopped_at_pids_max(self, bundle: Bundle) -> None:
        rid, identity = bundle.sandbox()
        loop = (
            "i=0; while [ $i -lt 100 ]; do sleep 60 >/dev/null 2>&1 & i=$((i + 1)); echo $i; done"
        )
        done = bundle.run(
            rid,
            identity,
            ["timeout", "-s", "KILL", "30", "prlimit", "--nproc=200", "sh", "-c", loop],
        )
        started = [int(n) for n in done.stdout.split()]
        assert done.returncode != 0
        assert 10 <= max(started, default=0) < LIMITS.pids  # type: ignore[operator]
        assert bundle.isolation.cgroups.stats(rid).pids <= LIMITS.pids  # type: ignore[operator]

    def test_cpu_is_held_to_its_quota(self, bundle: Bundle) -> None:
        rid, identity = bundle.sandbox()
        before = bundle.isolation.cgroups.stats(rid).cpu_usec
        started = time.monotonic()
        spin = ["timeout", "-s", "KILL", "2", "sh", "-c", "while :; do :; done"]
        done = bundle.run(rid, identity, spin)
        wall = time.monotonic() - started
        assert shell_status(done.returncode) == 137
        ratio = (bundle.isolation.cgroups.stats(rid).cpu_usec - before) / 1e6 / wall
        print(f"\ncpu 0.2 cores: measured CPU/wall {ratio:.3f}")
        assert 0.08 <= ratio <= 0.32

    @pytest_twisted.ensureDeferred
    async def test_kill_reaches_double_forked_daemons_and_remove_cleans_up(
        self, bundle: Bundle
    ) -> None:
        rid, identity = bundle.sandbox()
        daemon = "setsid -f sh -c 'echo $$; exec sleep 1000 >/dev/null 2>&1'; sleep 0.2"
        done = bundle.run(rid, identity, ["sh", "-c", daemon])
        pid = int(done.stdout.split()[0])
        cgroups = bundle.isolation.cgroups
        assert not dead(pid)
        assert pid in read_pids(cgroups.join_files(rid))
        started = time.monotonic()
        await cgroups.kill(rid)
        latency = time.monotonic() - started
        print(f"\nkill latency ({cgroups.name}, 1 process): {latency * 1000:.1f} ms")
        assert dead(pid)
        cgroups.remove(rid)
        assert all(not os.path.exists(os.path.dirname(p)) for p in cgroups.join_files(rid))
        assert rid not in cgroups.leftovers()

    @pytest_twisted.ensureDeferred
    async def test_a_process_that_joins_after_the_kill_is_killed_before_the_removal(
        self, bundle: Bundle, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An exec's helper or a zygote whose start was under way at a sandbox's kill joins
        its cgroup after the kill found it empty: the sandbox's disposal kills it as well, and
        the cgroup is still removed."""
        rid, _ = bundle.sandbox()
        iso = bundle.isolation
        late = subprocess.Popen(["sleep", "1000"], stdin=subprocess.DEVNULL)
        namespaces = type(iso.namespaces)
        unpin = namespaces.remove

        def join_then_unpin(self: Any, rid: str) -> None:
            for path in iso.cgroups.join_files(rid):
                Path(path).write_text(str(late.pid))
            unpin(self, rid)

        monkeypatch.setattr(namespaces, "remove", join_then_unpin)
        layout = Layout(str(bundle.state_root), owns_files=False)
        os.mkdir(layout.directory(rid))

        def at_once(work: Callable[[str], None], rid: str) -> Deferred[None]:
            work(rid)
            return succeed(None)

        try:
            await iso.dispose_leftover(rid, layout, at_once)
        finally:
            if not dead(late.pid):
                late.kill()
        assert late.wait(timeout=30) == -signal.SIGKILL
        assert not any(os.path.exists(os.path.dirname(p)) for p in iso.cgroups.join_files(rid))
        assert not os.path.exists(layout.directory(rid))

    @pytest_twisted.ensureDeferred
    async def test_kill_latency_with_many_processes(self, bundle: Bundle) -> None:
        rid, identity = bundle.sandbox(Limits(LIMITS.memory_bytes, None, 100))
        spawn = "i=0; while [ $i -lt 50 ]; do sleep 1000 >/dev/null 2>&1 & i=$((i + 1)); done"
        bundle.run(rid, identity, ["sh", "-c", spawn])
        cgroups = bundle.isolation.cgroups
        assert len(read_pids(cgroups.join_files(rid))) == 50
        started = time.monotonic()
        await cgroups.kill(rid)
        latency = time.monotonic() - started
        print(f"\nkill latency ({cgroups.name}, 50 processes): {latency * 1000:.1f} ms")
        assert not read_pids(cgroups.join_files(rid))

    def test_leftovers_belong_to_one_state_root(self, bundle: Bundle) -> None:
        rid, _ = bundle.sandbox()
        assert bundle.isolation.cgroups.leftovers() == [rid]
        mode = bundle.isolation.name
        mounts, own = own_view()
        driver = Cgroup2Driver if mode == "cgroup2" else Cgroup1Driver
        same = driver.locate(mounts, own, None, str(bundle.state_root), reactor, None)  # type: ignore[arg-type]
        other = driver.locate(mounts, own, None, str(bundle.state_root) + "x", reactor, None)  # type: ignore[arg-type]
        assert same.leftovers() == [rid]
        assert other.leftovers() == []

    @pytest_twisted.ensureDeferred
    async def test_file_calls_have_only_the_sandbox_access(self, bundle: Bundle) -> None:
        _, identity = bundle.sandbox()
        fs = bundle.isolation.fs
        bundle.pool.start()
        place = Path(tempfile.mkdtemp(prefix="sandboxd-fs-"))
        mine = place / "mine"
        try:
            place.chmod(0o755)
            secret = place / "secret"
            secret.write_text("root only")
            secret.chmod(0o600)
            (place / "link").symlink_to(secret)
            targets = [secret, place / "link"]
            if not os.stat("/etc/shadow").st_mode & 0o004:  # a VM may have a readable one
                (place / "shadow").symlink_to("/etc/shadow")
                targets.append(place / "shadow")
            mine.mkdir()
            os.chown(mine, identity.uid, identity.gid)

            for target in targets:
                with pytest.raises(PermissionError):
                    await fs.run(identity, target.read_text)
            with pytest.raises(PermissionError):
                await fs.run(identity, lambda: (place / "planted").write_text("x"))

            def create() -> os.stat_result:
                (mine / "new").write_text("hello")
                return os.stat(mine / "new")

            made = await fs.run(identity, create)
            assert (made.st_uid, made.st_gid) == (identity.uid, identity.gid)
            assert secret.read_text() == "root only"  # this thread kept root's access
            assert await fs.run(identity, lambda: (mine / "new").read_text()) == "hello"
        finally:
            for item in (mine / "new", secret, place / "link", place / "shadow"):
                item.unlink(missing_ok=True)
            if mine.exists():
                mine.rmdir()
            place.rmdir()

    def test_wrapper_spawn_cost(self, bundle: Bundle) -> None:
        if os.environ.get("SANDBOXD_VM"):
            pytest.skip("spawn timings mean nothing under software emulation (minutes of VM time)")
        rid, identity = bundle.sandbox()
        iso = bundle.isolation
        wrapped = iso.wrap(identity, iso.cgroups.join_files(rid), "/", ["/bin/true"])
        carried_env = {**BASE_ENV, "LD_LIBRARY_PATH": "/nowhere"}

        runs = 200

        def p50(argv: list[str], env: Mapping[str, str]) -> float:
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                pid = os.posix_spawn(argv[0], argv, env)
                _, status = os.waitpid(pid, 0)
                times.append(time.perf_counter() - started)
                assert os.waitstatus_to_exitcode(status) == 0
            return statistics.median(times) * 1000

        true = p50(["/bin/true"], BASE_ENV)
        plain = p50(wrapped, iso.spawn_env(BASE_ENV))
        carried = p50(wrapped, iso.spawn_env(carried_env))
        print(
            f"\nspawn p50 over {runs} ({iso.name}): /bin/true {true:.2f} ms,"
            f" wrapper {plain:.2f} ms, wrapper with carried env {carried:.2f} ms"
        )
        assert plain < true + 50


class TestCgroup1(DriverBehaviour):
    """The behaviour suite on the v1 hierarchies of a hybrid host, plus v1 specifics."""

    mode = "cgroup1"

    @pytest.fixture
    def bundle(self) -> Iterator[Bundle]:
        yield from make_bundle("cgroup1")

    def test_limits_are_written_in_each_hierarchy(self, bundle: Bundle) -> None:
        rid, _ = bundle.sandbox()
        driver = bundle.isolation.cgroups
        assert isinstance(driver, Cgroup1Driver)
        dirs = [Path(p).parent for p in driver.join_files(rid)]
        memory = next(d for d in dirs if (d / "memory.limit_in_bytes").exists())
        cpu = next(d for d in dirs if (d / "cpu.cfs_quota_us").exists())
        pids = next(d for d in dirs if (d / "pids.max").exists())
        assert int((memory / "memory.limit_in_bytes").read_text()) == 50 << 20
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "20000"
        assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
        assert (pids / "pids.max").read_text().strip() == "20"
