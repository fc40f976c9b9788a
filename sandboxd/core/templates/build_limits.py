"""What a template build may take of the host (docs/extensions.rst, "Building a template").

Each command a build runs as root inside the template being built (a ``RUN``, a ``WORKDIR``'s
directory) runs in a cgroup of its own, made by the isolation's cgroup driver under the
daemon's instance cgroup, with the memory, CPU and process limits of
``SANDBOXD_BUILD_MEMORY_MAX``, ``SANDBOXD_BUILD_CPU_CORES`` and ``SANDBOXD_BUILD_PIDS_MAX``: a
fork bomb stops at its process limit, a memory hog is OOM-killed and its step says so. The
cgroup is killed and removed when its command ends, fails or is cancelled. Its name has a
sandbox id's form, so a daemon killed mid-build leaves one that the next start's recovery
kills and removes as it does a sandbox's (docs/operating.rst, "Start-up, idle reaping and
restarts"). A whole build lasts at most ``SANDBOXD_BUILD_TIMEOUT``.
"""

import secrets
from collections.abc import Sequence

from attrs import define, frozen
from twisted.internet.defer import Deferred

from sandboxd.isolation.base import CgroupDriver, Limits

NO_LIMITS = Limits(memory_bytes=None, cpu_cores=None, pids=None)
BUILD_TIMEOUT = 1800.0
"""A build's longest run unless the daemon sets its own (``SANDBOXD_BUILD_TIMEOUT``'s default)."""


@frozen
class BuildLimits:
    """The cgroup driver of the build's commands (``None``: they run in the daemon's own
    cgroup, as a store made without the daemon's isolation has them), their limits, and the
    longest a build may run, in seconds."""

    cgroups: CgroupDriver | None = None
    limits: Limits = NO_LIMITS
    timeout: float = BUILD_TIMEOUT

    def cgroup(self) -> "RunCgroup | None":
        """A new cgroup with :attr:`limits` for one command (``None`` without a driver)."""
        if self.cgroups is None:
            return None
        group = RunCgroup(self.cgroups, secrets.token_hex(8))
        self.cgroups.create(group.id, self.limits)
        return group


@define
class RunCgroup:
    """One command's cgroup, named like a sandbox's (16 hex digits)."""

    cgroups: CgroupDriver
    id: str

    def join_files(self) -> Sequence[str]:
        """The files the command's first process writes ``0`` into to join it."""
        return self.cgroups.join_files(self.id)

    def oom_killed(self) -> bool:
        """Whether the kernel has OOM-killed a process in it (past its memory limit)."""
        return self.cgroups.oom_kills(self.id) > 0

    def kill(self) -> Deferred[None]:
        """Every process in it killed (fires once none is left)."""
        return self.cgroups.kill(self.id)

    async def end(self, daemon_stopping: bool = False) -> None:
        """Every process in it killed, then the cgroup removed; when the daemon is stopping,
        its instance cgroups too, if now empty (its stop found them holding this one)."""
        await self.kill()
        self.cgroups.remove(self.id)
        if daemon_stopping:
            self.cgroups.remove_instance()
