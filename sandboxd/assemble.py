"""The composition root: configuration, reactor and environment in, the daemon's objects out.

:func:`assemble` runs the boot steps of ``twistd sandboxd`` in order (those that only check
come first, then each that makes something on the host, its undo registered with ``undo``
before it can fail; the steps that stand alone are in :mod:`sandboxd.boot`) and wires what
they made: the sandbox manager and its fronts (:func:`fronts`), their sites and listeners, and
the service tree (:class:`sandboxd.service.SandboxdService`). Every object gets what it uses
through its constructor, and the capabilities ``/healthz`` lists are computed once.

:func:`in_process` is the same manager and fronts without the host's boot steps: the test
harnesses call it with the pieces they swap (a ``Clock``, an isolation whose file work is
synchronous, a pool that runs work at once).
"""

import atexit
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
from twisted.application.internet import TimerService
from twisted.logger import Logger, jsonFileLogObserver
from twisted.python.threadpool import ThreadPool

import sandboxd
from sandboxd.boot import (
    fail,
    read_token,
    reap_interval,
    start_disk,
    start_e2b,
    start_guard,
    start_root,
)
from sandboxd.config import Config, ConfigError
from sandboxd.core.archive.store import Archive, ArchiveUnavailable, build_archive
from sandboxd.core.layout import Layout
from sandboxd.core.manager import SandboxManager
from sandboxd.core.templates.build_limits import BuildLimits
from sandboxd.core.templates.store import TemplateStore
from sandboxd.core.tools.resolver import ToolResolver, build_tools
from sandboxd.e2b.api import E2BFront, make_front
from sandboxd.http.api import SandboxAPI, spool_places
from sandboxd.isolation.base import Isolation, IsolationUnavailable, Limits
from sandboxd.isolation.network.egress_proxy_start import (
    egress_proxy,
    rule_tls,
    socks_upstream,
)
from sandboxd.isolation.network.egress_socks import SocksUpstream
from sandboxd.isolation.select import build_isolation
from sandboxd.listen import Listeners, capabilities, reaches_beyond_loopback
from sandboxd.service import ExitStatus, SandboxdService
from sandboxd.stop_signals import on_next_stop_signal
from sandboxd.undo import StartupUndo
from sandboxd.web import guard
from sandboxd.web.body_pace import BodyPace
from sandboxd.web.site import SpoolingSite, can_spool, make_site
from sandboxd.web.spool import SpoolThreads

log = Logger()


@attrs.frozen
class Pools:
    """The daemon's thread pools, started and stopped by its service."""

    files: ThreadPool
    """File work, as the sandboxes' uids (the isolation's)."""
    admin: ThreadPool
    """Root-level work that may be slow (the manager's, the archive's, the tools')."""
    spool: ThreadPool
    """The writes of request bodies to their spool files."""

    @classmethod
    def of_the_daemon(cls) -> "Pools":
        """The pools at the daemon's sizes (not started: its service starts them)."""
        return cls(
            ThreadPool(minthreads=1, maxthreads=16, name="sandboxd-files"),
            ThreadPool(minthreads=0, maxthreads=4, name="sandboxd-admin"),
            ThreadPool(minthreads=0, maxthreads=4, name="sandboxd-spool"),
        )


@attrs.frozen
class Fronts:
    """A sandbox manager and the two fronts serving it."""

    manager: SandboxManager
    api: SandboxAPI
    """The native API (wire contract v1 and its extensions)."""
    e2b: E2BFront
    """The E2B-compatible front (listened on only with ``SANDBOXD_E2B_LISTEN``)."""


@attrs.frozen
class Daemon:
    """The daemon's object graph; ``twistd`` runs :attr:`service`."""

    fronts: Fronts
    site: SpoolingSite
    """The native API's site."""
    service: SandboxdService


