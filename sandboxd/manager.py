"""The sandbox manager: the one interface the HTTP layer talks to.

It owns the live sandboxes, their identities, cgroups, directories and running commands, and
asks the :class:`~sandboxd.isolation.base.Isolation` bundle for everything that touches the
kernel. Time comes from the injected clock; processes from the injected reactor.
"""

import os
import secrets
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO, TypeVar

from attrs import define, field
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorProcess, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from sandboxd import workspace
from sandboxd.config import Config
from sandboxd.errors import BadRequest, Draining, NoCapacity, SandboxNotFound
from sandboxd.exec_request import ExecRequest, parse_env
from sandboxd.exec_run import ExecRun
from sandboxd.isolation.base import CgroupStats, Identity, Isolation, Limits, NoFreeUid
from sandboxd.layout import Layout
from sandboxd.paths import Parts

T = TypeVar("T")

BASE_PATH = "/usr/local/bin:/usr/bin:/bin"

CD_AND_EXEC = 'cd -- "$1" && shift && unset OLDPWD && exec "$@"'
"""Run after privilege is dropped, so a ``cwd`` the sandbox swapped for a symlink gets it
nothing its uid could not reach anyway."""

log = Logger()


@define
class Sandbox:
    """One live sandbox."""

    rid: str
    identity: Identity
    env: dict[str, str]
    created: float
    last_active: float
    execs: int = 0
    running: set[ExecRun] = field(factory=set)


