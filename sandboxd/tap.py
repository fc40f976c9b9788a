"""``twistd sandboxd``: the options and the service tree of the daemon.

``makeService`` reads the configuration (options win over ``SANDBOXD_*`` variables), chooses
the isolation, and returns a ``MultiService`` of the sandbox manager and the HTTP endpoint.
Each boot step is logged as it runs; a step that fails stops start-up with one line naming it.
"""

import atexit
import os
import resource
import stat
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import attrs
from twisted.application.internet import TimerService
from twisted.application.service import IService, MultiService
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.logger import ILogObserver, Logger, jsonFileLogObserver
from twisted.python import usage
from twisted.python.threadpool import ThreadPool

import sandboxd
from sandboxd import notify
from sandboxd.config import Config, ConfigError, flag_table, given_options, option_table
from sandboxd.core.archive.store import Archive, ArchiveUnavailable, build_archive
from sandboxd.core.layout import Layout, RootInUse
from sandboxd.core.manager import SandboxManager
from sandboxd.core.tools.resolver import build_tools
from sandboxd.e2b import wire as e2b_wire
from sandboxd.e2b.admit import admission as e2b_admission
from sandboxd.e2b.api import make_front
from sandboxd.http import guard
from sandboxd.http.api import SandboxAPI, admission
from sandboxd.http.guard import ConnectionGate
from sandboxd.http.site import can_spool, make_site
from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.disk.base import DiskLimits, DiskUnavailable
from sandboxd.isolation.disk.btrfs import FILE_BYTES
from sandboxd.isolation.disk.select import build_disk
from sandboxd.isolation.select import build_isolation
from sandboxd.listen import CannotListen, Listeners, capabilities, reaches_beyond_loopback
from sandboxd.reach import reach_hint
from sandboxd.stop_signals import on_next_stop_signal

log = Logger()


class Options(usage.Options):
    """Every setting of SPEC §5 as an option; unset options fall back to the environment."""

    optParameters = option_table()
    optFlags = flag_table()

    def getSynopsis(self) -> str:
        return "Usage: twistd [twistd options] sandboxd [options]"


class ExitStatus:
    """The status the process exits with once twistd is done (0 unless start-up failed after
    the reactor started: a port taken once the predecessor's sandboxes were reclaimed)."""

    def __init__(self) -> None:
        self.code = 0
        self.message: str | None = None

    def apply(self) -> None:
        """At interpreter exit (registered first, so it runs after every other ``atexit``
        cleanup): exit with the status, if it is not 0."""
        if self.code:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.code)


class SandboxdService(MultiService):
    """The daemon: starting it reclaims the predecessor's sandboxes and only then listens (a
    sandbox left running may hold the port: it is killed first); a port that cannot be had then
    stops the daemon with a non-zero status, naming the address.

    Stopping it drains first (the HTTP endpoint keeps serving existing sandboxes until every
    command ended or the drain deadline passed), then stops the endpoint. ``POST /drain`` runs
    the same drain and then stops the reactor: the daemon exits.
    """

    def __init__(
        self,
        manager: SandboxManager,
        pools: list[ThreadPool],
        reactor: Any,
        log_observer: Any = None,
        on_stop_signal: Callable[[Any, Callable[[str], None]], None] = lambda reactor, act: None,
    ) -> None:
        super().__init__()
        self.on_stop_signal = on_stop_signal
        """Installs what the next SIGINT/SIGTERM does once a drain has begun (``twistd``:
        :func:`sandboxd.stop_signals.on_next_stop_signal`)."""
        self.manager = manager
        self.pools = pools
        self.reactor = reactor
        self.log_observer = log_observer
        self.listen = ""
        """The endpoint string the HTTP service listens on (for the line saying where)."""
        self.streams_written: Callable[[], Deferred[Any]] = lambda: succeed(None)
        """Fires once the open exec streams have written their last frames (the front's)."""
        self.listeners: Listeners | None = None
        self.more_listeners: list[Listeners] = []
        """Other fronts' listeners (the E2B front's): listened on after :attr:`listeners`."""
        self.exit_status = ExitStatus()
        self.started: Deferred[None] = Deferred()
        """Fires once listening (or start-up failed after the reactor started)."""

    def setServiceParent(self, parent: Any) -> None:
        """Under twistd, the parent is the application: give it our log observer, if any."""
        if self.log_observer is not None and hasattr(parent, "setComponent"):
            parent.setComponent(ILogObserver, self.log_observer)
        super().setServiceParent(parent)

    def startService(self) -> None:
        for pool in self.pools:
            pool.start()
        super().startService()
        recovered = self.manager.start()
        recovered.addErrback(lambda f: log.failure("recovery failed", f))
        recovered.addCallback(lambda _: Deferred.fromCoroutine(self._listen()))
        recovered.addBoth(lambda _: self.started.callback(None))
        if self.exit_status.message is not None and not self.reactor.running:
            # No leftovers: all of that ran before the reactor, and twistd exits at once.
            for pool in self.pools:
                pool.stop()
            raise SystemExit(f"sandboxd: {self.exit_status.message}")

    async def _listen(self) -> None:
        if self.listeners is None:
            return
        try:
            addresses = await self.listeners.listen()
            for more in self.more_listeners:
                extra = await more.listen()
                log.info("also listening on {addresses}", addresses=" ".join(extra))
        except CannotListen as e:
            message = f"start-up failed at listen: {e}"
            log.critical(message)
            notify.notify(f"STATUS={message}")
            self.exit_status.code, self.exit_status.message = 1, message
            if self.reactor.running:
                self.reactor.stop()
            return
        log.info("listening on {addresses}", addresses=" ".join(addresses))
        port = getattr(self.listeners.ports[0].getHost(), "port", None)
        log.info("{hint}", hint=reach_hint(self.listen, port))
        log.info("sandboxd ready")
        notify.notify("READY=1\nSTATUS=listening")  # systemd Type=notify

    def drain_and_exit(self) -> None:
        """Drain (``POST /drain``), then stop the reactor."""
        notify.stopping()
        self.on_stop_signal(self.reactor, self.stop_now)
        drained = self.manager.drain().addCallback(lambda _: self.streams_written())
        drained.addCallback(lambda _: self.reactor.stop())

    def stopService(self) -> Deferred[Any]:
        log.info("stopping: draining first (a second SIGINT/SIGTERM stops at once)")
        notify.stopping()
        self.on_stop_signal(self.reactor, self.stop_now)
        drained = self.manager.drain().addCallback(lambda _: self.streams_written())

        def stop_children(_: object) -> Deferred[Any]:
            return maybeDeferred(MultiService.stopService, self)

        def stop_pools(result: object) -> object:
            for pool in self.pools:
                pool.stop()
            return result

        return drained.addCallback(stop_children).addBoth(stop_pools)

    def stop_now(self, signal_name: str) -> None:
        """A second stop signal during a drain: kill every sandbox now, then exit."""
        log.warn(
            "{signal} during the drain: stopping at once ({count} sandboxes killed)",
            signal=signal_name,
            count=len(self.manager.sandboxes),
        )
        self.manager.stop_now()  # the drain ends, and with it the daemon


