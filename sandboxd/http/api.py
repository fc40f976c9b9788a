"""The HTTP front: the routes of wire contract v1 (docs/contract.rst) and its extensions.

:class:`SandboxAPI` holds the one Klein app (:mod:`sandboxd.http.routing`) as a class
attribute, and its dependencies come in through ``__init__``. The routes live one module per
concern in :mod:`sandboxd.http.routes`; each parses its request (:mod:`sandboxd.http.parse`),
calls the core, and encodes the answer (:mod:`sandboxd.http.wire`). Errors are answered in one
place (:meth:`SandboxAPI.api_error`, from the wire's error-type table), and the bearer-token
check is one object (:class:`sandboxd.http.auth.BearerAuthoriser`), asked by the channel at
the headers and by one route decorator (:func:`sandboxd.http.routing.authorized`).
"""

from collections.abc import Callable, Iterable
from typing import Any, cast

from twisted.internet.defer import Deferred, DeferredList
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.iweb import IRequest
from werkzeug.exceptions import HTTPException

from sandboxd.core import EXEC_CAPABILITIES, SandboxManager, TemplateStore, ToolResolver
from sandboxd.errors import SandboxdError
from sandboxd.http import routing, wire
from sandboxd.http.auth import BearerAuthoriser
from sandboxd.http.routes import (
    commands,
    contexts,
    daemon,
    files,
    ports,
    sandboxes,
    templates,
    terminals,
    trees,
)
from sandboxd.http.wire import Unauthorized
from sandboxd.ports.table import PortTable, table_for
from sandboxd.web.answers import answer
from sandboxd.web.guard import Admit
from sandboxd.web.spool import SpoolPlace, SpoolPlaces

ROUTES = (daemon, sandboxes, commands, files, trees, templates, ports, contexts, terminals)
"""The route modules: importing them registers their routes on the app."""

log = Logger()


def admission(token: bytes | None) -> Admit:
    """How the channel judges a request from its path and ``authorization`` header alone, as
    soon as its headers are in: the rule of :class:`~sandboxd.http.auth.BearerAuthoriser`,
    the same that :func:`sandboxd.http.routing.authorized` applies."""
    return BearerAuthoriser(token).admit


def spool_places(manager: SandboxManager) -> SpoolPlaces:
    """Where a request body naming a sandbox in its path (``/sandboxes/{rid}/...``) is spooled:
    that sandbox's place, if the manager holds it (docs/operating.rst, "Disk limits")."""

    def place(path: bytes, headers: Headers) -> SpoolPlace | None:
        parts = path.split(b"?", 1)[0].split(b"/", 3)
        if len(parts) < 3 or parts[0] or parts[1] != b"sandboxes":
            return None
        return manager.body_place(parts[2].decode("latin-1"))

    return place


def finished(request: IRequest) -> Deferred[None]:
    """Fires once ``request``'s response is finished (errs if its client went first)."""
    notify: Deferred[None] = cast(Any, request).notifyFinish()
    return notify


class SandboxAPI:
    """The Klein application serving one :class:`SandboxManager`."""

    app = routing.app

    def __init__(
        self,
        manager: SandboxManager,
        *,
        templates: TemplateStore | None = None,
        token: bytes | None = None,
        pod_url: str | None = None,
        pod_ip: str | None = None,
        tools: ToolResolver | None = None,
        extra_capabilities: Iterable[str] = (),
        on_drain: Callable[[], None] | None = None,
        port_table: PortTable | None = None,
    ) -> None:
        self.manager = manager
        self.token = token
        self.reactor: Any = manager.reactor
        self.ports = port_table or table_for(manager)
        """The sandboxes' proxied connections and public ports (shared with the E2B front)."""
        self.authoriser = BearerAuthoriser(token, ports.public_call(self.ports))
        """The one bearer-token check, of the routes and of the channel at the headers."""
        self.tools = tools
        """Resolves ``POST /tools/resolve`` (``None``: every tool is refused)."""
        self.templates = templates
        """The template store (``None``: the template routes answer ``503``)."""
        self.pod_url = pod_url
        self.pod_ip = pod_ip
        self.on_drain: Callable[[], None] = on_drain or self._refuse_creates
        """What ``POST /drain`` starts: the daemon's service drains and exits (without one,
        creates are refused from then on)."""
        self.capabilities = sorted({*self._collect_capabilities(), *extra_capabilities})
        """What ``/healthz`` lists but ``contexts`` (:meth:`capabilities_now`): the routes',
        the isolation's, and the front's (``extra_capabilities``: how the daemon listens, its
        protections, its other fronts)."""
        self.streams: set[IRequest] = set()
        """The requests of the exec streams open now."""

    def _refuse_creates(self) -> None:
        self.manager.draining = True

    def _collect_capabilities(self) -> list[str]:
        names = {*EXEC_CAPABILITIES, "exec.split"}
        names.add(f"isolation.{self.manager.isolation.name}")
        names.update(self.manager.isolation.layers)
        names.add("auth.bearer" if self.token is not None else "auth.none")
        names.update(self.manager.isolation.namespaces.capabilities())
        if self.manager.archive is not None:
            names.add("archive")
        if self.templates is not None:
            names.add("templates")
            if self.manager.isolation.namespaces.switches_root:
                names.add("templates.run")
            if self.templates.keep_owners:  # the daemon runs as root: builds map its ids
                names.add("templates.build")
        if self.manager.isolation.disk.enforcing:
            names.add("isolation.disk")
        names.update(routing.ROUTE_CAPABILITIES)
        return sorted(names)

    async def capabilities_now(self) -> list[str]:
        """What ``/healthz`` lists: :attr:`capabilities`, and ``contexts`` where the kernels'
        probe (which this waits for) found Python's."""
        if await self.manager.contexts_missing() is not None:
            return self.capabilities
        return sorted([*self.capabilities, "contexts"])

    def stream_open(self, request: IRequest) -> None:
        """Count ``request``'s exec stream open until its response is finished."""
        self.streams.add(request)
        finished(request).addBoth(lambda _: self.streams.discard(request))

    def streams_written(self) -> Deferred[Any]:
        """Fires once every exec stream open now has finished its response (a drain kills
        the commands; the daemon exits only after their final frames are written)."""
        return DeferredList(
            [finished(request) for request in list(self.streams)], consumeErrors=True
        )

    # Errors, in one place: the wire's error-type table

    @app.handle_errors(SandboxdError)
    def api_error(self, request: IRequest, failure: Failure) -> bytes:
        error = cast(SandboxdError, failure.value)
        if isinstance(error, Unauthorized):
            request.setHeader(b"www-authenticate", wire.BEARER_CHALLENGE)
        status, body = wire.core_error_body(error)
        return answer(request, status, body)

    @app.handle_errors(HTTPException)
    def routing_error(self, request: IRequest, failure: Failure) -> bytes:
        error = cast(HTTPException, failure.value)
        body = wire.error_body(type(error).__name__, error.description or "")
        return answer(request, error.code or 500, body)

    @app.handle_errors(Exception)
    def internal_error(self, request: IRequest, failure: Failure) -> bytes:
        log.failure("unexpected error answering {uri}", failure, uri=request.uri)
        return answer(request, 500, wire.error_body(wire.INTERNAL[1], failure.getErrorMessage()))
