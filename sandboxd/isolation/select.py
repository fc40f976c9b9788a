"""Choose and prepare the isolation bundle at start-up, or refuse to start in one line.

``auto`` takes cgroup v2 where the unified hierarchy delegates ``memory cpu pids`` to the
daemon, else cgroup v1 where those hierarchies are mounted, and never falls back to no
isolation. ``none`` is only ever the result of asking for it by name.
"""

import os
from collections.abc import Callable

from attrs import evolve, field, frozen
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from sandboxd.config import Config
from sandboxd.isolation.base import Isolation, IsolationUnavailable, RunProgram
from sandboxd.isolation.cgroups.cgfiles import Kernel, read_text, write_text
from sandboxd.isolation.cgroups.cgroup1 import Cgroup1Driver
from sandboxd.isolation.cgroups.cgroup2 import Cgroup2Driver
from sandboxd.isolation.cgroups.hierarchy import parse_mountinfo, parse_proc_cgroup
from sandboxd.isolation.exec.chains import wraps
from sandboxd.isolation.exec.helper import (
    HELPER,
    helper_problem,
    run_program,
    seccomp_problem,
)
from sandboxd.isolation.exec.spawn_server import SpawnServer
from sandboxd.isolation.exec.wrapper import spawn_env
from sandboxd.isolation.exec.zygotes import Zygotes
from sandboxd.isolation.fscreds import (
    FsCredentialThreads,
    FsIds,
    LibcFsIds,
    drop_supplementary_groups,
)
from sandboxd.isolation.layers import (
    CPU_PLACEMENT,
    SECCOMP,
    SOCKET_BUFFERS,
    UID,
    UMASK,
    umask_isolates,
    unprotected,
    v2_sockets_uncharged,
)
from sandboxd.isolation.namespaces.creators import Creator, HelperCreator
from sandboxd.isolation.namespaces.kinds import AllLayers
from sandboxd.isolation.namespaces.netns_pool import build_pool
from sandboxd.isolation.namespaces.pins import NS_DIR, PLACES, Namespaces, kept_directories
from sandboxd.isolation.namespaces.pins import run_program as run_namespace_program
from sandboxd.isolation.namespaces.server import NamespaceServer
from sandboxd.isolation.namespaces.shell import ShellCreator, ShellPrograms
from sandboxd.isolation.network.modes import (
    HostNetwork,
    NetworkMode,
    NetworkPolicy,
    NoNetwork,
    egress_named,
    find_egress,
)
from sandboxd.isolation.none import NoCgroups, SweptUidPool, find_program, no_isolation
from sandboxd.isolation.uids import NumericUidPool

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
    egress: Callable[[Config], NetworkMode | None] = find_egress
    run: RunProgram = run_program


def find_helper(host: Host, as_root: bool) -> str | None:
    """The exec helper's path when it can be used, else ``None`` (with a warning: commands
    then start through the slower shell chain)."""
    problem = helper_problem(host.helper, as_root, host.lstat)
    if problem is None:
        return host.helper
    log.warn(
        "exec: helper unusable ({problem}): commands start through sh, setsid and setpriv,"
        " several milliseconds slower; build it with a C compiler (pip install . or"
        " python -m sandboxd.isolation.exec.helper_build)",
        problem=problem,
    )
    return None


Driver = Cgroup1Driver | Cgroup2Driver


def warn_unprotected(host: Host) -> None:
    """Warn for each ``fs.protected_*`` sysctl that is off: in shared sticky directories
    (``/tmp`` of the host network mode, ``/dev/shm``) one uid's planted link or file then
    redirects another's writes."""
    for name in unprotected(host.read):
        log.warn(
            "isolation: {name} is 0 on this host: a link or file planted in a shared sticky"
            " directory can redirect another sandbox's opens (sysctl -w {name}=1)",
            name=name,
        )


def require_seccomp(helper: str | None, run: RunProgram) -> None:
    """``IsolationUnavailable`` unless ``helper`` applies the filter and the kernel enforces it."""
    off = "SANDBOXD_SECCOMP=off runs commands unfiltered"
    if helper is None:
        raise IsolationUnavailable(
            f"seccomp: the filter needs the exec helper, which is unusable (see above); {off}"
        )
    problem = seccomp_problem(helper, run)
    if problem is not None:
        raise IsolationUnavailable(f"seccomp: {problem}; {off}")


