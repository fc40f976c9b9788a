"""``twistd sandboxd``: the options and the service tree of the daemon.

``makeService`` reads the configuration (options win over ``SANDBOXD_*`` variables) and
returns the service of the daemon the composition root builds from it
(:func:`sandboxd.assemble.assemble`): a ``MultiService`` of the sandbox manager and the HTTP
endpoints (:class:`sandboxd.service.SandboxdService`). Each boot step is logged as it runs
(:mod:`sandboxd.boot`); a step that fails stops start-up with one line naming it.
"""

import atexit
import os
from typing import Any

from twisted.application.service import IService
from twisted.python import usage

from sandboxd._twisted import dispatch_by_round
from sandboxd.assemble import assemble
from sandboxd.boot import fail
from sandboxd.config import Config, ConfigError
from sandboxd.options import flag_table, given_options, option_table
from sandboxd.service import ExitStatus
from sandboxd.undo import StartupUndo


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
    stops; the service does the same when it cannot listen. An epoll or poll reactor hands
    each event only to the selectable it was polled for
    (:func:`sandboxd._twisted.dispatch_by_round`).
    """
    if reactor is None:
        from twisted.internet import reactor
    dispatch_by_round(reactor)
    environ = os.environ if environ is None else environ
    exit_status = ExitStatus()
    atexit.register(exit_status.apply)  # first: runs after every other atexit cleanup
    undo = StartupUndo()
    try:
        try:
            config = Config.load(environ, given_options(options))
        except ConfigError as e:
            fail("configuration", e)
        return assemble(config, reactor, environ, undo, exit_status).service
    except BaseException:
        undo.run()
        raise