def fronts(
    config: Config,
    reactor: Any,
    clock: Any,
    isolation: Isolation,
    admin_pool: Any,
    layout: Layout,
    *,
    token: bytes | None,
    archive: Archive | None = None,
    tools: ToolResolver | None = None,
    pod_ip: str | None = None,
    extra_capabilities: Iterable[str] = (),
    on_drain: Callable[[], None] | None = None,
) -> Fronts:
    """The manager of the sandboxes under ``layout`` (timers on ``clock``, processes from
    ``reactor``), the native API on it (``/healthz`` lists ``extra_capabilities`` beside its
    own; ``POST /drain`` calls ``on_drain``), and the E2B front on it, keyed by ``token``."""
    manager = SandboxManager(config, reactor, clock, isolation, admin_pool, layout, archive=archive)
    templates = _templates(config, reactor, admin_pool, layout)
    if templates is not None:  # pragma: no branch - every test daemon has a template store
        templates.users = manager.template_users  # a template in use cannot be deleted
        templates.build_limits = build_limits(config, isolation)
    api = SandboxAPI(
        manager,
        templates=templates,
        token=token,
        pod_url=config.pod_url,
        pod_ip=pod_ip,
        tools=tools,
        extra_capabilities=extra_capabilities,
        on_drain=on_drain,
    )
    return Fronts(manager, api, make_front(manager, token, api.ports, templates))


def _templates(config: Config, reactor: Any, pool: Any, layout: Layout) -> TemplateStore | None:
    """The template store under the state root, what a stopped daemon's import left removed;
    ``None`` (no ``templates`` capability) when it cannot be made there."""
    try:
        return TemplateStore.open(
            layout.root, config.template_max, layout.owns_files, reactor, pool
        )
    except OSError as e:
        log.warn("templates: unavailable: {error}", error=e)
        return None


def build_limits(config: Config, isolation: Isolation) -> BuildLimits:
    """What a template build's commands may take: a cgroup each from the isolation's driver
    with the ``SANDBOXD_BUILD_*`` limits, and the build's longest run."""
    limits = Limits(config.build_memory_max, config.build_cpu_cores, config.build_pids_max)
    return BuildLimits(isolation.cgroups, limits, config.build_timeout)


def in_process(
    config: Config,
    reactor: Any,
    clock: Any,
    isolation: Isolation,
    admin_pool: Any,
    *,
    token: bytes | None,
    tools: ToolResolver | None = None,
) -> Fronts:
    """:func:`fronts` on the state root made ready, without the rest of the boot: no lock, no
    disk limits, no listening, no service (``POST /drain`` refuses creates, and the daemon
    goes on). The caller starts the manager (recovery) and closes it."""
    layout = Layout(os.path.realpath(config.root), owns_files=isolation.owns_files)
    layout.prepare_root()
    return fronts(config, reactor, clock, isolation, admin_pool, layout, token=token, tools=tools)


