"""Which CPUs each sandbox's cgroup may run on (its cpuset): CPU placement.

A sandbox's quota (``SANDBOXD_CPU_CORES``) bounds its CPU time per period, not where it
runs: with four busy threads and a one-core quota, a sandbox spends its quota on every CPU of
the host at once, then is throttled, so its neighbours wait for a CPU for the first part of
each period. Placed, a sandbox runs only on as many CPUs as its quota rounds up to, the ones
the fewest other sandboxes hold, and what it cannot use of the others is left to its
neighbours and the daemon (docs/isolation.rst, "CPU placement").

Placement is static: chosen when the cgroup is made, by count, not by load, and given back at
its removal. A sandbox whose quota covers every CPU (or that has none) runs on all of them.
"""

import math
import os
from collections import Counter

from attrs import define, field

from sandboxd.isolation.cgroups.cgfiles import read_text


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The CPUs of a kernel CPU list (``0-3,6``, as ``cpuset.cpus`` reads), in order."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: tuple[int, ...]) -> str:
    """A kernel CPU list of ``cpus`` (``0,2``)."""
    return ",".join(str(cpu) for cpu in cpus)


def cpus_for(cores: float | None, available: int) -> int:
    """How many CPUs a quota of ``cores`` covers (all of them for no quota)."""
    if cores is None:
        return available
    return min(available, max(1, math.ceil(cores)))


@define
class CpuPlacement:
    """The CPUs sandboxes may be placed on, and which each holds."""

    cpus: tuple[int, ...]
    """The CPUs the daemon's own cgroup may use (its effective cpuset)."""
    held: dict[str, tuple[int, ...]] = field(factory=dict)

    def take(self, rid: str, cores: float | None) -> tuple[int, ...]:
        """The CPUs for sandbox ``rid`` with a quota of ``cores``: as many as the quota
        covers, those the fewest sandboxes hold (the lowest numbers among equals); every CPU
        when the quota covers them all. Held until :meth:`give_back`."""
        want = cpus_for(cores, len(self.cpus))
        if want == len(self.cpus):
            chosen = self.cpus
        else:
            holders = Counter(cpu for cpus in self.held.values() for cpu in cpus)
            chosen = tuple(sorted(sorted(self.cpus, key=lambda cpu: (holders[cpu], cpu))[:want]))
        self.held[rid] = chosen
        return chosen

    def give_back(self, rid: str) -> None:
        """Sandbox ``rid``'s cgroup is gone: its CPUs hold one sandbox fewer."""
        self.held.pop(rid, None)


def read_placement(driver: str, cgroup: str, name: str) -> CpuPlacement | str:
    """A placement over the CPUs that file ``name`` of ``cgroup`` lists, or why there can be
    none (one line, after ``driver``'s name)."""
    try:
        cpus = parse_cpu_list(read_text(os.path.join(cgroup, name)))
    except (OSError, ValueError) as e:
        return f"{driver}: cannot read the CPUs of {cgroup} ({e})"
    if not cpus:
        return f"{driver}: {cgroup} has no CPU"
    return CpuPlacement(cpus)
