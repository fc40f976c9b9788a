"""The cgroup v1 driver: one cgroup per sandbox in each of the memory, cpu, pids hierarchies.

For hybrid hosts, where the v1 hierarchies hold the controllers. Each hierarchy gets the same
layout under the daemon's own cgroup in it (or ``SANDBOXD_CGROUP_ROOT``)::

    <own>/sandboxd-<12 hex>/<rid>/

in ``memory``, ``cpu`` (``cpuacct`` too when mounted apart, for CPU time), ``pids``,
``freezer`` when mounted (for an atomic kill), and ``cpuset`` when CPU placement is on
(:mod:`sandboxd.isolation.cgroups.placement`). Co-mounted controllers share one directory.
v1 has no rule against processes in inner cgroups, so the daemon stays where it is.
"""

import errno
import os

from attrs import define, field
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from sandboxd.isolation.base import CgroupStats, IsolationUnavailable, Limits
from sandboxd.isolation.cgroups.cgfiles import (
    Kernel,
    make_new_dir,
    read_int,
    read_keyed,
    read_pids,
    read_text,
    remove_dir,
    remove_made,
    require_root,
    sweep,
)
from sandboxd.isolation.cgroups.hierarchy import Mount, directory, override_path, v1_mount
from sandboxd.isolation.cgroups.limits import CPU_PERIOD_US, v1_cpu_quota, v1_memory, v1_pids
from sandboxd.isolation.cgroups.placement import CpuPlacement, format_cpu_list, read_placement
from sandboxd.isolation.cgroups.polling import StillPopulated, wait_until
from sandboxd.isolation.naming import check_rid, instance_name, is_rid

REQUIRED = ("memory", "cpu", "pids")
OPTIONAL = ("cpuacct", "freezer")
CPUSET = "cpuset"
"""Used only with CPU placement (:meth:`Cgroup1Driver.place_cpus`)."""
HINT = "delegate the daemon's cgroups to it or set SANDBOXD_CGROUP_ROOT"
FREEZE_TIMEOUT = 1.0
TCP_LIMIT = "memory.kmem.tcp.limit_in_bytes"


def _missing(mounts: list[Mount]) -> list[str]:
    return [c for c in REQUIRED if v1_mount(mounts, c) is None]


