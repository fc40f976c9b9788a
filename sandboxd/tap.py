"""``twistd sandboxd``: the options and the service tree of the daemon.

``makeService`` reads the configuration (options win over ``SANDBOXD_*`` variables), chooses
the isolation, and returns a ``MultiService`` of the sandbox manager and the HTTP endpoint.
Each boot step is logged as it runs; a step that fails stops start-up with one line naming it.
"""

import os
from typing import Any

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import IService, MultiService, Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger
from twisted.python import usage
from twisted.python.threadpool import ThreadPool

import sandboxd
from sandboxd.api import SandboxAPI
from sandboxd.config import Config, ConfigError, option_table
from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.select import build_isolation
from sandboxd.layout import Layout
from sandboxd.manager import SandboxManager
from sandboxd.web import make_site

log = Logger()


class Options(usage.Options):
    """Every setting of SPEC §5 as an option; unset options fall back to the environment."""

    optParameters = option_table()

    def getSynopsis(self) -> str:
        return "Usage: twistd [twistd options] sandboxd [options]"


class ManagerService(Service):
    """Starts the manager (restart recovery) and, on stop, kills every live sandbox."""

    def __init__(self, manager: SandboxManager, pools: list[ThreadPool]) -> None:
        self.manager = manager
        self.pools = pools

    def startService(self) -> None:
        super().startService()
        for pool in self.pools:
            pool.start()
        self.manager.start()

    def stopService(self) -> Deferred[Any]:
        super().stopService()
        self.manager.draining = True
        kills = [
            Deferred.fromCoroutine(self.manager.kill(rid)) for rid in list(self.manager.sandboxes)
        ]
        done: Deferred[Any] = DeferredList(kills, consumeErrors=True)

        def stop_pools(result: object) -> object:
            for pool in self.pools:
                pool.stop()
            return result

        return done.addBoth(stop_pools)


def read_token(path: str | None) -> bytes | None:
    """The bearer token from its file (surrounding whitespace removed)."""
    if path is None:
        return None
    with open(path, "rb") as f:
        token = f.read().strip()
    if not token:
        raise ConfigError(f"SANDBOXD_TOKEN_FILE: {path} is empty")
    return token


def fail(step: str, cause: object) -> None:
    """Log the failed boot step as the last line and stop."""
    message = f"start-up failed at {step}: {cause}"
    log.critical(message)
    raise SystemExit(f"sandboxd: {message}")


def makeService(options: Options, reactor: Any = None, environ: Any = None) -> IService:
    """Build the daemon's service tree from options and the environment."""
    if reactor is None:
        from twisted.internet import reactor
    environ = os.environ if environ is None else environ
    given = {row[0]: options[row[0]] for row in option_table()}
    try:
        config = Config.load(environ, given)
    except ConfigError as e:
        fail("configuration", e)
        raise  # pragma: no cover (fail raised)
    log.info("sandboxd {version} starting", version=sandboxd.__version__)
    file_pool = ThreadPool(minthreads=1, maxthreads=16, name="sandboxd-files")
    admin_pool = ThreadPool(minthreads=0, maxthreads=4, name="sandboxd-admin")
    try:
        isolation = build_isolation(config, reactor, file_pool)
    except IsolationUnavailable as e:
        fail("isolation", e)
        raise  # pragma: no cover
    if isolation.name == "none":
        log.warn("isolation: NONE — sandboxes run as the daemon's own user (development only)")
    else:
        log.info("isolation: {name} driver ready", name=isolation.name)
    try:
        token = read_token(config.token_file)
    except (OSError, ConfigError) as e:
        fail("token", e)
        raise  # pragma: no cover
    if token is None:
        log.warn("auth: no SANDBOXD_TOKEN_FILE: any local process can drive every sandbox")
    layout = Layout(config.root, owns_files=isolation.owns_files)
    manager = SandboxManager(config, reactor, reactor, isolation, admin_pool, layout)
    api = SandboxAPI(manager, token=token, pod_url=config.pod_url, pod_ip=environ.get("POD_IP"))
    top = MultiService()
    ManagerService(manager, [file_pool, admin_pool]).setServiceParent(top)
    site = make_site(api.app.resource(), config.max_body)
    endpoint = serverFromString(reactor, config.listen)
    StreamServerEndpointService(endpoint, site).setServiceParent(top)
    log.info("configuration: {settings}", settings=config.redacted())
    log.info("listening on {listen}", listen=config.listen)
    return top