def assemble(
    config: Config,
    reactor: Any,
    environ: Mapping[str, str],
    undo: StartupUndo,
    exit_status: ExitStatus,
) -> Daemon:
    """The daemon for ``config``, each boot step logged as it runs; a step that fails stops
    start-up with one line naming it (:func:`sandboxd.boot.fail`), and what the steps before
    it made stays registered with ``undo``."""
    log.info("sandboxd {version} starting", version=sandboxd.__version__)
    token = _token(config)
    # The root is locked before anything else is made: a second daemon on it stops here,
    # before it touches the cgroups of the first (their names come from the root).
    layout = start_root(config, undo)
    pools = Pools.of_the_daemon()
    isolation = _isolation(config, reactor, pools.files, undo)
    layout = attrs.evolve(layout, owns_files=isolation.owns_files)
    isolation = attrs.evolve(isolation, disk=start_disk(config, layout))
    # before the namespaces' prepare, which may start the egress layer (and its proxy)
    egress = isolation.namespaces.network.offered.get("egress")
    tls = None if egress is None else rule_tls(config, reactor, undo)
    proxy = egress_proxy(config, reactor, egress, socks=_socks5(config), tls=tls)
    _namespaces(isolation, undo)
    archive = _archive(config, reactor, pools.admin)
    tools = build_tools(config.tools_dir, reactor, pools.admin)
    spool_dir = _spool_dir(layout)
    spool_threads = SpoolThreads(reactor, pools.spool)  # request bodies' writes
    gate, auth_gate = start_guard(config, reactor)
    listen_capabilities = capabilities(config.listen, config.dual_stack == "on")
    e2b = ["e2b"] if config.e2b_listen is not None else []
    served = fronts(
        config,
        reactor,
        reactor,
        isolation,
        pools.admin,
        layout,
        token=token,
        archive=archive,
        tools=tools,
        pod_ip=environ.get("POD_IP"),
        extra_capabilities=[
            *listen_capabilities,
            *guard.capabilities(gate.limits, auth_gate, config.body_pace is not None),
            *e2b,
        ],
        # The service (made below, from the fronts' manager and site) drains and exits.
        on_drain=lambda: service.drain_and_exit(),
    )
    if proxy is not None:  # its refusals counted in the manager's metrics
        refused = served.manager.metrics.egress_refused
        proxy.on_refused = lambda rid, reason: refused.labels(rid, reason).inc()
        proxy.on_forget = refused.remove  # a sandbox's counts go with it
    pace = BodyPace(reactor, config.body_pace)  # one for both fronts
    site = make_site(
        served.api.app.resource(),
        config.max_body,
        spool_dir=spool_dir,
        gate=gate,
        admit=served.api.authoriser.admit if auth_gate else None,
        refusal=served.api.authoriser.refusal,
        spool_threads=spool_threads,
        spool_place=spool_places(served.manager),
        pace=pace,
    )
    listeners = Listeners(reactor, config.listen, site, dual_stack=config.dual_stack == "on")
    _log_listen(config, listen_capabilities)
    more_listeners = []
    if config.e2b_listen is not None:
        spool = (spool_dir, spool_threads)
        more_listeners.append(
            start_e2b(config, served.e2b, token, reactor, spool, gate, auth_gate, pace)
        )
    service = SandboxdService(
        served.manager,
        [pools.files, pools.admin, pools.spool],
        reactor,
        _log_observer(config),
        on_stop_signal=on_next_stop_signal,
        listeners=listeners,
        more_listeners=more_listeners,
        listen=config.listen,
        # A stopping daemon's last frames are sent before it exits: each exec stream
        # finishes, then each connection is closed once what was written to it is out.
        streams_written=lambda: served.api.streams_written().addCallback(
            lambda _: site.close_connections(reactor)
        ),
        exit_status=exit_status,
        undo=undo,
    )
    reaper = TimerService(reap_interval(config.idle_ttl), served.manager.reap_idle)
    reaper.clock = reactor
    # Listened on once recovery is done (startService), the E2B front's after the native's.
    for child in (reaper, listeners, *more_listeners):
        child.setServiceParent(service)
    log.info("configuration: {settings}", settings=config.friendly())
    return Daemon(served, site, service)


def _socks5(config: Config) -> SocksUpstream | None:
    """The operator's SOCKS5 proxy for egress, if set, with its password (boot step
    ``egress``)."""
    setting = "SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE"
    try:
        password = read_token(config.egress_socks5_password_file, setting=setting)
        return socks_upstream(config, password)
    except (OSError, ValueError, ConfigError) as e:
        fail("egress", e)


def _token(config: Config) -> bytes | None:
    """The bearer token (boot step ``token``); without one, listening beyond loopback is
    refused (step ``listen``) unless ``--insecure`` says so."""
    try:
        token = read_token(config.token_file)
    except (OSError, ConfigError) as e:
        fail("token", e)
    if token is None:
        log.warn("auth: no SANDBOXD_TOKEN_FILE: any local process can drive every sandbox")
        if reaches_beyond_loopback(config.listen):
            if not config.insecure:
                fail(
                    "listen",
                    f"SANDBOXD_LISTEN={config.listen} reaches beyond loopback and no "
                    "SANDBOXD_TOKEN_FILE is set: anyone who reaches the port would run code "
                    "on this host. Set a token, listen on loopback, or pass --insecure "
                    "(SANDBOXD_INSECURE=yes)",
                )
            log.warn(
                "auth: INSECURE: listening on {listen} beyond loopback with no token "
                "(--insecure): anyone who reaches the port runs code on this host",
                listen=config.listen,
            )
    return token