@define
class SandboxManager:
    """Creates, finds, runs commands in, and kills sandboxes."""

    config: Config
    reactor: IReactorProcess
    clock: IReactorTime
    isolation: Isolation
    admin_pool: ThreadPool
    """Threads for root-level work that may be slow (removing a big workspace)."""
    layout: Layout
    sandboxes: dict[str, Sandbox] = field(factory=dict)
    draining: bool = False
    _devnull: int = field(init=False, default=-1)

    def start(self) -> Deferred[None]:
        """Prepare the root and reclaim what a crashed predecessor left behind."""
        self._devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.layout.prepare_root()
        return self.recover()

    def recover(self) -> Deferred[None]:
        """Kill and remove every sandbox (cgroup, processes, files) found from a predecessor."""
        rids = sorted(set(self.layout.leftovers()) | set(self.isolation.cgroups.leftovers()))
        rids = [rid for rid in rids if rid not in self.sandboxes]
        kills = [Deferred.fromCoroutine(self._dispose(rid)) for rid in rids]
        done: Deferred[Any] = DeferredList(kills, consumeErrors=True)

        def report(_: object) -> None:
            log.info("recovery done: {count} leftover sandboxes reclaimed", count=len(rids))

        return done.addCallback(report)

    @property
    def limits(self) -> Limits:
        return Limits(
            memory_bytes=self.config.memory_max,
            cpu_cores=self.config.cpu_cores,
            pids=self.config.pids_max,
        )

    # Lifecycle

    def create(self, env: object = None) -> Sandbox:
        """A new sandbox with its own identity, cgroup and directories."""
        if self.draining:
            raise Draining("the daemon is draining and accepts no new sandboxes")
        create_env = parse_env(env, "env")
        try:
            identity = self.isolation.uids.allocate()
        except NoFreeUid as e:
            raise NoCapacity(str(e)) from None
        rid = secrets.token_hex(8)
        try:
            self.isolation.cgroups.create(rid, self.limits)
            self.layout.create(rid, identity)
        except BaseException:
            self.isolation.cgroups.remove(rid)
            self.layout.destroy(rid)
            self.isolation.uids.release(identity)
            raise
        now = self.clock.seconds()
        sandbox = Sandbox(rid, identity, create_env, created=now, last_active=now)
        self.sandboxes[rid] = sandbox
        log.info("created sandbox {rid} as uid {uid}", rid=rid, uid=identity.uid)
        return sandbox

    def get(self, rid: str) -> Sandbox:
        """The live sandbox ``rid`` (its last activity is now), else ``404 SandboxNotFound``."""
        sandbox = self.sandboxes.get(rid)
        if sandbox is None:
            raise SandboxNotFound(f"no sandbox {rid!r}")
        sandbox.last_active = self.clock.seconds()
        return sandbox

    async def kill(self, rid: str) -> None:
        """Stop every process of the sandbox, then release its cgroup, files and uid."""
        sandbox = self.sandboxes.pop(rid, None)
        if sandbox is None:
            raise SandboxNotFound(f"no sandbox {rid!r}")
        for run in list(sandbox.running):
            run.abort()
        await self._dispose(rid)
        self.isolation.uids.release(sandbox.identity)
        log.info("killed sandbox {rid}", rid=rid)

    async def _dispose(self, rid: str) -> None:
        await self.isolation.cgroups.kill(rid)
        self.isolation.cgroups.remove(rid)
        await deferToThreadPool(
            self.clock,  # type: ignore[arg-type]
            self.admin_pool,
            self.layout.destroy,
            rid,
        )

    # Commands

    def command_env(self, sandbox: Sandbox, request: ExecRequest) -> dict[str, str]:
        """A fresh environment: the host's base, then create-time env, then exec env last."""
        path = BASE_PATH
        for sha in reversed(request.tools):
            path = os.path.join(self.config.tools_dir, sha, "bin") + ":" + path
        env = {
            "PATH": path,
            "HOME": self.layout.home(sandbox.rid),
            "TMPDIR": self.layout.tmp(sandbox.rid),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
        }
        env.update(sandbox.env)
        env.update(request.env)
        return env

    def start_exec(
        self, sandbox: Sandbox, request: ExecRequest, emit: Callable[[bytes], None]
    ) -> ExecRun:
        """Spawn the command in the sandbox; the run's ``when_finished()`` gives the last frame."""
        for sha in request.tools:
            if not os.path.isdir(os.path.join(self.config.tools_dir, sha)):
                raise BadRequest(f"tools: {sha} is not installed")
        cwd = os.path.join(self.layout.workspace(sandbox.rid), *request.cwd)
        timeout = self.config.exec_timeout
        if request.timeout is not None:
            timeout = min(timeout, request.timeout)

        def touch() -> None:
            sandbox.last_active = self.clock.seconds()

        def end() -> None:
            sandbox.running.discard(run)
            touch()

        run = ExecRun(
            self.clock,
            emit,
            max_output=self.config.max_output,
            keepalive=self.config.keepalive,
            log_timeout=self.config.log_timeout,
            timeout=timeout,
            on_activity=touch,
            on_end=end,
        )
        argv = self.isolation.wrap(
            sandbox.identity,
            self.isolation.cgroups.procs_files(sandbox.rid),
            ["/bin/sh", "-c", CD_AND_EXEC, "sh", cwd, *request.cmd],
        )
        sandbox.execs += 1
        sandbox.running.add(run)
        env = self.command_env(sandbox, request)
        run.start(self.reactor, argv, env, request.stdin, self._devnull)
        return run

    # Files, each in a worker thread with the sandbox's filesystem credentials

    def files(self, sandbox: Sandbox, work: Callable[[str], T]) -> Deferred[T]:
        """Run ``work(workspace_path)`` as the sandbox (per-thread fsuid/fsgid)."""
        path = self.layout.workspace(sandbox.rid)
        return self.isolation.fs.run(sandbox.identity, lambda: work(path))

    def open_for_reading(self, sandbox: Sandbox, parts: Parts) -> Deferred[tuple[BinaryIO, int]]:
        uid = sandbox.identity.uid
        return self.files(sandbox, lambda ws: workspace.open_for_reading(ws, parts, uid))

    # Ready marker

    def mark_ready(self, sandbox: Sandbox) -> None:
        self.layout.mark_ready(sandbox.rid)

    def is_ready(self, sandbox: Sandbox) -> bool:
        return self.layout.is_ready(sandbox.rid)

    # Operators

    def stats(self, sandbox: Sandbox) -> CgroupStats:
        return self.isolation.cgroups.stats(sandbox.rid)

    def listing(self) -> list[Mapping[str, Any]]:
        """``GET /sandboxes``: every live sandbox, for operators."""
        return [
            {
                "remote_id": s.rid,
                "created": s.created,
                "last_active": s.last_active,
                "ready": self.layout.is_ready(s.rid),
                "execs": s.execs,
            }
            for s in self.sandboxes.values()
        ]
