"""The cgroup v2 driver: one cgroup per sandbox under the daemon's delegated subtree.

Layout, ``D`` being the delegated cgroup (the daemon's own, or ``SANDBOXD_CGROUP_ROOT``)::

    D/sandboxd-supervisor/     the daemon itself (and whatever shared D with it), when D is its own
    D/sandboxd-<12 hex>/       this daemon instance (derived from its state root)
    D/sandboxd-<12 hex>/<rid>/ one sandbox: memory.max, memory.swap.max, cpu.max, pids.max,
                               and cpuset.cpus with CPU placement

v2 lets only leaves hold processes once controllers are enabled for children, so the daemon
moves out of ``D`` into a leaf before enabling ``memory cpu pids`` in ``D`` and in the instance
directory (and ``cpuset`` with CPU placement: :mod:`sandboxd.isolation.cgroups.placement`).
With ``SANDBOXD_CGROUP_ROOT`` the operator delegated ``D`` for sandboxes only: nothing
is moved. The real root cgroup may hold processes and is never emptied.
"""

import errno
import os

from attrs import define, field
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from sandboxd.isolation.base import CgroupStats, IsolationUnavailable, Limits
from sandboxd.isolation.cgroups.cgfiles import (
    Kernel,
    make_dirs,
    make_new_dir,
    read_int,
    read_keyed,
    read_keyed_or_empty,
    read_pids,
    read_text,
    remove_dir,
    remove_made,
    require_root,
    sweep,
)
from sandboxd.isolation.cgroups.hierarchy import UNIFIED, Mount, directory, override_path, v2_mount
from sandboxd.isolation.cgroups.limits import v2_values
from sandboxd.isolation.cgroups.placement import CpuPlacement, format_cpu_list, read_placement
from sandboxd.isolation.cgroups.polling import StillPopulated, wait_until
from sandboxd.isolation.naming import check_rid, instance_name, is_rid

CONTROLLERS = ("memory", "cpu", "pids")
CPUSET = "cpuset"
"""Enabled only with CPU placement (:meth:`Cgroup2Driver.place_cpus`)."""
SUPERVISOR = "sandboxd-supervisor"
HINT = "give sandboxd a cgroup of its own (systemd Delegate=yes) or set SANDBOXD_CGROUP_ROOT"
FREEZE_TIMEOUT = 1.0


