"""The E2B front's routes: the control plane and envd, on one listener with no prefix.

Control plane (REST, ``X-API-Key`` = the daemon's token): create, connect, get, list, kill,
timeout of sandboxes (create and list also on ``/sandboxes``, the routes of older SDKs
such as e2b 2.45). envd (routed by ``E2b-Sandbox-Id``, authorised by that sandbox's own
``X-Access-Token``): ``/health``, ``/files``, and the Connect-RPC services
``process.Process`` (:mod:`sandboxd.e2b.process`) and ``filesystem.Filesystem``
(:mod:`sandboxd.e2b.files`). Each route parses, calls the core, encodes with
:mod:`sandboxd.e2b.wire`; errors are answered in one place (:meth:`E2BFront.error`).
"""

from collections.abc import Awaitable, Callable
from typing import Any

from klein import Klein
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource
from werkzeug.exceptions import HTTPException

from sandboxd.core import SandboxManager, TemplateStore
from sandboxd.e2b import control, files, interpreter, process, signing, templates, upload, wire
from sandboxd.e2b.admit import Authoriser, sandbox_id_of
from sandboxd.e2b.guards import (
    check_rpc_body,
    check_user,
    control_plane,
    envd,
    interpreter_call,
    user_of,
)
from sandboxd.e2b.paths import place_of
from sandboxd.e2b.ports import PortAccess, PortHosts
from sandboxd.e2b.registry import E2BSandbox, Registry
from sandboxd.e2b.template_builds import TemplateBuilds
from sandboxd.e2b.wire import ConnectError, RestError
from sandboxd.errors import SandboxdError
from sandboxd.ports.table import PortTable
from sandboxd.web.answers import answer
from sandboxd.web.download import send_file

log = Logger()

Unary = Callable[[SandboxManager, E2BSandbox, dict[str, Any]], Awaitable[Any]]
Streaming = Callable[[SandboxManager, E2BSandbox, IRequest, dict[str, Any]], Awaitable[None]]


def _sync(call: Callable[[E2BSandbox, dict[str, Any]], Any]) -> Unary:
    async def unary(manager: SandboxManager, entry: E2BSandbox, message: dict[str, Any]) -> Any:
        return call(entry, message)

    return unary


UNARY: dict[str, Unary] = {
    "process.Process/List": _sync(process.listing),
    "process.Process/SendInput": _sync(process.send_input),
    "process.Process/CloseStdin": _sync(process.close_stdin),
    "process.Process/SendSignal": _sync(process.send_signal),
    "process.Process/Update": _sync(process.update),
    "filesystem.Filesystem/Stat": files.stat_,
    "filesystem.Filesystem/ListDir": files.list_dir,
    "filesystem.Filesystem/MakeDir": files.make_dir,
    "filesystem.Filesystem/Move": files.move,
    "filesystem.Filesystem/Remove": files.remove,
    "filesystem.Filesystem/CreateWatcher": files.create_watcher,
    "filesystem.Filesystem/GetWatcherEvents": files.get_watcher_events,
    "filesystem.Filesystem/RemoveWatcher": files.remove_watcher,
}
STREAMING: dict[str, Streaming] = {
    "process.Process/Start": process.start,
    "process.Process/Connect": process.connect,
    "filesystem.Filesystem/WatchDir": files.watch_dir,
}


