"""The sandbox manager: the one interface the HTTP layer talks to.

It owns the live sandboxes, their identities, cgroups, directories and running commands, and
asks the :class:`~sandboxd.isolation.base.Isolation` bundle for everything that touches the
kernel. Time comes from the injected clock; processes from the injected reactor.
"""

import os
import secrets
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, BinaryIO, TypeVar

from attrs import define, field
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorProcess, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from sandboxd.config import Config
from sandboxd.core.archive.rsync import WorkspaceEnd
from sandboxd.core.archive.store import Archive
from sandboxd.core.commands import BASE_PATH, Commands
from sandboxd.core.contexts.service import ContextCommands
from sandboxd.core.drain import Drains
from sandboxd.core.egress import EgressPolicies, checked_holder, trust_at_create
from sandboxd.core.exec.spec import check_env
from sandboxd.core.files import workspace
from sandboxd.core.files.paths import Parts
from sandboxd.core.fork import Forks, Prefilled
from sandboxd.core.layout import Layout
from sandboxd.core.processes.table import ProcessTable
from sandboxd.core.sandbox import PLAIN, BodyPlace, CreateRequest, Sandbox, SandboxListing
from sandboxd.core.watch.budget import WatchBudget, host_budget
from sandboxd.errors import BadRequest, Draining, NoCapacity, SandboxNotFound
from sandboxd.isolation.base import CgroupStats, Identity, Isolation, Limits, NoFreeUid
from sandboxd.isolation.disk.base import DiskUsage
from sandboxd.isolation.network.egress_policy import TRUST_ENV
from sandboxd.isolation.network.modes import NetworkUnavailable
from sandboxd.metrics import Metrics

T = TypeVar("T")

log = Logger()

__all__ = ["BASE_PATH", "Sandbox", "SandboxManager"]


