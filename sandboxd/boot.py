"""The boot steps of ``twistd sandboxd`` that stand alone: each builds one part from the
configuration, logs what it set up (and every protection turned off), and stops start-up with
one line naming the step when it cannot (:func:`fail`)."""

import os
import resource
import stat
from typing import Any, NoReturn

from twisted.logger import Logger

from sandboxd.config import Config, ConfigError
from sandboxd.core.layout import Layout, RootInUse
from sandboxd.e2b.admit import spool_places as e2b_spool_places
from sandboxd.e2b.api import E2BFront, front_resource
from sandboxd.isolation.disk.base import DiskDriver, DiskLimits, DiskUnavailable
from sandboxd.isolation.disk.btrfs import FILE_BYTES
from sandboxd.isolation.disk.select import build_disk
from sandboxd.listen import Listeners
from sandboxd.undo import StartupUndo, missing_directories, remove_made
from sandboxd.web import guard
from sandboxd.web.body_pace import BodyPace
from sandboxd.web.guard import ConnectionGate
from sandboxd.web.site import make_site
from sandboxd.web.spool import SpoolThreads

log = Logger()


def reap_interval(idle_ttl: float) -> float:
    """How often the idle reaper looks: a quarter of the TTL, between 1 s and 60 s."""
    return max(1.0, min(idle_ttl / 4, 60.0))


def read_token(
    path: str | None, euid: int | None = None, setting: str = "SANDBOXD_TOKEN_FILE"
) -> bytes | None:
    """The bearer token (or another secret: ``setting`` names its variable) from its file
    (surrounding whitespace removed).

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
        raise ConfigError(f"{setting}: {path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if st.st_uid != euid:
            raise ConfigError(f"{setting}: {path} is owned by uid {st.st_uid}, not by {owner}")
        if st.st_mode & 0o077:
            raise ConfigError(
                f"{setting}: {path} has mode {stat.S_IMODE(st.st_mode):04o}, must "
                "grant group and others no access (chmod 600)"
            )
        token = f.read().strip()
    if not token:
        raise ConfigError(f"{setting}: {path} is empty")
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
    if config.body_pace is None:
        log.warn(
            "connections: SANDBOXD_BODY_PACE=off: one upload may take the CPUs every other "
            "sandbox's requests need"
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


def start_root(config: Config, undo: StartupUndo) -> Layout:
    """The state root, made and locked (boot step ``state root``); ``undo`` then removes the
    lock file and the directories this start made, never another daemon's."""
    root = os.path.realpath(config.root)
    layout = Layout(root, owns_files=config.isolation != "none")
    lock = os.path.join(root, ".lock")
    made = missing_directories(root)
    if made or not os.path.lexists(lock):
        undo.add("state root", lambda: remove_made([lock], made))
    try:
        layout.prepare_root()
        layout.lock()
    except (OSError, RootInUse) as e:
        fail("state root", e)
    log.info("state root {root} ready and locked", root=config.root)
    return layout


def start_disk(config: Config, layout: Layout) -> DiskDriver:
    """The disk driver for the configured limits on the layout's state root (boot step
    ``disk``): the isolation's ``disk``."""
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
    return disk


def start_e2b(
    config: Config,
    front: E2BFront,
    token: bytes | None,
    reactor: Any,
    spool: tuple[str | None, SpoolThreads | None],
    gate: ConnectionGate,
    auth_gate: bool,
    pace: BodyPace | None = None,
) -> Listeners:
    """The E2B-compatible front's listeners (``SANDBOXD_E2B_LISTEN``): ``front`` (on the
    native API's manager) behind a site of its own under the same connection gate (one cap,
    the same timeouts, keys judged at the headers unless ``SANDBOXD_AUTH_GATE=off``, bodies
    under the same ``pace``),
    listened on like the native API's (both address families, after recovery)."""
    assert config.e2b_listen is not None
    site = make_site(
        front_resource(front),
        config.max_body,
        spool_dir=spool[0],
        spool_threads=spool[1],
        gate=gate,
        admit=front.authoriser.admit if auth_gate else None,
        refusal=front.authoriser.refusal,
        spool_place=e2b_spool_places(front.registry),
        pace=pace,
    )
    if token is None:
        log.warn("e2b: no SANDBOXD_TOKEN_FILE: any X-API-Key is accepted on the E2B front")
    log.info("e2b: the E2B-compatible front will listen on {listen}", listen=config.e2b_listen)
    return Listeners(reactor, config.e2b_listen, site, dual_stack=config.dual_stack == "on")
