"""Translating :class:`~sandboxd.isolation.base.Limits` into control-file values (v1 and v2)."""

from sandboxd.isolation.base import Limits

CPU_PERIOD_US = 100_000
"""The CFS period both drivers use: the quota is ``cores`` times this, per period."""

MIN_QUOTA_US = 1_000
"""The smallest quota the kernel accepts."""


def cpu_quota_us(cores: float | None) -> int | None:
    """Microseconds of CPU per period for ``cores`` (None: unlimited)."""
    if cores is None:
        return None
    return max(MIN_QUOTA_US, round(cores * CPU_PERIOD_US))


def v2_values(limits: Limits) -> dict[str, str]:
    """``{file: value}`` for a v2 cgroup (``memory.swap.max`` is written only where it exists)."""
    quota = cpu_quota_us(limits.cpu_cores)
    return {
        "memory.max": "max" if limits.memory_bytes is None else str(limits.memory_bytes),
        "memory.swap.max": "0",
        "cpu.max": f"{'max' if quota is None else quota} {CPU_PERIOD_US}",
        "pids.max": "max" if limits.pids is None else str(limits.pids),
    }


def v1_memory(limits: Limits) -> str:
    """``memory.limit_in_bytes`` (and ``memsw``: no swap on top): ``-1`` is unlimited."""
    return "-1" if limits.memory_bytes is None else str(limits.memory_bytes)


def v1_cpu_quota(limits: Limits) -> str:
    """``cpu.cfs_quota_us`` for a period of :data:`CPU_PERIOD_US`: ``-1`` is unlimited."""
    quota = cpu_quota_us(limits.cpu_cores)
    return "-1" if quota is None else str(quota)


def v1_pids(limits: Limits) -> str:
    """``pids.max``."""
    return "max" if limits.pids is None else str(limits.pids)
