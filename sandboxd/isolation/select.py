"""Choose the isolation bundle from the configuration (placeholder until the drivers land)."""

from twisted.python.threadpool import ThreadPool

from sandboxd.config import Config
from sandboxd.isolation.base import Isolation, IsolationUnavailable
from sandboxd.isolation.none import no_isolation


def build_isolation(config: Config, reactor: object, file_pool: ThreadPool) -> Isolation:
    """The bundle for ``config.isolation``; refuses what cannot be provided."""
    if config.isolation == "none":
        return no_isolation(reactor, file_pool, config.uid_max - config.uid_min + 1)
    raise IsolationUnavailable(f"isolation {config.isolation!r} is not available yet")