def reap_interval(idle_ttl: float) -> float:
    """How often the idle reaper looks: a quarter of the TTL, between 1 s and 60 s."""
    return max(1.0, min(idle_ttl / 4, 60.0))


def read_token(path: str | None, euid: int | None = None) -> bytes | None:
    """The bearer token from its file (surrounding whitespace removed).

    The file must be a regular file owned by the daemon's user (root, when it runs as root)
    and grant no access at all to group or others; else start-up stops, naming the problem.
    The checks are made on the opened file, so the file checked is the file read.
    """
    if path is None:
        return None
    euid = os.geteuid() if euid is None else euid
    owner = "root" if euid == 0 else f"the daemon's user (uid {euid})"
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a directory
        os.close(fd)
        raise ConfigError(f"SANDBOXD_TOKEN_FILE: {path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if st.st_uid != euid:
            raise ConfigError(
                f"SANDBOXD_TOKEN_FILE: {path} is owned by uid {st.st_uid}, not by {owner}"
            )
        if st.st_mode & 0o077:
            raise ConfigError(
                f"SANDBOXD_TOKEN_FILE: {path} has mode {stat.S_IMODE(st.st_mode):04o}, must "
                "grant group and others no access (chmod 600)"
            )
        token = f.read().strip()
    if not token:
        raise ConfigError(f"SANDBOXD_TOKEN_FILE: {path} is empty")
    return token


def raise_descriptor_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def start_guard(config: Config, reactor: Any) -> tuple[ConnectionGate, bool]:
    """The connection gate and whether requests are judged at their headers (boot step
    ``connections``), each protection turned off logged as such."""
    descriptors = raise_descriptor_limit()
    try:
        limits = guard.limits_for(
            config.max_connections, config.header_timeout, config.connection_idle, descriptors
        )
    except ValueError as e:
        fail("connections", f"SANDBOXD_MAX_CONNECTIONS: {e}")
    if limits.max_connections is None:
        log.warn(
            "connections: SANDBOXD_MAX_CONNECTIONS=off: no cap ({n} descriptors)", n=descriptors
        )
    else:
        log.info(
            "connections: at most {cap} open ({reserve} kept for authenticated callers), "
            "{n} descriptors",
            cap=limits.max_connections,
            reserve=limits.reserve,
            n=descriptors,
        )
    for name, value in (
        ("HEADER_TIMEOUT", limits.header_timeout),
        ("CONNECTION_IDLE", limits.idle_timeout),
    ):
        if value is None:
            log.warn(
                "connections: SANDBOXD_{name}=off: a slow peer may hold a connection", name=name
            )
    auth_gate = config.auth_gate == "headers"
    if not auth_gate:
        log.warn(
            "auth: SANDBOXD_AUTH_GATE=off: a request without the token is refused only once "
            "its body is stored"
        )
    return ConnectionGate(reactor, limits), auth_gate


def fail(step: str, cause: object) -> NoReturn:
    """Log the failed boot step as the last line and stop."""
    message = f"start-up failed at {step}: {cause}"
    log.critical(message)
    raise SystemExit(f"sandboxd: {message}")


def start_disk(config: Config, layout: Layout) -> Layout:
    """The layout with the disk driver for the configured limits (boot step ``disk``)."""
    limits = DiskLimits(bytes=config.disk_max, files=config.files_max)
    try:
        disk = build_disk(layout.root, limits)
    except (OSError, DiskUnavailable) as e:
        fail("disk", e)
    if disk.enforcing:
        log.info(
            "disk: {name} limits on {root}: {bytes} bytes, {files} files per sandbox",
            name=disk.name,
            root=layout.root,
            bytes=limits.bytes if limits.bytes is not None else "no limit of",
            files=limits.files if limits.files is not None else "no limit of",
        )
        if disk.name == "btrfs" and limits.files is not None:
            log.info(
                "disk: btrfs has no inode limit: files are bounded by the bytes their metadata"
                " takes (the byte limit; {per} bytes per file of SANDBOXD_FILES_MAX without one)",
                per=FILE_BYTES,
            )
    else:
        log.info("disk: no limits (SANDBOXD_DISK_MAX and SANDBOXD_FILES_MAX unset)")
    return attrs.evolve(layout, disk=disk)


def start_e2b(
    config: Config,
    manager: SandboxManager,
    token: bytes | None,
    reactor: Any,
    spool: str | None,
    gate: ConnectionGate,
    auth_gate: bool,
) -> Listeners:
    """The E2B-compatible front's listeners (``SANDBOXD_E2B_LISTEN``): the same manager, a
    site of its own under the same connection gate (one cap, the same timeouts, keys judged
    at the headers unless ``SANDBOXD_AUTH_GATE=off``), listened on like the native API's
    (both address families, after recovery)."""
    assert config.e2b_listen is not None
    front = make_front(manager, token)
    site = make_site(
        front.app.resource(),
        config.max_body,
        spool_dir=spool,
        gate=gate,
        admit=e2b_admission(token, front.registry) if auth_gate else None,
        refusal=e2b_wire.refused_answer,
    )
    if token is None:
        log.warn("e2b: no SANDBOXD_TOKEN_FILE: any X-API-Key is accepted on the E2B front")
    log.info("e2b: the E2B-compatible front will listen on {listen}", listen=config.e2b_listen)
    return Listeners(reactor, config.e2b_listen, site, dual_stack=config.dual_stack == "on")


def makeService(options: Options, reactor: Any = None, environ: Any = None) -> IService:
    """Build the daemon's service tree from options and the environment."""
    if reactor is None:
        from twisted.internet import reactor
    environ = os.environ if environ is None else environ
    exit_status = ExitStatus()
    atexit.register(exit_status.apply)  # first: runs after every other atexit cleanup
    try:
        config = Config.load(environ, given_options(options))
    except ConfigError as e:
        fail("configuration", e)
    log.info("sandboxd {version} starting", version=sandboxd.__version__)
    file_pool = ThreadPool(minthreads=1, maxthreads=16, name="sandboxd-files")
    admin_pool = ThreadPool(minthreads=0, maxthreads=4, name="sandboxd-admin")
    try:
        isolation = build_isolation(config, reactor, file_pool)
    except IsolationUnavailable as e:
        fail("isolation", e)
    if isolation.name == "none":
        log.warn("isolation: NONE — sandboxes run as the daemon's own user (development only)")
    else:
        log.info("isolation: {name} driver ready", name=isolation.name)
    log.info("exec: commands start through the {chain}", chain=isolation.exec_chain)
    log.info("isolation: layers in force: {layers}", layers=" ".join(isolation.layers) or "none")
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
    layout = Layout(os.path.realpath(config.root), owns_files=isolation.owns_files)
    try:
        layout.prepare_root()
        layout.lock()
    except (OSError, RootInUse) as e:
        fail("state root", e)
    log.info("state root {root} ready and locked", root=config.root)
    layout = start_disk(config, layout)
    try:
        isolation.namespaces.prepare()  # namespaces: the pins' directory, and one probe
    except (OSError, IsolationUnavailable) as e:
        fail("namespaces", e)
        raise  # pragma: no cover
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
        manager, [file_pool, admin_pool], reactor, observer, on_stop_signal=on_next_stop_signal
    )
    top.exit_status = exit_status
    api.on_drain = top.drain_and_exit
    top.streams_written = api.streams_written
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
    gate, auth_gate = start_guard(config, reactor)
    api.capabilities = sorted({*api.capabilities, *guard.capabilities(gate.limits, auth_gate)})
    site = make_site(
        api.app.resource(),
        config.max_body,
        spool_dir=spool_dir,
        gate=gate,
        admit=admission(token) if auth_gate else None,
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
        e2b_listeners = start_e2b(config, manager, token, reactor, spool_dir, gate, auth_gate)
        e2b_listeners.setServiceParent(top)  # listens after the native API's (startService)
        top.more_listeners.append(e2b_listeners)
        api.capabilities = sorted({*api.capabilities, "e2b"})
    log.info("configuration: {settings}", settings=config.friendly())
    top.listen = config.listen
    return top
