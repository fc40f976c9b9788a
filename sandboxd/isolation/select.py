"""Choose and prepare the isolation bundle at start-up, or refuse to start in one line.

``auto`` takes cgroup v2 where the unified hierarchy delegates ``memory cpu pids`` to the
daemon, else cgroup v1 where those hierarchies are mounted, and never falls back to no
isolation. ``none`` is only ever the result of asking for it by name.
"""

import os
from collections.abc import Callable

from attrs import field, frozen
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from sandboxd.config import Config
from sandboxd.isolation.base import Isolation, IsolationUnavailable
from sandboxd.isolation.cgfiles import Kernel, read_text, write_text
from sandboxd.isolation.cgroup1 import Cgroup1Driver
from sandboxd.isolation.cgroup2 import Cgroup2Driver
from sandboxd.isolation.fscreds import (
    FsCredentialThreads,
    FsIds,
    LibcFsIds,
    drop_supplementary_groups,
)
from sandboxd.isolation.helper import HELPER, HelperWrapper, helper_problem
from sandboxd.isolation.hierarchy import parse_mountinfo, parse_proc_cgroup
from sandboxd.isolation.none import find_program, no_isolation
from sandboxd.isolation.uids import NumericUidPool
from sandboxd.isolation.wrapper import Programs, Wrapper, spawn_env

log = Logger()

DAEMON_OOM_SCORE_ADJ = -900
"""The daemon's own ``oom_score_adj``: a sandbox's memory bomb must never take it down."""


def _set_oom_score_adj(value: int) -> None:
    write_text("/proc/self/oom_score_adj", str(value))


def protect_daemon(set_oom_score_adj: Callable[[int], None]) -> bool:
    """Lower the daemon's ``oom_score_adj`` so a host-wide OOM picks sandboxes first.

    Needs ``CAP_SYS_RESOURCE``; without it the daemon runs unprotected, with a warning (the
    sandboxes' own memory limits still hold, and their OOM kills stay inside their cgroups).
    """
    try:
        set_oom_score_adj(DAEMON_OOM_SCORE_ADJ)
    except OSError as e:
        log.warn(
            "isolation: cannot lower the daemon's oom_score_adj to {value} ({why}):"
            " a host-wide OOM may kill the daemon",
            value=DAEMON_OOM_SCORE_ADJ,
            why=e.strerror,
        )
        return False
    return True


@frozen
class Host:
    """What start-up reads from and changes on the machine; tests inject their own."""

    kernel: Kernel = field(factory=Kernel)
    read: Callable[[str], str] = read_text
    which: Callable[[str], str] = find_program
    set_oom_score_adj: Callable[[int], None] = _set_oom_score_adj
    setgroups: Callable[[list[int]], None] = os.setgroups
    fsids: Callable[[], FsIds] = LibcFsIds
    helper: str = HELPER
    lstat: Callable[[str], os.stat_result] = os.lstat


def find_helper(host: Host, as_root: bool) -> str | None:
    """The exec helper's path when it can be used, else ``None`` (with a warning: commands
    then start through the slower shell chain)."""
    problem = helper_problem(host.helper, as_root, host.lstat)
    if problem is None:
        return host.helper
    log.warn(
        "exec: helper unusable ({problem}): commands start through sh, setsid and setpriv,"
        " several milliseconds slower; build it with a C compiler (pip install . or"
        " python -m sandboxd.isolation.helper_build)",
        problem=problem,
    )
    return None


Driver = Cgroup1Driver | Cgroup2Driver


def choose_driver(config: Config, clock: IReactorTime, host: Host) -> Driver:
    """The cgroup driver for ``config.isolation`` (``cgroup2``, ``cgroup1`` or ``auto``)."""
    mounts = parse_mountinfo(host.read("/proc/self/mountinfo"))
    own = parse_proc_cgroup(host.read("/proc/self/cgroup"))
    args = (mounts, own, config.cgroup_root, config.root, clock, host.kernel)
    if config.isolation == "cgroup2":
        return Cgroup2Driver.locate(*args)
    if config.isolation == "cgroup1":
        return Cgroup1Driver.locate(*args)
    try:
        v2 = Cgroup2Driver.locate(*args)
    except IsolationUnavailable as e:
        v2_problem: str | None = str(e)
    else:
        v2_problem = v2.problem()
        if v2_problem is None:
            return v2
    try:
        return Cgroup1Driver.locate(*args)
    except IsolationUnavailable as e:
        raise IsolationUnavailable(f"no usable cgroup hierarchy: {v2_problem}; {e}") from None


def build_isolation(
    config: Config,
    reactor: IReactorTime,
    file_pool: ThreadPool,
    host: Host = Host(),
) -> Isolation:
    """The bundle for ``config.isolation``; ``IsolationUnavailable`` (one line) if impossible.

    For the cgroup drivers this also prepares the delegated subtree (the daemon may move into
    a leaf cgroup), lowers the daemon's ``oom_score_adj`` and drops its supplementary groups.
    ``file_pool`` stays the caller's to start and stop.
    """
    capacity = config.uid_max - config.uid_min + 1
    if config.isolation == "none":
        return no_isolation(reactor, file_pool, capacity, find_helper(host, as_root=False))
    euid = host.kernel.geteuid()
    if euid != 0:
        raise IsolationUnavailable(
            f"isolation {config.isolation} needs root (running as uid {euid});"
            " SANDBOXD_ISOLATION=none runs unisolated, for development only"
        )
    helper = find_helper(host, as_root=True)
    wrap = HelperWrapper(helper) if helper is not None else Wrapper(Programs.find(host.which))
    driver = choose_driver(config, reactor, host)
    driver.preflight()
    protect_daemon(host.set_oom_score_adj)
    drop_supplementary_groups(host.setgroups)
    threads_reactor: IReactorFromThreads = reactor  # type: ignore[assignment]
    return Isolation(
        name=driver.name,
        uids=NumericUidPool(config.uid_min, config.uid_max),
        cgroups=driver,
        fs=FsCredentialThreads(threads_reactor, file_pool, host.fsids()),
        wrap=wrap,
        owns_files=True,
        spawn_env=spawn_env,
        exec_chain="shell" if helper is None else f"helper {helper}",
    )