class E2BFront:
    """The Klein application of the E2B front, on one :class:`SandboxManager`."""

    app = Klein()

    def __init__(
        self,
        manager: SandboxManager,
        token: bytes | None,
        registry: Registry,
        port_access: PortAccess | None = None,
    ) -> None:
        self.manager = manager
        self.token = token
        self.registry = registry
        self.port_access = port_access
        """Ports by host (docs/e2b.rst, "Ports"; ``None``: ``SANDBOXD_E2B_DOMAIN`` unset)."""
        self.templates: TemplateStore | None = None
        """The replica's template store, whose templates a create may name (``None``: only
        ``base``)."""
        self.builds: TemplateBuilds | None = None
        """The template builds of E2B's build API, on :attr:`templates` (``None``: none)."""
        self.authoriser = Authoriser(
            token, registry, port_access, lambda path: templates.upload_admission(self, path)
        )
        """Every key, access-token and signature check, of the routes (:func:`control_plane`,
        :func:`envd`) and of the site's rule at the headers."""

    # Errors, in one place

    @app.handle_errors(Exception)
    def error(self, request: IRequest, failure: Failure) -> bytes:
        error = failure.value
        assert isinstance(error, Exception)
        rpc = (request.path or b"").startswith(wire.RPC_PREFIXES)
        if isinstance(error, HTTPException):
            status = error.code or 500
            return answer(request, status, wire.rest_error_body(status, str(error)))
        if rpc:
            found = self._connect_error(error, request, failure)
            if request.path in wire.STREAM_PATHS:
                # As Connect servers do: HTTP 200 and a stream of one end-of-stream envelope
                # holding the error. The JS SDK reads only the status of a streaming call that
                # fails otherwise (429 would be "not running", 400 a bare "HTTP 400").
                request.setResponseCode(200)
                request.setHeader(b"content-type", wire.CONNECT_JSON)
                return wire.end_of_stream(found)
            status, body = wire.connect_error_body(found)
            return answer(request, status, body)
        status, message = self._rest_error(error, request, failure)
        return answer(request, status, wire.rest_error_body(status, message))

    def _connect_error(self, error: Exception, request: IRequest, failure: Failure) -> ConnectError:
        if isinstance(error, SandboxdError) and wire.answer_of(error).gone:
            return wire.not_running(self._sandbox_id(request))
        if not isinstance(error, SandboxdError | ConnectError):
            log.failure("unexpected error answering {uri}", failure, uri=request.uri)
        return wire.connect_error_of(error)

    def _rest_error(self, error: Exception, request: IRequest, failure: Failure) -> tuple[int, str]:
        if isinstance(error, RestError):
            return error.status, error.message
        if isinstance(error, ConnectError):
            return wire.STATUS_OF_CODE.get(error.code, 500), error.message
        if isinstance(error, SandboxdError):
            answer = wire.answer_of(error)
            if answer.gone and (request.path or b"").startswith((b"/files", b"/health")):
                return 502, wire.not_running(self._sandbox_id(request)).message
            return answer.status, error.detail
        log.failure("unexpected error answering {uri}", failure, uri=request.uri)
        return 500, str(error)

    @staticmethod
    def _sandbox_id(request: IRequest) -> str:
        return sandbox_id_of(request)

    # Control plane

    @app.route("/v2/sandboxes", methods=["POST"])
    @app.route("/sandboxes", methods=["POST"])
    @control_plane
    async def create(self, request: IRequest) -> bytes:
        return await control.create(self, request)

    @app.route("/v2/sandboxes", methods=["GET"])
    @app.route("/sandboxes", methods=["GET"])
    @control_plane
    def listing(self, request: IRequest) -> bytes:
        return control.listing(self, request)

    @app.route("/v2/sandboxes/<sandbox_id>/connect", methods=["POST"])
    @app.route("/sandboxes/<sandbox_id>/connect", methods=["POST"])
    @control_plane
    def connect(self, request: IRequest, sandbox_id: str) -> bytes:
        return control.connect(self, request, sandbox_id)

    @app.route("/sandboxes/<sandbox_id>", methods=["GET"])
    @control_plane
    def get_info(self, request: IRequest, sandbox_id: str) -> bytes:
        return control.get_info(self, request, sandbox_id)

    @app.route("/sandboxes/<sandbox_id>", methods=["DELETE"])
    @control_plane
    async def kill(self, request: IRequest, sandbox_id: str) -> bytes:
        entry = self.registry.get(sandbox_id)
        if self.port_access is not None:
            self.port_access.table.forget(sandbox_id)
        await self.registry.kill(entry)
        request.setResponseCode(204)
        return b""

    @app.route("/sandboxes/<sandbox_id>/network", methods=["PUT"])
    @control_plane
    def set_network(self, request: IRequest, sandbox_id: str) -> bytes:
        return control.set_network(self, request, sandbox_id)

    @app.route("/sandboxes/<sandbox_id>/timeout", methods=["POST"])
    @control_plane
    def set_timeout(self, request: IRequest, sandbox_id: str) -> bytes:
        return control.set_timeout(self, request, sandbox_id)

    # Template builds (sandboxd.e2b.templates)

    @app.route("/v3/templates", methods=["POST"])
    @control_plane
    def request_build(self, request: IRequest) -> bytes:
        return templates.request_build(self, request)

    @app.route("/templates/<template_id>/files/<files_hash>", methods=["GET"])
    @control_plane
    def upload_link(self, request: IRequest, template_id: str, files_hash: str) -> bytes:
        return templates.upload_link(self, request, template_id, files_hash)

    @app.route("/templates/<template_id>/files/<files_hash>/upload", methods=["PUT"])
    def receive_upload(self, request: IRequest, template_id: str, files_hash: str) -> bytes:
        return templates.receive_upload(self, request, template_id, files_hash)

    @app.route("/v2/templates/<template_id>/builds/<build_id>", methods=["POST"])
    @control_plane
    async def trigger_build(self, request: IRequest, template_id: str, build_id: str) -> bytes:
        return await templates.trigger(self, request, template_id, build_id)

    @app.route("/templates/<template_id>/builds/<build_id>/status", methods=["GET"])
    @control_plane
    def build_status(self, request: IRequest, template_id: str, build_id: str) -> bytes:
        return templates.status(self, request, template_id, build_id)

    @app.route("/templates/aliases/<alias>", methods=["GET"])
    @control_plane
    def alias(self, request: IRequest, alias: str) -> bytes:
        return templates.alias(self, request, alias)

    @app.route("/templates/tags", methods=["POST"])
    @control_plane
    async def assign_tags(self, request: IRequest) -> bytes:
        return await templates.assign_tags(self, request)

    @app.route("/templates/tags", methods=["DELETE"])
    @control_plane
    async def remove_tags(self, request: IRequest) -> bytes:
        return await templates.remove_tags(self, request)

    @app.route("/templates/<template_id>/tags", methods=["GET"])
    @control_plane
    def list_tags(self, request: IRequest, template_id: str) -> bytes:
        return templates.list_tags(self, request, template_id)

    @app.route("/sandboxes/<path:rest>", methods=["GET", "POST", "PUT", "DELETE"])
    @app.route("/v2/sandboxes/<path:rest>", methods=["GET", "POST", "PUT", "DELETE"])
    @app.route("/<path:rest>", methods=["GET", "POST", "PUT", "DELETE"])
    @control_plane
    def unsupported(self, request: IRequest, rest: str = "") -> bytes:
        raise RestError(
            501,
            f"{request.method.decode()} {request.path.decode('utf-8', 'replace')} is not "
            "supported by sandboxd (no pause/resume, snapshots, metrics or logs)",
        )

    # The code interpreter (port 49999: sandboxd.e2b.interpreter)

    @app.route("/execute", methods=["POST"])
    @interpreter_call
    async def execute(self, request: IRequest, entry: E2BSandbox) -> bytes:
        await interpreter.execute(self, request, entry)
        return b""

    @app.route("/contexts", methods=["POST"])
    @interpreter_call
    async def create_context(self, request: IRequest, entry: E2BSandbox) -> bytes:
        return await interpreter.create_context(self, request, entry)

    @app.route("/contexts", methods=["GET"])
    @interpreter_call
    def list_contexts(self, request: IRequest, entry: E2BSandbox) -> bytes:
        return interpreter.list_contexts(request, entry)

    @app.route("/contexts/<cid>/restart", methods=["POST"])
    @interpreter_call
    async def restart_context(self, request: IRequest, entry: E2BSandbox, cid: str) -> bytes:
        return await interpreter.restart_context(self, entry, cid)

    @app.route("/contexts/<cid>", methods=["DELETE"])
    @interpreter_call
    async def remove_context(self, request: IRequest, entry: E2BSandbox, cid: str) -> bytes:
        return await interpreter.remove_context(self, entry, cid)

    # envd

    @app.route("/health", methods=["GET"])
    @envd()
    def health(self, request: IRequest, entry: E2BSandbox) -> bytes:
        request.setResponseCode(204)
        return b""

    @app.route("/files", methods=["GET"])
    @envd(signing.READ)
    async def download(self, request: IRequest, entry: E2BSandbox) -> bytes | None:
        check_user(upload.query(request, "username"))
        place = place_of(upload.query(request, "path") or "", "path")
        source, size = await files.read_file(self.manager, entry, place)
        try:
            await send_file(request, source, size)
        finally:
            source.close()
        return None

    @app.route("/files", methods=["POST"])
    @envd(signing.WRITE)
    async def upload(self, request: IRequest, entry: E2BSandbox) -> bytes:
        check_user(upload.query(request, "username"))
        config = self.manager.config
        upload.check_stored(request, config.max_body)
        size_max = min(config.max_body, config.disk_max or config.max_body)
        written = await files.write_upload(self.manager, entry, upload.Upload.of(request, size_max))
        request.setHeader(b"content-type", wire.JSON)
        return wire.body(written)

    @app.route("/process.Process/<method>", methods=["POST"])
    @envd()
    async def process_rpc(self, request: IRequest, entry: E2BSandbox, method: str) -> bytes:
        return await self._rpc(request, entry, f"process.Process/{method}")

    @app.route("/filesystem.Filesystem/<method>", methods=["POST"])
    @envd()
    async def filesystem_rpc(self, request: IRequest, entry: E2BSandbox, method: str) -> bytes:
        return await self._rpc(request, entry, f"filesystem.Filesystem/{method}")

    async def _rpc(self, request: IRequest, entry: E2BSandbox, name: str) -> bytes:
        check_user(user_of(request))
        check_rpc_body(request, self.manager.config.max_body)
        content = request.content
        content.seek(0)
        data = content.read(wire.MESSAGE_MAX + 5)
        if name in STREAMING:
            await STREAMING[name](self.manager, entry, request, wire.first_message(data))
            return b""
        if name == "process.Process/StreamInput":
            answer = process.stream_input(entry, list(wire.read_envelopes(data)))
            request.setHeader(b"content-type", wire.CONNECT_JSON)
            return wire.envelope(answer) + wire.end_of_stream()
        unary = UNARY.get(name)
        if unary is None:
            raise ConnectError("unimplemented", f"{name} is not a method sandboxd serves")
        result = await unary(self.manager, entry, wire.parse_message(data))
        request.setHeader(b"content-type", wire.JSON)
        return wire.body(result)


def make_front(
    manager: SandboxManager,
    token: bytes | None,
    ports: PortTable | None = None,
    templates: TemplateStore | None = None,
) -> E2BFront:
    """The front on ``manager``, its sandboxes' timeouts on the manager's clock; with
    ``ports`` (shared with the native front) and ``SANDBOXD_E2B_DOMAIN``, its sandboxes' ports
    by host; a create may name a template of ``templates``."""
    registry = Registry(manager, manager.clock)
    domain = manager.config.e2b_domain
    access = None if ports is None or domain is None else PortAccess(registry, ports, domain)
    front = E2BFront(manager, token, registry, access)
    front.templates = templates
    if templates is not None:
        front.builds = TemplateBuilds(templates, manager.clock, manager.config.build_network)
    return front


def front_resource(front: E2BFront) -> IResource:
    """What the front's site serves: its routes, behind its port hosts when it has them."""
    routes = front.app.resource()
    if front.port_access is None:
        return routes
    return PortHosts(routes, front.port_access, front.manager.reactor)
