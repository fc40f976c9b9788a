"""The inotify instances and watches the daemon may hold under its own uid.

Where a sandbox's watches cannot be charged to the sandbox's uid (a daemon started as a user,
or a machine whose ``setresuid`` number is not known: :mod:`.charge`), they count against the
daemon's user's kernel limits (``fs.inotify.max_user_instances``,
``fs.inotify.max_user_watches``), which that user's other processes share. The daemon then
holds at most the limits less a reserve it never takes, and no sandbox more than a share of
that (docs/isolation.rst, "Kernel quotas").
"""

from collections.abc import Callable
from pathlib import Path

from attrs import define, field

LIMITS = Path("/proc/sys/fs/inotify")
RESERVE = 4
"""The daemon leaves at least a quarter of each limit to its user's other processes."""
SHARE = 4
"""One sandbox takes at most a quarter of the daemon's watches."""
UNKNOWN_INSTANCES = 128
UNKNOWN_WATCHES = 8192
"""The kernel's own defaults, assumed where the limits cannot be read."""


def kernel_limit(name: str, unknown: int, limits: Path = LIMITS) -> int:
    """The sysctl ``fs.inotify.<name>``, or ``unknown`` where it cannot be read."""
    try:
        return int((limits / name).read_text())
    except (OSError, ValueError):
        return unknown


@define
class WatchBudget:
    """What the daemon may still take: :meth:`open_instance` per watch, then :meth:`take`
    watches for its walks (counted per sandbox), each given back as it goes."""

    instances: int
    watches: int
    per_sandbox: int
    instances_used: int = 0
    by_sandbox: dict[str, int] = field(factory=dict)
    """The watches each sandbox holds (a sandbox that holds none is not there)."""

    @property
    def watches_used(self) -> int:
        """The watches held, every sandbox's."""
        return sum(self.by_sandbox.values())

    @classmethod
    def of_limits(cls, max_instances: int, max_watches: int) -> "WatchBudget":
        """The budget under kernel limits of ``max_instances`` and ``max_watches``."""
        watches = max_watches - max_watches // RESERVE
        return cls(max_instances - max_instances // RESERVE, watches, max(1, watches // SHARE))

    def account(self, rid: str) -> "Account | None":
        """An instance for a watch of sandbox ``rid``, and its account of watches; ``None``
        when every instance the budget allows is held."""
        if self.instances_used >= self.instances:
            return None
        self.instances_used += 1
        return Account(self, rid)

    def take(self, rid: str, wanted: int) -> int:
        """Take up to ``wanted`` watches for sandbox ``rid``; how many were granted."""
        held = self.by_sandbox.get(rid, 0)
        granted = max(0, min(wanted, self.watches - self.watches_used, self.per_sandbox - held))
        if granted:
            self.by_sandbox[rid] = held + granted
        return granted

    def give(self, rid: str, count: int) -> None:
        """Give back ``count`` watches of sandbox ``rid``."""
        if not count:
            return
        left = self.by_sandbox[rid] - count
        if left:
            self.by_sandbox[rid] = left
        else:
            del self.by_sandbox[rid]


def host_budget(read: Callable[[str, int], int] = kernel_limit) -> WatchBudget:
    """The budget under this host's limits, as they are now."""
    return WatchBudget.of_limits(
        read("max_user_instances", UNKNOWN_INSTANCES), read("max_user_watches", UNKNOWN_WATCHES)
    )


@define
class Account:
    """One watch's part of a :class:`WatchBudget`: its instance and the watches it holds."""

    budget: WatchBudget
    rid: str
    held: int = 0
    closed: bool = False

    def take(self, wanted: int) -> int:
        """Take up to ``wanted`` watches; how many were granted."""
        granted = self.budget.take(self.rid, wanted)
        self.held += granted
        return granted

    def give(self, count: int) -> None:
        """Give back ``count`` of the watches held."""
        self.budget.give(self.rid, count)
        self.held -= count

    def close(self) -> None:
        """Give back the instance and every watch held (once: the instance is closed)."""
        if self.closed:
            return
        self.closed = True
        self.give(self.held)
        self.budget.instances_used -= 1