def charge_socket_buffers(driver: Driver, wanted: bool, host: Host) -> bool:
    """Make ``driver`` charge socket buffers (v1) or check the kernel does (v2); True when
    they are charged. v2 always charges them unless booted with ``cgroup.memory=nosocket``."""
    if isinstance(driver, Cgroup1Driver):
        driver.socket_buffers = wanted
        return wanted
    uncharged = v2_sockets_uncharged(host.read("/proc/cmdline"))
    if wanted and uncharged:
        raise IsolationUnavailable(
            "socket buffers: the kernel was booted with cgroup.memory=nosocket, so cgroup v2"
            " does not charge them; SANDBOXD_SOCKET_BUFFERS=off accepts that"
        )
    if not wanted and not uncharged:
        log.info("socket buffers: SANDBOXD_SOCKET_BUFFERS=off, but cgroup v2 charges them anyway")
    return not uncharged


def _log_off(layer: str, why: str) -> None:
    log.warn("isolation: layer {layer} is OFF ({why})", layer=layer, why=why)


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
    a leaf cgroup), lowers the daemon's ``oom_score_adj`` and drops its supplementary groups;
    a refusal after the instance cgroups were made removes them again.
    ``file_pool`` stays the caller's to start and stop.
    """
    capacity = config.uid_max - config.uid_min + 1
    warn_unprotected(host)
    if not umask_isolates(config.umask):
        _log_off(
            UMASK, f"SANDBOXD_UMASK={config.umask:03o} lets other uids read what commands make"
        )
    if config.isolation == "none":
        _log_off(SECCOMP, "--isolation=none applies no system call filter")
        log.warn("namespaces: off (--isolation=none): sandboxes share IPC, /tmp and the network")
        policy = network_policy(config, frozenset(), host)
        if host.kernel.geteuid() == 0:
            bundle = uid_only(config, reactor, file_pool, host)
        else:
            helper = find_helper(host, as_root=False)
            bundle = no_isolation(reactor, file_pool, capacity, helper, config.umask)
        return evolve(bundle, namespaces=Namespaces(network=policy))
    euid = host.kernel.geteuid()
    if euid != 0:
        raise IsolationUnavailable(
            f"isolation {config.isolation} needs root (running as uid {euid});"
            " SANDBOXD_ISOLATION=none runs unisolated, for development only"
        )
    helper = find_helper(host, as_root=True)
    seccomp = config.seccomp == "default"
    if seccomp:
        require_seccomp(helper, host.run)
    else:
        _log_off(SECCOMP, "SANDBOXD_SECCOMP=off: commands may make every system call")
    served = {
        "server": " (execs: its spawn server)",
        "zygote": " (execs: a zygote per sandbox, through its spawn server)",
    }.get(config.spawner, "")
    wrap, own_work_wrap = wraps(helper, seccomp, config.umask, host.which, host.read)
    driver = choose_driver(config, reactor, host)
    sockets = charge_socket_buffers(driver, config.socket_buffers == "charged", host)
    if not sockets:
        _log_off(SOCKET_BUFFERS, "socket buffers are not charged to the sandboxes' memory")
    placed = config.cpu_placement == "spread"
    why_not = driver.place_cpus() if placed else "SANDBOXD_CPU_PLACEMENT=shared"
    if why_not is not None:
        placed = False
        _log_off(CPU_PLACEMENT, f"every sandbox may run on every CPU: {why_not}")
    try:
        driver.preflight()
        protect_daemon(host.set_oom_score_adj)
        drop_supplementary_groups(host.setgroups)
        namespaces = build_namespaces(config, helper, host)
    except BaseException:
        driver.unprepare()  # start-up stops here: no instance cgroup is left behind
        raise
    threads_reactor: IReactorFromThreads = reactor  # type: ignore[assignment]
    server = SpawnServer(helper) if helper and served else None
    return Isolation(
        name=driver.name,
        uids=NumericUidPool(config.uid_min, config.uid_max),
        cgroups=driver,
        fs=FsCredentialThreads(threads_reactor, file_pool, host.fsids()),
        wrap=wrap,
        own_work_wrap=own_work_wrap,
        owns_files=True,
        spawn_env=spawn_env,
        exec_chain="shell" if helper is None else f"helper {helper}" + served,
        spawn_server=server,
        zygotes=(
            Zygotes(server, config.zygote_quiet, config.zygotes_max)
            if server is not None and config.spawner == "zygote"
            else None
        ),
        namespaces=namespaces,
        layers=tuple(
            name
            for name, on in (
                (SECCOMP, seccomp),
                (UMASK, umask_isolates(config.umask)),
                (SOCKET_BUFFERS, sockets),
                (CPU_PLACEMENT, placed),
            )
            if on
        ),
    )


def uid_only(config: Config, reactor: IReactorTime, file_pool: ThreadPool, host: Host) -> Isolation:
    """``--isolation=none`` started as root: no cgroup, namespace or filter, but never a
    command as root. Each sandbox still gets a uid of the pool, its commands drop to it (the
    helper's privilege drop, else the shell chain's ``setpriv``) and its file calls run under
    it, as under real isolation: a command cannot read ``/etc/shadow`` or write the host's
    files. ``/healthz`` says so with :data:`~sandboxd.isolation.layers.UID`."""
    log.warn(
        "isolation: none, started as root: commands run as uids {low}-{high} of the pool,"
        " without cgroups, namespaces or a system call filter",
        low=config.uid_min,
        high=config.uid_max,
    )
    helper = find_helper(host, as_root=True)
    wrap, own_work_wrap = wraps(helper, False, config.umask, host.which, host.read)
    drop_supplementary_groups(host.setgroups)
    threads_reactor: IReactorFromThreads = reactor  # type: ignore[assignment]
    return Isolation(
        name="none",
        uids=SweptUidPool(config.uid_min, config.uid_max),
        cgroups=NoCgroups(),
        fs=FsCredentialThreads(threads_reactor, file_pool, host.fsids()),
        wrap=wrap,
        own_work_wrap=own_work_wrap,
        owns_files=True,
        spawn_env=spawn_env,
        exec_chain="shell" if helper is None else f"helper {helper}",
        layers=(UID, UMASK) if umask_isolates(config.umask) else (UID,),
    )


def network_policy(config: Config, kinds: frozenset[str], host: Host) -> NetworkPolicy:
    """The network modes offered (``none`` and ``egress`` need network namespaces; ``egress``
    its module and, unless ``SANDBOXD_NETWORK_ALLOW`` leaves it out, a host that can give it),
    checked against ``SANDBOXD_NETWORK`` and ``SANDBOXD_NETWORK_ALLOW``."""
    offered: dict[str, NetworkMode] = {"host": HostNetwork()}
    why = {"none": "no network namespaces", "egress": "no network namespaces"}
    if "net" in kinds:
        offered["none"] = NoNetwork()
        egress = _egress(config, host, why)
        if egress is not None:
            offered["egress"] = egress
    if config.isolation == "none":
        why = {
            name: f"{text}: SANDBOXD_ISOLATION=none (needs real isolation, as root)"
            for name, text in why.items()
        }
    elif not kinds >= {"net"}:
        why = {name: f"{text}: SANDBOXD_NAMESPACES leaves net out" for name, text in why.items()}
    return NetworkPolicy.choose(offered, config.network, config.network_allow, why)


def _egress(config: Config, host: Host, why: dict[str, str]) -> NetworkMode | None:
    """The egress mode, offered by default where the host can give it (``why`` says why not);
    asked for by name, its absence stops start-up (``IsolationUnavailable``)."""
    try:
        egress = host.egress(config)
    except IsolationUnavailable as e:
        if egress_named(config):
            raise
        why["egress"] = f"{e}"
        return None
    if egress is None and config.network_allow is not None:
        why["egress"] = f"SANDBOXD_NETWORK_ALLOW={','.join(config.network_allow)} leaves it out"
    elif egress is None:
        why["egress"] = "its module is not installed"
    return egress


def build_namespaces(config: Config, helper: str | None, host: Host) -> Namespaces:
    """The namespace layers of ``SANDBOXD_NAMESPACES`` (made through the helper, else
    ``unshare(1)``); nothing is made until :meth:`Namespaces.prepare`."""
    kinds = config.namespaces
    policy = network_policy(config, kinds, host)
    if not kinds:
        log.warn("namespaces: off (SANDBOXD_NAMESPACES=none): sandboxes share IPC, /tmp, network")
        return Namespaces(network=policy)
    root = os.path.realpath(config.root)
    creator: Creator
    run: RunProgram = run_namespace_program
    if helper is None:
        if "pid" in kinds and isinstance(kinds, AllLayers):
            log.warn(
                "namespaces: pid left out of all: its init and relay are the exec helper's "
                "(build it with a C compiler); sandboxes share the host's PID view"
            )
            kinds = frozenset(kinds - {"pid"})
        if "pid" in kinds:  # its init and the relay are the helper's (sandboxd_exec_ns.h)
            raise IsolationUnavailable("namespaces: pid needs the exec helper (a C compiler)")
        creator = ShellCreator(ShellPrograms.find(host.which))
    else:
        creator = HelperCreator(helper)
        run = NamespaceServer(helper)
    keep = []
    if "mount" in kinds:
        keep = kept_directories(PLACES, [root, os.path.realpath(config.tools_dir)])
    nsroot = os.path.join(root, NS_DIR)
    return Namespaces(
        kinds=kinds,
        nsroot=nsroot,
        network=policy,
        creator=creator,
        keep=keep,
        shm_bytes=config.memory_max or 64 << 20,
        run=run,
        pool=build_pool(config.netns_pool, kinds, policy.offered, nsroot),
    )