@define
class Cgroup2Driver:
    """``CgroupDriver`` on the unified hierarchy."""

    delegated: str
    """Directory of the delegated cgroup ``D``."""
    instance: str
    """Directory of this daemon instance's sandboxes, inside ``D``."""
    clock: IReactorTime
    kernel: Kernel
    evict: bool
    """Whether ``D`` is the daemon's own cgroup, to be emptied into the supervisor leaf."""
    kill_timeout: float = 30.0
    name: str = "cgroup2"
    made: list[str] = field(factory=list)
    """The instance directory, when :meth:`preflight` made it (not when it was there before)."""
    placement: CpuPlacement | None = None
    """Each sandbox's CPUs, by the cpuset controller (:meth:`place_cpus`); None: all CPUs."""

    @classmethod
    def locate(
        cls,
        mounts: list[Mount],
        own: dict[str, str],
        cgroup_root: str | None,
        state_root: str,
        clock: IReactorTime,
        kernel: Kernel,
    ) -> "Cgroup2Driver":
        """Find ``D`` from the mounts and ``/proc/self/cgroup``; one-line refusal if none."""
        mount = v2_mount(mounts)
        if mount is None:
            raise IsolationUnavailable("cgroup2: no cgroup2 hierarchy is mounted")
        if cgroup_root is not None:
            path = override_path(mounts, cgroup_root)
        elif UNIFIED in own:
            path = own[UNIFIED]
            if os.path.basename(path) == SUPERVISOR:
                path = os.path.dirname(path)
        else:
            raise IsolationUnavailable("cgroup2: /proc/self/cgroup has no cgroup v2 line")
        where = directory(mount, path)
        if where is None:
            raise IsolationUnavailable(f"cgroup2: cgroup {path} is not under {mount.mountpoint}")
        return cls(
            delegated=where,
            instance=os.path.join(where, instance_name(state_root)),
            clock=clock,
            kernel=kernel,
            evict=cgroup_root is None,
        )

    def problem(self) -> str | None:
        """Why this subtree cannot host sandboxes (one line), or None when it can."""
        available = self._delegated_controllers()
        return available if isinstance(available, str) else self._missing(available)

    def _delegated_controllers(self) -> list[str] | str:
        """The controllers delegated to the subtree, or why they cannot be read (one line)."""
        try:
            return read_text(os.path.join(self.delegated, "cgroup.controllers")).split()
        except OSError as e:
            return f"cgroup2: cannot read {self.delegated}/cgroup.controllers ({e.strerror})"

    def _missing(self, available: list[str]) -> str | None:
        """Which controllers sandboxes need are not among ``available`` (one line), or None."""
        missing = [c for c in CONTROLLERS if c not in available]
        if missing:
            return (
                f"cgroup2: controllers {' '.join(missing)} not delegated to {self.delegated}"
                f" (available: {' '.join(available) or 'none'})"
            )
        return None

    def place_cpus(self) -> str | None:
        """Place each sandbox on the CPUs its quota covers, by the cpuset controller, from
        :meth:`preflight` on; why it cannot (one line), or None."""
        available = self._delegated_controllers()
        if isinstance(available, str):
            return available
        problem = self._missing(available)
        if problem is not None:
            return problem
        if CPUSET not in available:
            return f"{self.name}: the cpuset controller is not delegated to {self.delegated}"
        found = read_placement(self.name, self.delegated, "cpuset.cpus.effective")
        if isinstance(found, str):
            return found
        self.placement = found
        return None

    def _controllers(self) -> tuple[str, ...]:
        return (*CONTROLLERS, *((CPUSET,) if self.placement is not None else ()))

    def preflight(self) -> None:
        """Check root and controllers, then prepare ``D`` (idempotent).

        Moves the processes of the daemon's own cgroup into the supervisor leaf, enables
        ``memory cpu pids`` (and ``cpuset`` with CPU placement) for the children of ``D`` and
        of the instance directory.
        """
        require_root(self.kernel, self.name)
        problem = self.problem()
        if problem is not None:
            raise IsolationUnavailable(problem)
        if self.evict and os.path.exists(os.path.join(self.delegated, "cgroup.type")):
            self._evict()
        self._enable(self.delegated)
        try:
            if make_new_dir(self.kernel, self.instance):
                self.made.append(self.instance)
        except OSError as e:
            raise IsolationUnavailable(
                f"cgroup2: cannot create {self.instance} ({e.strerror}): {HINT}"
            ) from None
        self._enable(self.instance)

    def unprepare(self) -> None:
        """Remove the instance directory :meth:`preflight` made (start-up stopped). The
        supervisor leaf stays: the daemon itself is in it until it exits."""
        remove_made(self.kernel, self.made)

    def _evict(self) -> None:
        """Move every process of ``D`` (the daemon first) into ``D/sandboxd-supervisor``."""
        procs = os.path.join(self.delegated, "cgroup.procs")
        leaf = os.path.join(self.delegated, SUPERVISOR)
        me = self.kernel.getpid()
        for _ in range(10):
            pids = read_pids([procs])
            if not pids:
                return
            make_dirs(self.kernel, leaf)
            for pid in sorted(pids, key=lambda p: (p != me, p)):
                try:
                    self.kernel.write(os.path.join(leaf, "cgroup.procs"), str(pid))
                except ProcessLookupError:
                    continue
                except OSError as e:
                    raise IsolationUnavailable(
                        f"cgroup2: cannot move process {pid} out of {self.delegated}"
                        f" ({e.strerror}): {HINT}"
                    ) from None
        raise IsolationUnavailable(f"cgroup2: processes keep appearing in {self.delegated}: {HINT}")

    def _enable(self, where: str) -> None:
        control = os.path.join(where, "cgroup.subtree_control")
        enabled = read_text(control).split()
        missing = [c for c in self._controllers() if c not in enabled]
        if not missing:
            return
        try:
            self.kernel.write(control, " ".join(f"+{c}" for c in missing))
        except OSError as e:
            why = "it holds processes" if e.errno == errno.EBUSY else e.strerror
            raise IsolationUnavailable(
                f"cgroup2: cannot enable {' '.join(missing)} in {control} ({why}): {HINT}"
            ) from None

    def _dir(self, rid: str) -> str:
        return os.path.join(self.instance, check_rid(rid))

    def create(self, rid: str, limits: Limits) -> None:
        """Make the sandbox's cgroup and write its limits, and with CPU placement its CPUs
        (removed again if a write fails)."""
        path = self._dir(rid)
        self.kernel.mkdir(path)
        try:
            values = v2_values(limits)
            if self.placement is not None:
                cpus = self.placement.take(rid, limits.cpu_cores)
                values["cpuset.cpus"] = format_cpu_list(cpus)
            for name, value in values.items():
                target = os.path.join(path, name)
                if name == "memory.swap.max" and not os.path.exists(target):
                    continue  # no swap accounting on this kernel: nothing to limit
                self.kernel.write(target, value)
        except BaseException:
            remove_dir(self.kernel, path)
            if self.placement is not None:
                self.placement.give_back(rid)
            raise

    def join_files(self, rid: str) -> tuple[str]:
        """The sandbox cgroup's ``cgroup.procs``."""
        return (os.path.join(self._dir(rid), "cgroup.procs"),)

    def kill(self, rid: str) -> Deferred[None]:
        """``cgroup.kill`` (or freeze, SIGKILL each, thaw); fire once nothing is left."""
        return Deferred.fromCoroutine(self._kill(self._dir(rid)))

    async def _kill(self, path: str) -> None:
        if not os.path.isdir(path):
            return
        procs = [os.path.join(path, "cgroup.procs")]
        kill_file = os.path.join(path, "cgroup.kill")
        has_kill = os.path.exists(kill_file)

        def again() -> None:
            if has_kill:
                self.kernel.write(kill_file, "1")
            else:
                sweep(procs, self.kernel)

        if has_kill:
            again()
        else:
            freeze = os.path.join(path, "cgroup.freeze")
            self.kernel.write(freeze, "1")
            events = os.path.join(path, "cgroup.events")
            await wait_until(
                self.clock, lambda: read_keyed_or_empty(events).get("frozen") == 1, FREEZE_TIMEOUT
            )
            sweep(procs, self.kernel)
            self.kernel.write(freeze, "0")
        if not await wait_until(
            self.clock, lambda: not self._populated(path), self.kill_timeout, again
        ):
            raise StillPopulated(f"cgroup {path} still has processes after {self.kill_timeout}s")

    def _populated(self, path: str) -> bool:
        return read_keyed_or_empty(os.path.join(path, "cgroup.events")).get("populated", 0) == 1

    def freeze(self, rid: str, frozen: bool) -> Deferred[bool]:
        """``cgroup.freeze``, once ``cgroup.events`` says the cgroup is (or is no longer)
        frozen."""
        return Deferred.fromCoroutine(self._freeze(self._dir(rid), frozen))

    async def _freeze(self, path: str, frozen: bool) -> bool:
        self.kernel.write(os.path.join(path, "cgroup.freeze"), "1" if frozen else "0")
        events = os.path.join(path, "cgroup.events")
        return await wait_until(
            self.clock,
            lambda: read_keyed_or_empty(events).get("frozen") == int(frozen),
            FREEZE_TIMEOUT,
        )

    def remove(self, rid: str) -> None:
        """``rmdir`` the sandbox's cgroup (missing is fine)."""
        remove_dir(self.kernel, self._dir(rid))
        if self.placement is not None:
            self.placement.give_back(rid)

    def stats(self, rid: str) -> CgroupStats:
        """Memory now and at peak, CPU time, process count and OOM kills, from the cgroup."""
        path = self._dir(rid)
        memory = read_int(os.path.join(path, "memory.current"))
        peak_file = os.path.join(path, "memory.peak")
        peak = read_int(peak_file) if os.path.exists(peak_file) else memory
        return CgroupStats(
            memory_bytes=memory,
            memory_peak_bytes=peak,
            cpu_usec=read_keyed(os.path.join(path, "cpu.stat")).get("usage_usec", 0),
            pids=read_int(os.path.join(path, "pids.current")),
            oom_kills=self.oom_kills(rid),
            cpus=None if self.placement is None else self.placement.held.get(rid),
        )

    def oom_kills(self, rid: str) -> int:
        """``oom_kill`` of the sandbox's ``memory.events``."""
        return read_keyed(os.path.join(self._dir(rid), "memory.events")).get("oom_kill", 0)

    def leftovers(self) -> list[str]:
        """Sandbox cgroups in this instance's directory (a crashed predecessor's)."""
        try:
            names = os.listdir(self.instance)
        except FileNotFoundError:
            return []
        return sorted(
            n for n in names if is_rid(n) and os.path.isdir(os.path.join(self.instance, n))
        )

    def remove_instance(self) -> None:
        """``rmdir`` the instance directory if no sandbox is left in it (clean shutdown)."""
        try:
            self.kernel.rmdir(self.instance)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EBUSY, errno.ENOTEMPTY):
                raise
