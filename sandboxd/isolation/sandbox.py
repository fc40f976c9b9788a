"""One sandbox's isolation: what the core holds of a sandbox's layers once they are made.

:meth:`~sandboxd.isolation.base.Isolation.create` makes a sandbox's layers in their order and
returns its :class:`SandboxIsolation`; the core keeps it with the sandbox and asks it, never the
bundle with a sandbox id, to start a process as the sandbox, to read its counters, to charge
file work to its disk limits, and at its end to dispose of it (docs/isolation.rst, "The
privilege-drop chain"; docs/architecture.rst, "The isolation package").
"""

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, TypeVar

from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorProcess

from sandboxd.isolation.base import (
    CgroupStats,
    Identity,
    InThread,
    SandboxDirectories,
    terminal_wrap,
)
from sandboxd.isolation.exec.helper import HelperWrapper
from sandboxd.isolation.exec.zygotes import PLACEHOLDER_COMMAND, PLACEHOLDER_CWD, ZygoteSpec

if TYPE_CHECKING:
    from sandboxd.isolation.base import Isolation
    from sandboxd.isolation.disk.base import DiskUsage

T = TypeVar("T")


@frozen
class SandboxIsolation:
    """The layers of sandbox ``rid``, whose processes and file calls run as ``identity``: its
    cgroup, its directories (``directories``: under its disk limit) and its namespaces, made
    by ``bundle`` (:meth:`~sandboxd.isolation.base.Isolation.create`)."""

    bundle: "Isolation"
    rid: str
    identity: Identity
    directories: SandboxDirectories

    def start_argv(
        self,
        cwd: str,
        argv: Sequence[str],
        own_work: bool = False,
        terminal: bool = False,
    ) -> list[str]:
        """The argv to spawn so that ``argv`` runs as this sandbox: the privilege-drop chain
        every process of a sandbox starts through (docs/isolation.rst, "The privilege-drop
        chain"), and the only one: its namespaces entered first, then the bundle's ``wrap``
        (cgroup, session, uid/gid, ``no_new_privs``, seccomp, ``cwd``). ``own_work``: a
        process the daemon starts for its own work, which the sandbox must not take over (the
        bundle's ``own_work_wrap``). ``terminal``: a command spawned on a pseudo-terminal,
        which becomes its controlling terminal (:func:`~sandboxd.isolation.base.terminal_wrap`).
        ``argv`` comes last, unchanged."""
        bundle = self.bundle
        wrap = bundle.wrap
        if own_work and bundle.own_work_wrap is not None:
            wrap = bundle.own_work_wrap
        if terminal:
            wrap = terminal_wrap(wrap)
        wrapped = wrap(self.identity, self.join_files, cwd, argv)
        return bundle.namespaces.enter(self.rid, wrapped, own_work)

    def spawner(self, reactor: IReactorProcess) -> IReactorProcess:
        """What spawns this sandbox's execs and background processes, and nothing else: an
        argv of :meth:`start_argv` with neither ``own_work`` nor ``terminal``
        (:meth:`~sandboxd.isolation.base.Isolation.spawner`: ``reactor``, or the spawn
        server's, which hands them to this sandbox's zygote, :attr:`zygote`, first)."""
        return self.bundle.spawner(reactor, self.zygote)

    @cached_property
    def zygote(self) -> ZygoteSpec | None:
        """What this sandbox's zygote is made from (docs/operating.rst, "Zygotes"); ``None``:
        no zygotes run, or the chain is not the exec helper's (the zygote is its ``zygote``
        step: the namespaces entered by the helper, then its ``sandbox`` step).

        A zygote takes the sandbox's execs and background processes (:meth:`spawner`): the
        chain of :meth:`start_argv` with neither ``own_work`` nor ``terminal``, the same for
        each but its cwd and command, which each exec brings (the zygote takes the chain's
        steps once, all but the last). It takes no other command: a terminal's (``--ctty``)
        is made its session's controlling terminal by the helper's own steps; the daemon's
        own work (``--no-ptrace``) runs from an execute-only copy and, in a template's
        sandbox, in the mount namespace as it was before the root switch. Both are spawned
        (and a zygote's child refuses them: ``sandboxd_exec_zygote.h``)."""
        zygotes = self.bundle.zygotes
        if zygotes is None:
            return None
        argv = self.start_argv(PLACEHOLDER_CWD, PLACEHOLDER_COMMAND)
        if not isinstance(self.bundle.wrap, HelperWrapper) or argv[0] != zygotes.server.helper:
            return None
        return ZygoteSpec(self.rid, self.identity.uid, tuple(argv))

    @cached_property
    def join_files(self) -> tuple[str, ...]:
        """The files a process writes to join its cgroup (the driver's ``join_files``),
        derived once per sandbox rather than at each of its commands (18 µs each on the
        cgroup v1 driver)."""
        return tuple(self.bundle.cgroups.join_files(self.rid))

    def stats(self) -> CgroupStats:
        """What its cgroup counts (``OSError`` where the counters cannot be read)."""
        return self.bundle.cgroups.stats(self.rid)

    def oom_kills(self) -> int:
        """How many processes the kernel has OOM-killed in its cgroup (one file read)."""
        return self.bundle.cgroups.oom_kills(self.rid)

    def freeze(self, frozen: bool) -> Deferred[bool]:
        """Freeze (``frozen``) or thaw its processes; fires with whether the driver can."""
        return self.bundle.cgroups.freeze(self.rid, frozen)

    def disk_usage(self) -> "DiskUsage":
        """Its disk usage and limits as the kernel counts them (all ``None`` without limits)."""
        return self.bundle.disk.usage(self.directories.directory(self.rid))

    def charged(self, work: Callable[[], T]) -> Callable[[], T]:
        """``work`` (its file work, in a thread) held to its disk limits even where the
        daemon's privilege would exempt it (the disk driver's charge)."""
        return self.bundle.disk.charged(work)

    async def dispose(self, in_thread: InThread) -> None:
        """End its layers (:meth:`~sandboxd.isolation.base.Isolation.dispose_leftover`):
        its zygote retired first (:meth:`~sandboxd.isolation.exec.zygotes.Zygotes.retire`),
        every process killed, its namespaces unpinned, its cgroup and directories removed.
        ``identity`` stays the caller's to release."""
        if self.bundle.zygotes is not None:
            self.bundle.zygotes.retire(self.rid)
        await self.bundle.dispose_leftover(self.rid, self.directories, in_thread)