@define
class SandboxManager(Commands, ContextCommands, Forks, Drains, EgressPolicies):
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
    recovering: bool = False
    """True while start-up reclaims a predecessor's leftovers (creates wait for it)."""
    metrics: Metrics = field(factory=Metrics)
    watch_budget: WatchBudget = field(factory=host_budget)
    """The inotify instances and watches the daemon may take under its own uid."""
    drain_poll: float = 0.1
    archive: Archive | None = None
    """Where ``item_id`` sandboxes are restored from and persisted to (``None``: no archive)."""
    """Seconds between looks at the running commands while a drain waits for them."""
    _devnull: int = field(init=False, default=-1)
    _drained: list[Deferred[None]] | None = field(init=False, default=None)
    _forced: bool = field(init=False, default=False)

    def start(self) -> Deferred[None]:
        """Reclaim what a crashed predecessor left behind (the root is prepared before, by
        :meth:`Layout.prepare_root`)."""
        self._devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.metrics.watch(lambda: self.isolation.uids.free, lambda: float(self.draining))
        self.isolation.prepare()
        self.kernels_probed()  # in a thread, beside the recovery (docs/extensions.rst)
        return self.recover()

    def recover(self) -> Deferred[None]:
        """Kill and remove every sandbox (cgroup, processes, files) found from a predecessor."""
        rids = sorted(set(self.layout.leftovers()) | self.isolation.leftovers())
        rids = [rid for rid in rids if rid not in self.sandboxes]
        self.recovering = True
        kills = [
            Deferred.fromCoroutine(
                self.isolation.dispose_leftover(rid, self.layout, self._in_admin_thread)
            )
            for rid in rids
        ]
        done: Deferred[Any] = DeferredList(kills, consumeErrors=True)

        def report(results: list[tuple[bool, Any]]) -> None:
            self.recovering = False
            for rid, (ok, failure) in zip(rids, results, strict=True):
                if not ok:
                    log.failure("recovery of {rid} failed", failure, rid=rid)
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

    def create(
        self, request: CreateRequest = PLAIN, made: tuple[str, Identity] | None = None
    ) -> Sandbox:
        """A new sandbox with its own identity, cgroup, directories and namespaces (not
        restored); ``400`` when its environment cannot be one, or when the replica does not
        offer or allow its network mode. With a template, its root is that template's, whose
        env comes under the request's; ``made``: its id and identity, its directories made and
        filled already (a fork's)."""
        self._admit()
        check_env(request.env, "env")
        template = request.template
        create_env = dict(request.env)
        if template is not None:
            create_env = {**template.env, **create_env}
        try:
            mode = self.isolation.namespaces.network.mode(request.network)
        except ValueError as e:
            raise BadRequest(f"network: {e}") from None
        holder = None if request.egress is None else checked_holder(mode, request.egress)
        rid, identity = made or (secrets.token_hex(8), self._identity())
        directories = self.layout if made is None else Prefilled(self.layout)
        if holder is not None:
            assert request.egress is not None
            holder.stage_policy(rid, request.egress)
        trust = trust_at_create(mode, request.egress, template)
        if trust:  # (runtimes that read no system bundle: docs/isolation.rst)
            create_env = {**TRUST_ENV, **create_env}
        try:
            root = None if template is None else template.rootfs
            isolation = self.isolation.create(
                rid, identity, self.limits, directories, mode, root, trust
            )
        except BaseException as e:
            if holder is not None:
                holder.stage_policy(rid, None)
            self.isolation.uids.release(identity)
            if isinstance(e, NetworkUnavailable):
                raise NoCapacity(f"network: {e}") from None
            raise
        now = self.clock.seconds()
        sandbox = Sandbox(
            rid,
            identity,
            create_env,
            created=now,
            last_active=now,
            isolation=isolation,
            item_id=request.item_id,
            network=mode.name,
        )
        if template is not None:
            sandbox.template = template
            sandbox.workdir = "" if template.workdir == "/" else template.workdir
        sandbox.processes = ProcessTable(self.config.processes_max)
        self.sandboxes[rid] = sandbox
        self.metrics.created.inc()
        self.metrics.sandboxes.set(len(self.sandboxes))
        log.info("created sandbox {rid} as uid {uid}", rid=rid, uid=identity.uid)
        return sandbox

    def _admit(self) -> None:
        if self.draining:
            raise Draining("the daemon is draining and accepts no new sandboxes")
        if self.recovering:
            raise NoCapacity("still reclaiming a predecessor's sandboxes; try again shortly")

    def _identity(self) -> Identity:
        try:
            return self.isolation.uids.allocate()
        except NoFreeUid as e:
            raise NoCapacity(str(e)) from None

    def template_users(self, name: str) -> int:
        """How many live sandboxes run in template ``name`` (it cannot be deleted then)."""
        return sum(
            1
            for sandbox in self.sandboxes.values()
            if sandbox.template and sandbox.template.name == name
        )

    def get(self, rid: str) -> Sandbox:
        """The live sandbox ``rid`` (its last activity is now), else ``404 SandboxNotFound``."""
        sandbox = self.sandboxes.get(rid)
        if sandbox is None:
            raise SandboxNotFound(f"no sandbox {rid!r}")
        sandbox.last_active = self.clock.seconds()
        return sandbox

    def body_place(self, rid: str) -> BodyPlace | None:
        """Where a request body naming the live sandbox ``rid`` is spooled as it arrives
        (``None``: no such sandbox); its activity is not touched."""
        sandbox = self.sandboxes.get(rid)
        if sandbox is None:
            return None
        return BodyPlace(self.layout.directory(rid), sandbox.isolation, sandbox.bodies)

    async def kill(self, rid: str) -> None:
        """Stop every process of the sandbox, then release its cgroup, files and uid."""
        sandbox = self.sandboxes.pop(rid, None)
        if sandbox is None:
            raise SandboxNotFound(f"no sandbox {rid!r}")
        self.metrics.sandboxes.set(len(self.sandboxes))
        sandbox.processes.close()
        for abort in list(sandbox.bodies):
            abort()  # bodies arriving in its directory: spools closed before it is removed
        for watch in list(sandbox.watches):
            watch.close(gone=True)
        for run in list(sandbox.running):
            run.abort()
        await self.close_contexts(sandbox)
        with suppress(OSError):  # no counters to read: nothing to add
            self.metrics.oom_kills.inc(sandbox.isolation.stats().oom_kills)
        # A file call already in a worker thread may still create entries (an upload's
        # parents): removing the tree before it ends could leave them behind.
        await DeferredList(list(sandbox.file_calls))
        try:
            await sandbox.isolation.dispose(self._in_admin_thread)
        except Exception:
            # Its processes may live on: the uid stays out of the pool until the next start-up
            # reclaims what is left (restart recovery).
            log.failure(
                "kill of {rid} failed: uid {uid} quarantined until restart",
                rid=rid,
                uid=sandbox.identity.uid,
            )
            raise
        self.isolation.uids.release(sandbox.identity)
        self.metrics.killed.inc()
        log.info("killed sandbox {rid}", rid=rid)

    def reap_idle(self) -> Deferred[Any]:
        """Kill every sandbox with no call, no running command and no output for ``idle_ttl``,
        except one whose front bounds its life (``lives_until``) before that time is reached.

        One failing kill is logged and does not stop the others (nor the next round).
        """
        now = self.clock.seconds()
        idle = [
            s
            for s in self.sandboxes.values()
            if not s.running
            and now - s.last_active >= self.config.idle_ttl
            and (s.lives_until is None or now >= s.lives_until)
        ]
        kills = []
        for sandbox in idle:
            log.info(
                "reaping sandbox {rid}: idle for {idle:.0f} s",
                rid=sandbox.rid,
                idle=now - sandbox.last_active,
            )
            self.metrics.reaped.inc()
            kill = Deferred.fromCoroutine(self.kill(sandbox.rid))
            kill.addErrback(self._log_reap_failure, sandbox.rid)
            kills.append(kill)
        return DeferredList(kills)

    @staticmethod
    def _log_reap_failure(failure: Failure, rid: str) -> None:
        log.failure("reaping {rid} failed", failure, rid=rid)

    def _in_admin_thread(self, work: Callable[[str], None], rid: str) -> Deferred[None]:
        """``work(rid)`` in the admin pool (a sandbox's tree can be large to remove)."""
        return deferToThreadPool(
            self.reactor,  # type: ignore[arg-type]
            self.admin_pool,
            work,
            rid,
        )

    # Files, each in a worker thread with the sandbox's filesystem credentials

    def files(self, sandbox: Sandbox, work: Callable[[str], T]) -> Deferred[T]:
        """Run ``work(workspace_path)`` as the sandbox (per-thread fsuid/fsgid)."""
        path = self.layout.workspace(sandbox.rid)
        # the work is held to the sandbox's disk limits even where root is exempt
        charged = sandbox.isolation.charged(lambda: work(path))
        running = self.isolation.fs.run(sandbox.identity, charged)
        ended: Deferred[None] = Deferred()
        sandbox.file_calls.add(ended)

        def end(result: Any) -> Any:
            sandbox.file_calls.discard(ended)
            ended.callback(None)
            return result

        return running.addBoth(end)

    def open_for_reading(self, sandbox: Sandbox, parts: Parts) -> Deferred[tuple[BinaryIO, int]]:
        uid = sandbox.identity.uid
        return self.files(sandbox, lambda ws: workspace.open_for_reading(ws, parts, uid))

    # Archive

    async def create_restored(self, request: CreateRequest = PLAIN) -> Sandbox:
        """A new sandbox; with an archive and an ``item_id``, the item is restored into it (as
        its uid) and only then marked ready. A missing archive entry gives an empty, ready
        workspace; a failed restore kills the sandbox and raises.
        """
        sandbox = self.create(request)
        item_id = request.item_id
        if self.archive is None or item_id is None:
            return sandbox
        try:
            await self.archive.restore(item_id, self._workspace_end(sandbox))
        except BaseException:
            with suppress(SandboxNotFound):
                await self.kill(sandbox.rid)
            raise
        self.layout.mark_ready(sandbox.rid)
        return sandbox

    async def persist(self, sandbox: Sandbox, delete: bool) -> bool:
        """Copy the workspace to the archive (``--delete`` with ``delete``); ``False`` for the
        no-op cases: no archive, no ``item_id``, or not ready (a half-restored workspace must never
        overwrite the archive).
        """
        if self.archive is None or sandbox.item_id is None or not self.is_ready(sandbox):
            return False
        await self.archive.persist(sandbox.item_id, self._workspace_end(sandbox), delete)
        return True

    def _workspace_end(self, sandbox: Sandbox) -> WorkspaceEnd:
        """The rsync end starts as the sandbox's commands do (the daemon's own work: not
        ptrace-able by them), in the workspace's real path."""
        workspace = self.layout.workspace(sandbox.rid)

        def start(argv: Sequence[str]) -> list[str]:
            return sandbox.isolation.start_argv(workspace, argv, own_work=True)

        return WorkspaceEnd(workspace, start)

    # Ready marker

    def mark_ready(self, sandbox: Sandbox) -> None:
        self.layout.mark_ready(sandbox.rid)

    def is_ready(self, sandbox: Sandbox) -> bool:
        return self.layout.is_ready(sandbox.rid)

    # Operators

    def stats(self, sandbox: Sandbox) -> CgroupStats:
        return sandbox.isolation.stats()

    def disk_usage(self, sandbox: Sandbox) -> DiskUsage:
        """What the disk layer counts for the sandbox (all ``None`` without disk limits)."""
        return sandbox.isolation.disk_usage()

    def listing(self) -> list[SandboxListing]:
        """Every live sandbox, for operators."""
        return [
            SandboxListing(
                rid=s.rid,
                created=s.created,
                last_active=s.last_active,
                ready=self.layout.is_ready(s.rid),
                execs=s.execs,
                network=s.network,
                egress=self.egress_policy(s),
                template=None if s.template is None else s.template.name,
            )
            for s in self.sandboxes.values()
        ]