@define
class Cgroup1Driver:
    """``CgroupDriver`` on the v1 hierarchies."""

    delegated: dict[str, str]
    """Controller → directory of the delegated cgroup in its hierarchy."""
    instance: str
    """Name of this daemon instance's directory in each hierarchy."""
    clock: IReactorTime
    kernel: Kernel
    kill_timeout: float = 30.0
    name: str = "cgroup1"
    socket_buffers: bool = True
    """Charge each sandbox's TCP socket buffers (``memory.kmem.tcp.limit_in_bytes``, set to the
    memory limit): v1 leaves them uncharged unless a limit is written."""
    made: list[str] = field(factory=list)
    """The instance directories :meth:`preflight` made (none that were there before)."""
    placement: CpuPlacement | None = None
    """Each sandbox's CPUs, in the cpuset hierarchy (:meth:`place_cpus`); None: all CPUs."""
    mems: str = ""
    """The memory nodes of the daemon's cpuset cgroup, given to every cpuset cgroup made
    beneath it (read once, by :meth:`place_cpus`)."""

    @classmethod
    def locate(
        cls,
        mounts: list[Mount],
        own: dict[str, str],
        cgroup_root: str | None,
        state_root: str,
        clock: IReactorTime,
        kernel: Kernel,
    ) -> "Cgroup1Driver":
        """Find each hierarchy's delegated directory; one-line refusal if one is missing."""
        missing = _missing(mounts)
        if missing:
            raise IsolationUnavailable(f"cgroup1: no {' '.join(missing)} hierarchy is mounted")
        override = None if cgroup_root is None else override_path(mounts, cgroup_root)
        delegated = {}
        for controller in (*REQUIRED, *OPTIONAL, CPUSET):
            mount = v1_mount(mounts, controller)
            if mount is None:
                continue
            path = override or own.get(controller)
            where = None if path is None else directory(mount, path)
            if where is not None:
                delegated[controller] = where
            elif controller in REQUIRED:
                raise IsolationUnavailable(
                    f"cgroup1: cannot place cgroup {path} in the {controller} hierarchy"
                    f" mounted at {mount.mountpoint}"
                )
        return cls(delegated, instance_name(state_root), clock, kernel)

    def _instance(self, controller: str) -> str | None:
        where = self.delegated.get(controller)
        return None if where is None else os.path.join(where, self.instance)

    def place_cpus(self) -> str | None:
        """Place each sandbox on the CPUs its quota covers, in the cpuset hierarchy, from
        :meth:`preflight` on; why it cannot (one line), or None."""
        where = self.delegated.get(CPUSET)
        if where is None:
            return f"{self.name}: no cpuset hierarchy holds the daemon's cgroup"
        found = read_placement(self.name, where, "cpuset.effective_cpus")
        if isinstance(found, str):
            return found
        try:
            self.mems = read_text(os.path.join(where, "cpuset.effective_mems")).strip()
        except OSError as e:
            return f"{self.name}: cannot read the memory nodes of {where} ({e.strerror})"
        self.placement = found
        return None

    def _cpuset_instance(self) -> str:
        instance = self._instance(CPUSET)
        assert instance is not None, "placed only where the cpuset hierarchy is delegated"
        return instance

    def _instances(self, every: bool = False) -> list[str]:
        """The instance directory of every hierarchy in use, each once (co-mounted ones
        share); ``every``: of the cpuset hierarchy too, placement or not (what a predecessor
        that placed its sandboxes left there is removed all the same)."""
        found = []
        placed = self.placement is not None or every
        for controller in (*REQUIRED, *OPTIONAL, *((CPUSET,) if placed else ())):
            path = self._instance(controller)
            if path is not None and path not in found:
                found.append(path)
        return found

    def _dirs(self, rid: str, every: bool = False) -> list[str]:
        check_rid(rid)
        return [os.path.join(instance, rid) for instance in self._instances(every)]

    def _file(self, controller: str, rid: str, name: str) -> str:
        instance = self._instance(controller)
        assert instance is not None
        return os.path.join(instance, check_rid(rid), name)

    def problem(self) -> str | None:
        """Why these hierarchies cannot host sandboxes (one line), or None when they can."""
        for path in self._instances():
            parent = os.path.dirname(path)
            if not os.path.isdir(parent):
                return f"cgroup1: cgroup {parent} does not exist"
        return None

    def preflight(self) -> None:
        """Check root and the delegated directories; create the instance directories (those
        made are remembered for :meth:`unprepare`)."""
        require_root(self.kernel, self.name)
        problem = self.problem()
        if problem is not None:
            raise IsolationUnavailable(problem)
        for path in self._instances():
            try:
                if make_new_dir(self.kernel, path):
                    self.made.append(path)
            except OSError as e:
                raise IsolationUnavailable(
                    f"cgroup1: cannot create {path} ({e.strerror}): {HINT}"
                ) from None
        if self.placement is not None:
            self._give_cpus(self._cpuset_instance(), self.placement.cpus)
        memory = self._instance("memory")
        assert memory is not None
        if self.socket_buffers and not os.path.exists(os.path.join(memory, TCP_LIMIT)):
            raise IsolationUnavailable(
                f"socket buffers: the memory hierarchy has no {TCP_LIMIT} to charge them"
                " (SANDBOXD_SOCKET_BUFFERS=off leaves them uncharged)"
            )

    def unprepare(self) -> None:
        """Remove the instance directories :meth:`preflight` made (start-up stopped)."""
        remove_made(self.kernel, self.made)

    def _give_cpus(self, path: str, cpus: tuple[int, ...]) -> None:
        """Let the cpuset cgroup at ``path`` run on ``cpus`` and use the daemon's memory nodes
        (a new cpuset cgroup has neither, and no process can join it until it has both)."""
        self.kernel.write(os.path.join(path, "cpuset.mems"), self.mems)
        self.kernel.write(os.path.join(path, "cpuset.cpus"), format_cpu_list(cpus))

    def create(self, rid: str, limits: Limits) -> None:
        """Make the sandbox's cgroup in every hierarchy and write its limits, and with CPU
        placement its CPUs (all or nothing)."""
        made: list[str] = []
        try:
            for path in self._dirs(rid):
                self.kernel.mkdir(path)
                made.append(path)
            memory = v1_memory(limits)
            self.kernel.write(self._file("memory", rid, "memory.limit_in_bytes"), memory)
            memsw = self._file("memory", rid, "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):
                self.kernel.write(memsw, memory)
            if self.socket_buffers:
                self.kernel.write(self._file("memory", rid, TCP_LIMIT), memory)
            self.kernel.write(self._file("cpu", rid, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
            self.kernel.write(self._file("cpu", rid, "cpu.cfs_quota_us"), v1_cpu_quota(limits))
            self.kernel.write(self._file("pids", rid, "pids.max"), v1_pids(limits))
            if self.placement is not None:
                cpus = self.placement.take(rid, limits.cpu_cores)
                self._give_cpus(os.path.join(self._cpuset_instance(), rid), cpus)
        except BaseException:
            for path in reversed(made):
                remove_dir(self.kernel, path)
            if self.placement is not None:
                self.placement.give_back(rid)
            raise

    def join_files(self, rid: str) -> list[str]:
        """``tasks`` of the sandbox's cgroup in every hierarchy.

        A single-threaded process that writes ``0`` there moves itself (its only thread) with no
        wait: the kernel takes its global threadgroup lock, whose writers wait for an RCU grace
        period once migrations have been quiet for a while, only to move another task or a whole
        thread group (``cgroup.procs``); docs/performance.rst has the figures.
        """
        return [os.path.join(path, "tasks") for path in self._dirs(rid)]

    def kill(self, rid: str) -> Deferred[None]:
        """Freeze, SIGKILL every process, thaw (or sweep until empty); fire once none is left."""
        return Deferred.fromCoroutine(self._kill(rid))

    async def _kill(self, rid: str) -> None:
        dirs = [path for path in self._dirs(rid) if os.path.isdir(path)]
        if not dirs:
            return
        procs = [os.path.join(path, "cgroup.procs") for path in dirs]
        freezer = self._instance("freezer")
        state = None if freezer is None else os.path.join(freezer, rid, "freezer.state")
        if state is not None and os.path.exists(state):
            self.kernel.write(state, "FROZEN")
            await wait_until(self.clock, lambda: read_text(state) == "FROZEN", FREEZE_TIMEOUT)
            sweep(procs, self.kernel)
            self.kernel.write(state, "THAWED")
        else:
            sweep(procs, self.kernel)
        if not await wait_until(
            self.clock,
            lambda: not read_pids(procs),
            self.kill_timeout,
            lambda: sweep(procs, self.kernel),
        ):
            raise StillPopulated(f"cgroup {rid} still has processes after {self.kill_timeout}s")

    def freeze(self, rid: str, frozen: bool) -> Deferred[bool]:
        """``freezer.state`` (where the freezer hierarchy is mounted): ``FROZEN`` or
        ``THAWED``, once the kernel says so; ``False`` without a freezer."""
        return Deferred.fromCoroutine(self._freeze(rid, frozen))

    async def _freeze(self, rid: str, frozen: bool) -> bool:
        freezer = self._instance("freezer")
        state = None if freezer is None else os.path.join(freezer, rid, "freezer.state")
        if state is None or not os.path.exists(state):
            return False
        wanted = "FROZEN" if frozen else "THAWED"
        self.kernel.write(state, wanted)
        return await wait_until(self.clock, lambda: read_text(state) == wanted, FREEZE_TIMEOUT)

    def remove(self, rid: str) -> None:
        """``rmdir`` the sandbox's cgroup in every hierarchy, memory last (missing is fine).

        A busy one raises once every other hierarchy was tried, and the memory cgroup is then
        kept, so that a sandbox whose removal failed or was cut short is still found by
        :meth:`leftovers`.
        """
        memory, *others = self._dirs(rid, every=True)
        failure: OSError | None = None
        for path in reversed(others):
            try:
                remove_dir(self.kernel, path)
            except OSError as e:
                failure = failure or e
        if failure is not None:
            raise failure
        remove_dir(self.kernel, memory)
        if self.placement is not None:
            self.placement.give_back(rid)

    def stats(self, rid: str) -> CgroupStats:
        """Memory now and at peak, CPU time (from cpuacct), processes and OOM kills."""
        cpu_usec = 0
        if self._instance("cpuacct") is not None:
            cpu_usec = read_int(self._file("cpuacct", rid, "cpuacct.usage")) // 1000
        return CgroupStats(
            memory_bytes=read_int(self._file("memory", rid, "memory.usage_in_bytes")),
            memory_peak_bytes=read_int(self._file("memory", rid, "memory.max_usage_in_bytes")),
            cpu_usec=cpu_usec,
            pids=read_int(self._file("pids", rid, "pids.current")),
            oom_kills=self.oom_kills(rid),
            cpus=None if self.placement is None else self.placement.held.get(rid),
        )

    def oom_kills(self, rid: str) -> int:
        """``oom_kill`` of the sandbox's ``memory.oom_control``."""
        return read_keyed(self._file("memory", rid, "memory.oom_control")).get("oom_kill", 0)

    def leftovers(self) -> list[str]:
        """Sandbox cgroups in the memory hierarchy's instance directory (a predecessor's).

        Only memory is looked at: every sandbox has its memory cgroup from the first moment of
        :meth:`create` to the last of :meth:`remove`, and the other hierarchies may be shared
        with daemons of other containers (seen: ``cpu`` and ``pids`` at ``/`` for all of them)
        that happen to use the same state root path, whose sandboxes are not ours to kill.
        """
        instance = self._instance("memory")
        assert instance is not None
        try:
            names = os.listdir(instance)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if is_rid(n) and os.path.isdir(os.path.join(instance, n)))

    def remove_instance(self) -> None:
        """``rmdir`` every instance directory left empty (clean shutdown)."""
        for path in self._instances(every=True):
            try:
                self.kernel.rmdir(path)
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.EBUSY, errno.ENOTEMPTY):
                    raise