def _isolation(config: Config, reactor: Any, file_pool: ThreadPool, undo: StartupUndo) -> Isolation:
    """The isolation (boot step ``isolation``), its undo registered, what it enforces logged."""
    try:
        isolation = build_isolation(config, reactor, file_pool)
    except IsolationUnavailable as e:
        fail("isolation", e)
    undo.add("isolation", isolation.cgroups.unprepare)
    if isolation.spawn_server is not None:
        undo.add("spawn server", isolation.spawn_server.close)
    if isolation.name == "none":
        who = "uids of the pool" if isolation.owns_files else "the daemon's own user"
        log.warn("isolation: NONE — sandboxes run as {who} (development only)", who=who)
    else:
        log.info("isolation: {name} driver ready", name=isolation.name)
    log.info("exec: commands start through the {chain}", chain=isolation.exec_chain)
    log.info("isolation: layers in force: {layers}", layers=" ".join(isolation.layers) or "none")
    return isolation


def _namespaces(isolation: Isolation, undo: StartupUndo) -> None:
    """The namespaces' pins directory and one probe (boot step ``namespaces``)."""
    undo.add("namespaces", isolation.namespaces.close)  # a probe that fails may leave the mount
    try:
        isolation.namespaces.prepare()  # namespaces: the pins' directory, and one probe
    except (OSError, IsolationUnavailable) as e:
        fail("namespaces", e)
    # A later step failing (a port already taken) must not leave the pins' directory mounted;
    # after a drain this finds nothing left to do.
    atexit.register(isolation.namespaces.close)
    if isolation.namespaces.kinds:
        log.info(
            "namespaces: {kinds} per sandbox; network modes {modes} (default {default})",
            kinds=", ".join(sorted(isolation.namespaces.kinds)),
            modes=", ".join(isolation.namespaces.network.allowed),
            default=isolation.namespaces.network.default,
        )


def _archive(config: Config, reactor: Any, admin_pool: ThreadPool) -> Archive | None:
    """The archive of ``SANDBOXD_ARCHIVE_ROOT`` (boot step ``archive``), if one is set."""
    if config.archive_root is None:
        return None
    try:
        archive = build_archive(config.archive_root, reactor, admin_pool)
    except ArchiveUnavailable as e:
        fail("archive", e)
    log.info("archive: {root} (rsync {rsync})", root=config.archive_root, rsync=archive.rsync.rsync)
    return archive


def _spool_dir(layout: Layout) -> str | None:
    """Where request bodies are stored: the state root, if it takes unnamed files."""
    if can_spool(layout.root):
        return layout.root
    log.warn(
        "request bodies: {root} takes no unnamed files (O_TMPFILE); large ones are stored "
        "in the system's temporary directory, and uploads copied from there",
        root=layout.root,
    )
    return None


def _log_observer(config: Config) -> Any:
    """JSON lines on stdout with ``SANDBOXD_LOG_FORMAT=json``; else ``None`` (twistd's own)."""
    if config.log_format == "json":
        return jsonFileLogObserver(sys.stdout, recordSeparator="")
    return None


def _log_listen(config: Config, listen_capabilities: list[str]) -> None:
    """How the native API's endpoint is listened on, when not in both address families."""
    if not listen_capabilities and config.dual_stack == "on":
        log.info("listen: {listen} is not tcp:, listened on as given", listen=config.listen)
    elif config.dual_stack == "off":
        log.warn(
            "listen: SANDBOXD_DUAL_STACK=off: {listen} as given; a sandbox in host network mode"
            " can take the port in the other address family",
            listen=config.listen,
        )
