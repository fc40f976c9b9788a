"""The sandbox manager (``sandboxd.core.manager``) with fake isolation, a Clock and a fake
reactor."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from sandboxd.config import Config
from sandboxd.core.exec.spec import ExecSpec
from sandboxd.core.layout import Layout
from sandboxd.core.manager import BASE_PATH, SandboxManager
from sandboxd.core.sandbox import CreateRequest, SandboxListing
from sandboxd.e2b.registry import Registry
from sandboxd.errors import BadRequest, Draining, NoCapacity, SandboxNotFound
from sandboxd.http import parse, wire
from sandboxd.isolation.base import REMOVAL_ROUNDS, Isolation
from tests.support.fakes import (
    FakeCgroups,
    FakeReactor,
    InstanceCgroups,
    SyncFiles,
    SyncPool,
    fake_isolation,
)

SHA = "ab" * 32


def fired(d: Deferred[Any]) -> Any:
    results: list[Any] = []
    d.addBoth(results.append)
    assert results, "not fired"
    if isinstance(results[0], Failure):
        results[0].raiseException()
    return results[0]


class World:
    """A manager on fakes, and handles on each fake."""

    def __init__(self, tmp_path: Path, isolation: Isolation | None = None, **settings: str):
        options = {
            "root": str(tmp_path / "root"),
            "tools-dir": str(tmp_path / "tools"),
            "exec-timeout": "60s",
            "drain-deadline": "10s",
            "drain-idle": "0s",  # a drain takes a sandbox as soon as nothing runs in it
            "idle-ttl": "100s",
            **settings,
        }
        self.config = Config.load({}, options)
        self.clock = Clock()
        self.reactor = FakeReactor()
        self.isolation = isolation or fake_isolation()
        self.layout = Layout(self.config.root, owns_files=False)
        self.layout.prepare_root()
        self.manager = SandboxManager(
            self.config,
            self.reactor,  # type: ignore[arg-type]
            self.clock,
            self.isolation,
            SyncPool(),  # type: ignore[arg-type]
            self.layout,
        )

    @property
    def cgroups(self) -> FakeCgroups:
        return self.isolation.cgroups  # type: ignore[return-value]

    @property
    def fs(self) -> SyncFiles:
        return self.isolation.fs  # type: ignore[return-value]

    def start(self) -> None:
        fired(self.manager.start())

    def close(self) -> None:
        if self.manager._devnull >= 0:
            os.close(self.manager._devnull)


@pytest.fixture
def world(tmp_path: Path) -> Any:
    w = World(tmp_path)
    w.start()
    yield w
    w.close()


def exec_request(**fields: Any) -> ExecSpec:
    return parse.exec_spec({"cmd": ["echo", "hi"], **fields})


# Start and recovery


def test_start_reclaims_a_predecessors_leftovers(tmp_path: Path) -> None:
    w = World(tmp_path)
    root = Path(w.config.root)
    (root / "0123456789abcdef" / "workspace").mkdir(parents=True)
    (root / "0123456789abcdef" / "workspace" / "f").write_bytes(b"x")
    (root / "not-a-sandbox").mkdir()
    w.cgroups.leftover = ["fedcba9876543210"]
    w.start()
    assert sorted(w.cgroups.killed) == ["0123456789abcdef", "fedcba9876543210"]
    assert sorted(w.cgroups.removed) == ["0123456789abcdef", "fedcba9876543210"]
    assert sorted(os.listdir(root)) == ["not-a-sandbox"]
    assert not w.manager.recovering
    w.close()


def test_one_failed_recovery_does_not_stop_the_others(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.cgroups.leftover = ["0000000000000001", "0000000000000002"]
    w.cgroups.kill_results["0000000000000001"] = OSError("stuck")
    w.start()
    assert w.cgroups.removed == ["0000000000000002"]
    assert not w.manager.recovering
    w.close()


def test_creates_wait_for_recovery(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.cgroups.leftover = ["0000000000000001"]
    pending: Deferred[None] = Deferred()
    w.cgroups.kill_results["0000000000000001"] = pending
    started = w.manager.start()
    assert w.manager.recovering
    with pytest.raises(NoCapacity, match="reclaiming"):
        w.manager.create()
    pending.callback(None)
    fired(started)
    assert w.manager.create().rid
    w.close()


def test_recover_skips_live_sandboxes(world: World) -> None:
    sandbox = world.manager.create()
    world.cgroups.leftover = [sandbox.rid]
    fired(world.manager.recover())
    assert sandbox.rid not in world.cgroups.killed
    assert os.path.isdir(world.layout.directory(sandbox.rid))


# Create, get, kill


def test_create(world: World) -> None:
    world.clock.advance(7)
    sandbox = world.manager.create(CreateRequest(env={"A": "1"}))
    assert world.manager.sandboxes == {sandbox.rid: sandbox}
    assert (sandbox.created, sandbox.last_active, sandbox.env) == (7, 7, {"A": "1"})
    assert world.cgroups.created == [(sandbox.rid, world.manager.limits)]
    assert world.manager.limits.memory_bytes == world.config.memory_max
    assert world.manager.limits.cpu_cores == world.config.cpu_cores
    assert world.manager.limits.pids == world.config.pids_max
    assert os.path.isdir(world.layout.workspace(sandbox.rid))
    assert world.isolation.uids.free == 3


def test_create_refusals(world: World) -> None:
    with pytest.raises(BadRequest, match=r"^env:"):
        world.manager.create(CreateRequest(env={"A=B": "x"}))
    assert world.isolation.uids.free == 4
    for _ in range(4):
        world.manager.create()
    with pytest.raises(NoCapacity, match="slots"):
        world.manager.create()
    world.manager.draining = True
    with pytest.raises(Draining):
        world.manager.create()


@pytest.mark.parametrize("where", ["cgroup", "layout"])
def test_a_failed_create_gives_everything_back(world: World, where: str) -> None:
    if where == "cgroup":
        world.cgroups.create_error = OSError("no cgroup")
    else:
        world.layout = world.manager.layout = Layout(
            os.path.join(world.config.root, "missing", "deeper"), owns_files=False
        )
    with pytest.raises(OSError):
        world.manager.create()
    assert world.manager.sandboxes == {}
    assert world.isolation.uids.free == 4
    assert len(world.cgroups.removed) == 1
    assert os.listdir(world.config.root) == []


def test_get_touches(world: World) -> None:
    sandbox = world.manager.create()
    world.clock.advance(5)
    assert world.manager.get(sandbox.rid) is sandbox
    assert sandbox.last_active == 5
    with pytest.raises(SandboxNotFound):
        world.manager.get("0123456789abcdef")


def test_kill(world: World) -> None:
    sandbox = world.manager.create()
    world.layout.mark_ready(sandbox.rid)
    fired(Deferred.fromCoroutine(world.manager.kill(sandbox.rid)))
    assert world.manager.sandboxes == {}
    assert world.cgroups.killed == [sandbox.rid]
    assert not os.path.exists(world.layout.directory(sandbox.rid))
    assert world.isolation.uids.free == 4
    with pytest.raises(SandboxNotFound):
        fired(Deferred.fromCoroutine(world.manager.kill(sandbox.rid)))


def test_a_cgroup_busy_at_its_removal_is_killed_again(world: World) -> None:
    """A process that joined after the kill (its start was under way) is killed by a second
    round, and the sandbox ends as usual."""
    sandbox = world.manager.create()
    world.cgroups.remove_errors = [OSError(errno.EBUSY, "busy")]
    fired(Deferred.fromCoroutine(world.manager.kill(sandbox.rid)))
    assert world.cgroups.killed == world.cgroups.removed == [sandbox.rid] * 2
    assert not os.path.exists(world.layout.directory(sandbox.rid))
    assert world.isolation.uids.free == 4


@pytest.mark.parametrize(
    ("errors", "rounds"),
    [
        ([OSError(errno.EBUSY, "busy")] * REMOVAL_ROUNDS, REMOVAL_ROUNDS),
        ([OSError(errno.EIO, "broken")], 1),
    ],
)
def test_a_cgroup_that_stays_busy_or_fails_keeps_the_uid_out_of_the_pool(
    world: World, errors: list[OSError], rounds: int
) -> None:
    sandbox = world.manager.create()
    world.cgroups.remove_errors = list(errors)
    with pytest.raises(OSError):
        fired(Deferred.fromCoroutine(world.manager.kill(sandbox.rid)))
    assert world.cgroups.killed == world.cgroups.removed == [sandbox.rid] * rounds
    assert world.isolation.uids.free == 3
    assert world.manager.sandboxes == {}


def test_a_sandboxs_body_place_is_its_directory_and_its_end_aborts_its_bodies(
    world: World,
) -> None:
    sandbox = world.manager.create()
    assert world.manager.body_place("0123456789abcdef") is None
    place = world.manager.body_place(sandbox.rid)
    assert place is not None and place.directory == world.layout.directory(sandbox.rid)
    assert place.charged(lambda: 7)() == 7  # no limits: the work as it is
    aborted: list[str] = []
    place.bodies.add(lambda: aborted.append("body"))
    fired(Deferred.fromCoroutine(world.manager.kill(sandbox.rid)))
    assert aborted == ["body"]


def test_kill_without_readable_counters(world: World) -> None:
    sandbox = world.manager.create()
    world.cgroups.stats_error = OSError("gone")
    fired(Deferred.fromCoroutine(world.manager.kill(sandbox.rid)))
    assert world.manager.sandboxes == {}


def test_kill_waits_for_file_calls_in_flight(world: World) -> None:
    sandbox = world.manager.create()
    world.fs.hold = Deferred()
    call = world.manager.files(sandbox, lambda ws: os.mkdir(os.path.join(ws, "late")))
    assert len(sandbox.file_calls) == 1
    killing = Deferred.fromCoroutine(world.manager.kill(sandbox.rid))
    assert not killing.called
    assert os.path.isdir(world.layout.directory(sandbox.rid))
    world.fs.hold.callback(None)
    fired(call)
    fired(killing)
    assert sandbox.file_calls == set()
    assert not os.path.exists(world.layout.directory(sandbox.rid))


def test_files_runs_as_the_sandbox_and_passes_errors_on(world: World) -> None:
    sandbox = world.manager.create()
    assert fired(world.manager.files(sandbox, lambda ws: ws)) == world.layout.workspace(sandbox.rid)
    assert world.fs.identities == [sandbox.identity]
    failing = world.manager.files(sandbox, lambda ws: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        fired(failing)
    assert sandbox.file_calls == set()


def test_open_for_reading(world: World) -> None:
    sandbox = world.manager.create()
    Path(world.layout.workspace(sandbox.rid), "f").write_bytes(b"abc")
    source, length = fired(world.manager.open_for_reading(sandbox, ("f",)))
    with source:
        assert (source.read(), length) == (b"abc", 3)


# Idle reaper


def test_reap_idle_kills_only_idle_sandboxes(world: World) -> None:
    old = world.manager.create()
    world.clock.advance(60)
    busy = world.manager.create()
    fresh = world.manager.create()
    world.clock.advance(50)
    world.manager.get(fresh.rid)
    busy.running.add(object())  # type: ignore[arg-type]
    world.clock.advance(50)  # old: 160 s, busy: 100 s but running, fresh: 50 s
    fired(world.manager.reap_idle())
    assert set(world.manager.sandboxes) == {busy.rid, fresh.rid}
    assert old.rid in world.cgroups.killed


def test_the_e2b_timeout_governs_its_sandboxs_life_not_the_idle_reaper(world: World) -> None:
    registry = Registry(world.manager, world.clock)
    native = world.manager.create()
    long, short = world.manager.create(), world.manager.create()
    registry.add(long, "base", {}, timeout=300)  # idle-ttl is 100 s
    registry.add(short, "base", {}, timeout=30)
    world.clock.advance(30)  # short's timeout: killed, though never idle for long
    assert set(world.manager.sandboxes) == {native.rid, long.rid}
    world.clock.advance(90)  # 120 s idle: the reaper takes the native one only
    fired(world.manager.reap_idle())
    assert set(world.manager.sandboxes) == {long.rid}
    entry = registry.get(long.rid)
    registry.set_timeout(entry, 200)  # moved: now ends at 320 s
    world.clock.advance(190)
    fired(world.manager.reap_idle())  # 190 s idle, its timeout not reached
    assert set(world.manager.sandboxes) == {long.rid} and long.lives_until == 320
    world.clock.advance(10)
    assert world.manager.sandboxes == {}
    # Past its end the reaper would take it too (a kill at the timeout that went wrong).
    late = world.manager.create()
    late.lives_until = world.clock.seconds()
    world.clock.advance(100)
    fired(world.manager.reap_idle())
    assert world.manager.sandboxes == {}


def test_a_failing_reap_is_logged_and_the_rest_go_on(world: World) -> None:
    first = world.manager.create()
    second = world.manager.create()
    world.cgroups.kill_results[first.rid] = OSError("stuck")
    world.clock.advance(100)
    fired(world.manager.reap_idle())
    assert second.rid not in world.manager.sandboxes
    assert world.cgroups.killed == [first.rid, second.rid]


# Drain


def test_drain_with_nothing_running_kills_at_once(world: World) -> None:
    sandbox = world.manager.create()
    done = world.manager.drain()
    fired(done)
    assert world.manager.draining
    assert world.manager.sandboxes == {}
    assert world.cgroups.killed == [sandbox.rid]
    fired(world.manager.drain())  # drained already: fires at once


def test_drain_waits_for_running_commands(world: World) -> None:
    sandbox = world.manager.create()
    run = world.manager.start_exec(sandbox, exec_request(), lambda fd, data: None)
    first = world.manager.drain()
    second = world.manager.drain()
    world.clock.advance(world.manager.drain_poll * 3)
    assert not first.called and not second.called
    assert world.manager.sandboxes
    run.processEnded(Failure(ProcessDone(0)))
    world.clock.advance(world.manager.drain_poll)
    fired(first)
    fired(second)
    assert world.manager.sandboxes == {}


def test_drain_deadline_kills_busy_sandboxes(world: World) -> None:
    sandbox = world.manager.create()
    run = world.manager.start_exec(sandbox, exec_request(), lambda fd, data: None)
    done = world.manager.drain()
    world.clock.advance(5)
    assert not done.called
    world.clock.pump([world.manager.drain_poll] * 60)
    fired(done)
    assert world.manager.sandboxes == {}
    assert world.reactor.process is not None and world.reactor.process.lost == 1
    assert not run.ended  # killed; its end comes when the process is reaped


# Commands


def test_command_env(world: World) -> None:
    sandbox = world.manager.create(CreateRequest(env={"TERM": "xterm", "A": "create"}))
    request = exec_request(env={"A": "exec"}, tools=[SHA, "cd" * 32])
    env = world.manager.command_env(sandbox, request)
    tools = world.config.tools_dir
    assert env == {
        "PATH": f"{tools}/{SHA}/bin:{tools}/{'cd' * 32}/bin:{BASE_PATH}",
        "HOME": world.layout.home(sandbox.rid),
        "TMPDIR": world.layout.tmp(sandbox.rid),
        "LANG": "C.UTF-8",
        "TERM": "xterm",
        "A": "exec",
    }


def test_a_command_run_as_home_starts_in_the_workspaces_view(world: World) -> None:
    sandbox = world.manager.create(CreateRequest(env={"USER": "create"}))
    request = attrs.evolve(exec_request(cwd="sub"), as_home=True)
    env = world.manager.command_env(sandbox, request)
    workspace = world.layout.workspace(sandbox.rid)  # no mount namespace: the real path
    assert (env["HOME"], env["USER"]) == (workspace, "create")  # create-time env wins
    plain = world.manager.create()
    assert world.manager.command_env(plain, request)["USER"] == "user"
    run = world.manager.start_exec(sandbox, request, lambda fd, data: None)
    assert os.path.join(workspace, "sub") in run.argv  # type: ignore[attr-defined]
    world.isolation.namespaces.kinds = frozenset({"mount"})
    world.isolation.namespaces.home_covered = lambda: True
    assert world.manager.workspace_seen(sandbox, request) == "/home/user"
    assert world.manager.command_env(sandbox, request)["HOME"] == "/home/user"
    assert world.manager.workspace_seen(sandbox, exec_request()) == workspace


def test_start_exec_wraps_the_command(world: World) -> None:
    sandbox = world.manager.create()
    frames: list[bytes] = []
    run = world.manager.start_exec(
        sandbox, exec_request(cwd="sub/dir", stdin=""), lambda fd, data: frames.append(data)
    )
    (spawn,) = world.reactor.spawned
    workspace = world.layout.workspace(sandbox.rid)
    assert spawn["args"] == [
        "wrapper",
        "5000",
        f"/cg/{sandbox.rid}/cgroup.procs",
        os.path.join(workspace, "sub", "dir"),
        "--",
        "echo",
        "hi",
    ]
    assert spawn["env"]["TERM"] == "dumb"
    assert spawn["childFDs"][0] == "w"
    assert sandbox.execs == 1 and sandbox.running == {run}
    world.clock.advance(3)
    run.childDataReceived(1, b"hi\n")
    assert sandbox.last_active == 3
    world.clock.advance(2)
    run.processEnded(Failure(ProcessDone(0)))
    assert sandbox.running == set()
    assert sandbox.last_active == 5


def test_exec_timeout_is_the_smaller_of_request_and_host(world: World) -> None:
    sandbox = world.manager.create()
    short = world.manager.start_exec(sandbox, exec_request(timeout=2), lambda fd, data: None)
    long = world.manager.start_exec(sandbox, exec_request(timeout=1000), lambda fd, data: None)
    default = world.manager.start_exec(sandbox, exec_request(), lambda fd, data: None)
    assert (short.timeout, long.timeout, default.timeout) == (2.0, 60.0, 60.0)


def test_a_timed_out_exec_is_logged(world: World) -> None:
    sandbox = world.manager.create()
    run = world.manager.start_exec(sandbox, exec_request(timeout=1), lambda fd, data: None)
    world.clock.advance(1)
    run.processEnded(Failure(ProcessTerminated(signal=9)))
    assert run.outcome is not None and wire.final_frame(run.outcome)["exit"] == 124


def test_the_end_of_a_run_without_a_frame_is_tolerated(world: World) -> None:
    sandbox = world.manager.create()
    run = world.manager.start_exec(sandbox, exec_request(), lambda fd, data: None)
    run.on_end()
    assert sandbox.running == set()


def test_a_command_that_cannot_start_is_not_left_running(world: World) -> None:
    world.reactor.error = FileNotFoundError(2, "no wrapper")
    sandbox = world.manager.create()
    run = world.manager.start_exec(sandbox, exec_request(), lambda fd, data: None)
    assert run.outcome is not None and wire.final_frame(run.outcome)["exit"] == 127
    assert sandbox.running == set()


def test_exec_refusals(world: World, tmp_path: Path) -> None:
    sandbox = world.manager.create()
    with pytest.raises(BadRequest, match="not installed"):
        world.manager.start_exec(sandbox, exec_request(tools=[SHA]), lambda fd, data: None)
    (Path(world.config.tools_dir) / SHA).mkdir(parents=True)
    world.manager.start_exec(sandbox, exec_request(tools=[SHA]), lambda fd, data: None)
    big = {f"V{i}": "x" * 100_000 for i in range(80)}
    with pytest.raises(BadRequest, match="too long"):
        world.manager.start_exec(sandbox, exec_request(env=big), lambda fd, data: None)
    assert sandbox.execs == 1


def test_spawn_env_refusal_is_400(tmp_path: Path) -> None:
    def picky(env: Any) -> dict[str, str]:
        if "BAD" in env:
            raise ValueError("'BAD' cannot be carried")
        return dict(env)

    w = World(tmp_path, isolation=fake_isolation(spawn_env=picky))
    w.start()
    sandbox = w.manager.create()
    with pytest.raises(BadRequest, match=r"^env: 'BAD' cannot be carried"):
        w.manager.start_exec(sandbox, exec_request(env={"BAD": "1"}), lambda fd, data: None)
    assert sandbox.running == set() and sandbox.execs == 0
    w.close()


def test_kill_aborts_running_commands(world: World) -> None:
    sandbox = world.manager.create()
    run = world.manager.start_exec(sandbox, exec_request(), lambda fd, data: None)
    kills: list[tuple[int, int]] = []
    run._killpg = lambda pid, sig: kills.append((pid, sig))
    fired(Deferred.fromCoroutine(world.manager.kill(sandbox.rid)))
    assert kills == [(world.reactor.pid, 9)]


# Archive


class FakeArchive:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error
        self.restored: list[tuple[str, Any]] = []
        self.persisted: list[tuple[str, Any, bool]] = []

    async def restore(self, item_id: str, end: Any) -> None:
        self.restored.append((item_id, end))
        if self.error is not None:
            raise self.error

    async def persist(self, item_id: str, end: Any, delete: bool) -> None:
        self.persisted.append((item_id, end, delete))


def test_create_restored_without_archive_is_a_plain_create(world: World) -> None:
    sandbox = fired(
        Deferred.fromCoroutine(world.manager.create_restored(CreateRequest(item_id="item")))
    )
    assert sandbox.item_id == "item"
    assert not world.manager.is_ready(sandbox)
    assert fired(Deferred.fromCoroutine(world.manager.persist(sandbox, True))) is False


def test_create_restored_restores_then_marks_ready(world: World) -> None:
    archive = FakeArchive()
    world.manager.archive = archive  # type: ignore[assignment]
    plain = fired(Deferred.fromCoroutine(world.manager.create_restored(CreateRequest())))
    assert archive.restored == [] and not world.manager.is_ready(plain)
    sandbox = fired(
        Deferred.fromCoroutine(world.manager.create_restored(CreateRequest(item_id="item-1")))
    )
    ((item, end),) = archive.restored
    assert item == "item-1"
    workspace = world.layout.workspace(sandbox.rid)
    assert end.path == workspace
    # the rsync end: the commands' chain, as the sandbox, in the workspace's real path
    assert end.start(["/usr/bin/rsync"]) == [
        *("wrapper", str(sandbox.identity.uid), f"/cg/{sandbox.rid}/cgroup.procs", workspace),
        *("--", "/usr/bin/rsync"),
    ]
    assert world.manager.is_ready(sandbox)
    assert fired(Deferred.fromCoroutine(world.manager.persist(sandbox, False))) is True
    ((item, again, delete),) = archive.persisted
    assert (item, again.path, again.start(["x"]), delete) == (
        "item-1",
        end.path,
        end.start(["x"]),
        False,
    )
    assert fired(Deferred.fromCoroutine(world.manager.persist(plain, True))) is False


def test_persist_needs_ready(world: World) -> None:
    archive = FakeArchive()
    world.manager.archive = archive  # type: ignore[assignment]
    sandbox = world.manager.create(CreateRequest(item_id="item"))
    assert fired(Deferred.fromCoroutine(world.manager.persist(sandbox, True))) is False
    world.manager.mark_ready(sandbox)
    assert fired(Deferred.fromCoroutine(world.manager.persist(sandbox, True))) is True


def test_a_failed_restore_kills_the_sandbox(world: World) -> None:
    world.manager.archive = FakeArchive(error=RuntimeError("rsync failed"))  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="rsync failed"):
        fired(Deferred.fromCoroutine(world.manager.create_restored(CreateRequest(item_id="item"))))
    assert world.manager.sandboxes == {}
    assert world.isolation.uids.free == 4


# Operators


def test_stats_and_listing(world: World) -> None:
    sandbox = world.manager.create()
    assert world.manager.stats(sandbox) == world.cgroups.stats_value
    world.manager.mark_ready(sandbox)
    assert world.manager.listing() == [
        SandboxListing(rid=sandbox.rid, created=0.0, last_active=0.0, ready=True, execs=0)
    ]


@pytest.mark.parametrize("error", [None, OSError("busy")])
def test_a_drain_removes_the_instance_cgroups(tmp_path: Path, error: OSError | None) -> None:
    isolation = attrs.evolve(fake_isolation(), cgroups=InstanceCgroups(error))
    w = World(tmp_path, isolation=isolation)
    w.start()
    w.manager.create()
    fired(w.manager.drain())
    assert w.cgroups.instance_removed == 1  # type: ignore[attr-defined]
    assert w.manager.sandboxes == {}
    w.close()


def test_a_spawn_that_fails_outright_leaves_nothing_running(world: World) -> None:
    world.reactor.error = OSError(11, "Resource temporarily unavailable")  # fork: EAGAIN
    sandbox = world.manager.create()
    run = world.manager.start_exec(sandbox, exec_request(), lambda fd, data: None)
    assert run.outcome is not None and wire.final_frame(run.outcome)["error"] == "SpawnFailed"
    assert sandbox.running == set()
    # So the idle reaper and a drain do not wait for it forever.
    world.clock.advance(100)
    fired(world.manager.reap_idle())
    assert world.manager.sandboxes == {}


def test_a_spawn_that_raises_anything_else_leaves_nothing_running(world: World) -> None:
    world.reactor.error = UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
    sandbox = world.manager.create()
    with pytest.raises(UnicodeEncodeError):
        world.manager.start_exec(sandbox, exec_request(), lambda fd, data: None)
    assert sandbox.running == set()
