"""Stand-ins for the kernel-facing seams of the daemon, for the unit tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from twisted.internet.defer import Deferred, fail, maybeDeferred, succeed
from twisted.python.failure import Failure

from sandboxd.isolation.base import CgroupStats, Identity, Isolation, Limits
from sandboxd.isolation.none import CountingPool


class FakeProcess:
    """The process transport ``spawnProcess`` would return."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.written = bytearray()
        self.stdin_closed = False
        self.lost = 0
        self.paused = 0
        self.resumed = 0

    def write(self, data: bytes) -> None:
        self.written += data

    def closeStdin(self) -> None:
        self.stdin_closed = True

    def loseConnection(self) -> None:
        self.lost += 1

    def pauseProducing(self) -> None:
        self.paused += 1

    def resumeProducing(self) -> None:
        self.resumed += 1


class FakeReactor:
    """``spawnProcess`` that records and connects a :class:`FakeProcess`; ``callFromThread``
    that runs at once (file work is synchronous in these tests)."""

    def __init__(self, pid: int = 424242, error: BaseException | None = None) -> None:
        self.pid = pid
        self.error = error
        self.spawned: list[dict[str, Any]] = []
        self.process: FakeProcess | None = None
        self.protocol: Any = None

    def spawnProcess(
        self,
        proto: Any,
        executable: str,
        args: list[str],
        env: dict[str, str],
        childFDs: Any,
        path: str | None = None,
    ) -> FakeProcess:
        self.spawned.append(
            {"executable": executable, "args": args, "env": env, "childFDs": childFDs, "path": path}
        )
        if self.error is not None:
            raise self.error
        self.protocol = proto
        self.process = FakeProcess(self.pid)
        proto.makeConnection(self.process)  # as twisted's Process does
        return self.process

    def callFromThread(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        f(*args, **kwargs)


class SyncPool:
    """Stands in for a ``ThreadPool``: the work runs at once, in the calling thread."""

    def callInThreadWithCallback(
        self, on_result: Callable[[bool, Any], None], f: Callable[..., Any], *a: Any, **kw: Any
    ) -> None:
        try:
            result = f(*a, **kw)
        except BaseException:
            on_result(False, Failure())
        else:
            on_result(True, result)


class SyncFiles:
    """``FsCredentials`` running the work at once; ``hold`` makes calls wait for a Deferred."""

    def __init__(self) -> None:
        self.hold: Deferred[None] | None = None
        self.identities: list[Identity] = []

    def run(self, identity: Identity, work: Callable[[], Any]) -> Deferred[Any]:
        self.identities.append(identity)
        if self.hold is not None:
            return self.hold.addCallback(lambda _: work())
        return maybeDeferred(work)


class FakeCgroups:
    """A cgroup driver that records what it is asked."""

    name = "fake"

    def __init__(self) -> None:
        self.created: list[tuple[str, Limits]] = []
        self.removed: list[str] = []
        self.killed: list[str] = []
        self.leftover: list[str] = []
        self.create_error: BaseException | None = None
        self.kill_results: dict[str, Deferred[None] | BaseException] = {}
        self.remove_errors: list[BaseException] = []
        self.stats_value = CgroupStats(1, 2, 3, 4, 0)
        self.stats_error: BaseException | None = None

    def preflight(self) -> None:
        """Always possible."""

    def create(self, rid: str, limits: Limits) -> None:
        if self.create_error is not None:
            raise self.create_error
        self.created.append((rid, limits))

    def join_files(self, rid: str) -> Sequence[str]:
        return (f"/cg/{rid}/cgroup.procs",)

    def freeze(self, rid: str, frozen: bool) -> Deferred[bool]:
        """No cgroup here: nothing is frozen."""
        return succeed(False)

    def kill(self, rid: str) -> Deferred[None]:
        self.killed.append(rid)
        result = self.kill_results.get(rid)
        if isinstance(result, BaseException):
            return fail(result)
        if result is not None:
            return result
        return succeed(None)

    def remove(self, rid: str) -> None:
        """Recorded; the first of ``remove_errors`` (if any) is raised, and dropped."""
        self.removed.append(rid)
        if self.remove_errors:
            raise self.remove_errors.pop(0)

    def stats(self, rid: str) -> CgroupStats:
        if self.stats_error is not None:
            raise self.stats_error
        return self.stats_value

    def oom_kills(self, rid: str) -> int:
        return self.stats(rid).oom_kills

    def leftovers(self) -> list[str]:
        return list(self.leftover)

    def problem(self) -> None:
        """Always possible."""

    def remove_instance(self) -> None:
        """No cgroups of its own instance."""

    def unprepare(self) -> None:
        """Its preflight made nothing."""


class InstanceCgroups(FakeCgroups):
    """A driver that also owns cgroups of its own instance, removed after a drain."""

    def __init__(self, error: BaseException | None = None) -> None:
        super().__init__()
        self.instance_error = error
        self.instance_removed = 0

    def remove_instance(self) -> None:
        self.instance_removed += 1
        if self.instance_error is not None:
            raise self.instance_error


def wrap(identity: Identity, join_files: Sequence[str], cwd: str, argv: Sequence[str]) -> list[str]:
    """A recognisable wrapper: what the isolation would put before the command."""
    return ["wrapper", str(identity.uid), *join_files, cwd, "--", *argv]


def fake_isolation(
    capacity: int = 4,
    spawn_env: Callable[[Mapping[str, str]], dict[str, str]] | None = None,
) -> Isolation:
    extra: dict[str, Any] = {} if spawn_env is None else {"spawn_env": spawn_env}
    return Isolation(
        name="fake",
        uids=CountingPool(Identity(5000, 5000), capacity),
        cgroups=FakeCgroups(),
        fs=SyncFiles(),
        wrap=wrap,
        owns_files=False,
        **extra,
    )
