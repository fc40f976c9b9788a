"""``twistd sandboxd``: the options and the service tree of the daemon.

``makeService`` reads the configuration (options win over ``SANDBOXD_*`` variables), chooses
the isolation, and returns a ``MultiService`` of the sandbox manager and the HTTP endpoint
(:class:`sandboxd.service.SandboxdService`). Each boot step is logged as it runs
(:mod:`sandboxd.boot`); a step that fails stops start-up with one line naming it.
"""

import atexit
import os
import sys
from typing import Any

import attrs
from twisted.application.internet import TimerService
from twisted.application.service import IService
from twisted.logger import Logger, jsonFileLogObserver
from twisted.python import usage
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
from sandboxd.core.manager import SandboxManager
from sandboxd.core.tools.resolver import build_tools
from sandboxd.http import guard
from sandboxd.http.api import SandboxAPI, admission
from sandboxd.http.site import can_spool, make_site
from sandboxd.http.spool import SpoolThreads
from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.select import build_isolation
from sandboxd.listen import Listeners, capabilities, reaches_beyond_loopback
from sandboxd.options import flag_table, given_options, option_table
from sandboxd.service import ExitStatus, SandboxdService
from sandboxd.stop_signals import on_next_stop_signal
from sandboxd.undo import StartupUndo

log = Logger()


class Options(usage.Options):
    """Every setting as an option (docs/operating.rst, "Configuration"); unset options fall
    back to the environment."""

    optParameters = option_table()
    optFlags = flag_table()

    def getSynopsis(self) -> str:
        return "Usage: twistd [twistd options] sandboxd [options]"


def makeService(options: Options, reactor: Any = None, environ: Any = None) -> IService:
    """Build the daemon's service tree from options and the environment.

    A step that fails removes what the steps before it made on the host (cgroup directories,
    the state root, the namespaces' mount: :class:`sandboxd.undo.StartupUndo`) before start-up
    stops; the service does the same when it cannot listen.
    """
    if reactor is None:
        from twisted.internet import reactor
    environ = os.environ if environ is None else environ
    exit_status = ExitStatus()
    atexit.register(exit_status.apply)  # first: runs after every other atexit cleanup
    undo = StartupUndo()
    try:
        top = _build(options, reactor, environ, undo)
    except BaseException:
        undo.run()
        raise
    top.exit_status = exit_status
    top.undo = undo
    return top


def _build(options: Options, reactor: Any, environ: Any, undo: StartupUndo) -> SandboxdService:
    """The boot steps in order: those that only check come first, then each that makes
    something on the host, its undo registered with ``undo`` before it can fail."""
    try:
        config = Config.load(environ, given_options(options))
    except ConfigError as e:
        fail("configuration", e)
    log.info("sandboxd {version} starting", version=sandboxd.__version__)
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
    # The root is locked before anything else is made: a second daemon on it stops here,
    # before it touches the cgroups of the first (their names come from the root).
    layout = start_root(config, undo)
    file_pool = ThreadPool(minthreads=1, maxthreads=16, name="sandboxd-files")
    admin_pool = ThreadPool(minthreads=0, maxthreads=4, name="sandboxd-admin")
    spool_pool = ThreadPool(minthreads=0, maxthreads=4, name="sandboxd-spool")
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
    layout = start_disk(config, attrs.evolve(layout, owns_files=isolation.owns_files))
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
    archive: Archive | None = None
    if config.archive_root is not None:
        try:
            archive = build_archive(config.archive_root, reactor, admin_pool)
        except ArchiveUnavailable as e:
            fail("archive", e)
        log.info(
            "archive: {root} (rsync {rsync})", root=config.archive_root, rsync=archive.rsync.rsync
        )
    manager = SandboxManager(
        config, reactor, reactor, isolation, admin_pool, layout, archive=archive
    )
    tools = build_tools(config.tools_dir, reactor, admin_pool)
    listen_capabilities = capabilities(config.listen, config.dual_stack == "on")
    api = SandboxAPI(
        manager,
        token=token,
        pod_url=config.pod_url,
        pod_ip=environ.get("POD_IP"),
        tools=tools,
        extra_capabilities=listen_capabilities,
    )
    observer = None
    if config.log_format == "json":
        observer = jsonFileLogObserver(sys.stdout, recordSeparator="")
    top = SandboxdService(
        manager,
        [file_pool, admin_pool, spool_pool],
        reactor,
        observer,
        on_stop_signal=on_next_stop_signal,
    )
    api.on_drain = top.drain_and_exit
    reaper = TimerService(reap_interval(config.idle_ttl), manager.reap_idle)
    reaper.clock = reactor
    reaper.setServiceParent(top)
    spool_dir: str | None = layout.root
    if not can_spool(layout.root):
        spool_dir = None
        log.warn(
            "request bodies: {root} takes no unnamed files (O_TMPFILE); large ones are stored "
            "in the system's temporary directory, and uploads copied from there",
            root=layout.root,
        )
    spool_threads = SpoolThreads(reactor, spool_pool)  # request bodies' writes
    gate, auth_gate = start_guard(config, reactor)
    api.capabilities = sorted({*api.capabilities, *guard.capabilities(gate.limits, auth_gate)})
    site = make_site(
        api.app.resource(),
        config.max_body,
        spool_dir=spool_dir,
        gate=gate,
        admit=admission(token) if auth_gate else None,
        spool_threads=spool_threads,
    )
    # A stopping daemon's last frames are sent before it exits: each exec stream finishes,
    # then each connection is closed once what was written to it is out.
    top.streams_written = lambda: api.streams_written().addCallback(
        lambda _: site.close_connections(reactor)
    )
    top.listeners = Listeners(reactor, config.listen, site, dual_stack=config.dual_stack == "on")
    top.listeners.setServiceParent(top)  # listens once recovery is done (startService)
    if not listen_capabilities and config.dual_stack == "on":
        log.info("listen: {listen} is not tcp:, listened on as given", listen=config.listen)
    elif config.dual_stack == "off":
        log.warn(
            "listen: SANDBOXD_DUAL_STACK=off: {listen} as given; a sandbox in host network mode"
            " can take the port in the other address family",
            listen=config.listen,
        )
    if config.e2b_listen is not None:
        e2b_listeners = start_e2b(
            config, manager, token, reactor, (spool_dir, spool_threads), gate, auth_gate
        )
        e2b_listeners.setServiceParent(top)  # listens after the native API's (startService)
        top.more_listeners.append(e2b_listeners)
        api.capabilities = sorted({*api.capabilities, "e2b"})
    log.info("configuration: {settings}", settings=config.friendly())
    top.listen = config.listen
    return top
