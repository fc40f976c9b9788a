"""The HTTP front: wire contract v1 (SPEC §1) and its compatible extensions (SPEC §2).

A Klein app as a class attribute; its dependencies come in through ``__init__``. Errors are
mapped to ``{"error", "detail"}`` bodies in one place (:meth:`SandboxAPI.api_error`), and the
bearer-token check is one decorator (:func:`authorized`).
"""

import errno
import hmac
import json
import os
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from klein import Klein
from prometheus_client import CONTENT_TYPE_LATEST
from twisted.internet.defer import CancelledError
from twisted.logger import Logger
from twisted.protocols.basic import FileSender
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from werkzeug.exceptions import HTTPException

import sandboxd
from sandboxd import archive, exec_request, exec_run, workspace
from sandboxd.errors import APIError, BadRequest, InsufficientStorage, TooLarge, Unauthorized
from sandboxd.exec_request import ExecRequest
from sandboxd.layout import RID_PATTERN
from sandboxd.manager import Sandbox, SandboxManager
from sandboxd.paths import normalise
from sandboxd.tools import ToolResolver
from sandboxd.web import Spool

F = TypeVar("F", bound=Callable[..., Any])

JSON_BODY_LIMIT = 64 << 20
DOWNLOAD_CHUNK = 1 << 18
"""Bytes a download reads and sends at a time (``FileSender`` reads 16 KiB: one reactor turn
and one cooperator tick each)."""
ITEM_ID_MAX = 255
MAX_TOOLS = 64

log = Logger()


def capability(*names: str) -> Callable[[F], F]:
    """Tag a route as implementing the named capabilities (listed by ``/healthz``)."""

    def tag(route: F) -> F:
        route.capabilities = names  # type: ignore[attr-defined]
        return route

    return tag


def authorized(route: F) -> F:
    """Refuse the call with ``401`` unless it carries the configured bearer token."""

    @wraps(route)
    def checked(self: "SandboxAPI", request: IRequest, *args: Any, **kwargs: Any) -> Any:
        if self.token is not None:
            header = request.getHeader(b"authorization") or b""
            expected = b"Bearer " + self.token
            if not hmac.compare_digest(header, expected):
                raise Unauthorized("a valid 'Authorization: Bearer <token>' header is required")
        return route(self, request, *args, **kwargs)

    return cast(F, checked)


def json_response(request: IRequest, body: Any, status: int = 200) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(body).encode()


def no_content(request: IRequest) -> bytes:
    request.setResponseCode(204)
    return b""


def query(request: IRequest, name: str, default: str | None = None) -> str:
    """One query parameter as text, ``400`` when missing or not UTF-8."""
    values = request.args.get(name.encode()) if request.args else None
    if not values:
        if default is not None:
            return default
        raise BadRequest(f"{name}: missing query parameter")
    try:
        return cast(bytes, values[0]).decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"{name}: not UTF-8") from None


def json_body(request: IRequest) -> dict[str, Any]:
    """The request's JSON object, ``400`` when it is not one (an absent body is ``{}``)."""
    refuse_too_large(request, JSON_BODY_LIMIT)
    raw = request.content.read(JSON_BODY_LIMIT + 1)  # a chunked body has no Content-Length
    if len(raw) > JSON_BODY_LIMIT:
        raise TooLarge(f"the request body is over {JSON_BODY_LIMIT} bytes")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("body: not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("body: must be a JSON object")
    refuse_lone_surrogates(body)
    return body


def refuse_lone_surrogates(body: dict[str, Any]) -> None:
    """``400`` naming the field whose text holds a lone surrogate (JSON ``"\\ud800"``).

    Such text has no UTF-8 form: it could be neither a path, nor an argument, nor an
    environment entry, and would fail later, deep inside the call, as a ``500``.
    """
    for key, value in body.items():
        try:
            json.dumps({key: value}, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            name = key.encode("utf-8", "backslashreplace").decode()
            raise BadRequest(f"{name}: not valid Unicode (a lone surrogate)") from None


def refuse_too_large(request: IRequest, limit: int) -> None:
    """``413`` when the body was over the site's limit, or is over ``limit``; ``507`` when it
    could not be stored for want of space (``500`` for any other reason)."""
    if getattr(request, "too_large", False):
        raise TooLarge("the request body is over the configured limit")
    error: OSError | None = getattr(request, "content_error", None)
    if error is not None:
        detail = f"the request body could not be stored: {os.strerror(error.errno or 0)}"
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientStorage(detail)
        raise APIError(detail)
    length = request.getHeader(b"content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise TooLarge(f"the request body is over {limit} bytes")


class SandboxAPI:
    """The Klein application serving one :class:`SandboxManager`."""

    app = Klein()

    def __init__(
        self,
        manager: SandboxManager,
        *,
        token: bytes | None = None,
        pod_url: str | None = None,
        pod_ip: str | None = None,
        tools: ToolResolver | None = None,
    ) -> None:
        self.manager = manager
        self.token = token
        self.tools = tools
        """Resolves ``POST /tools/resolve`` (``None``: every tool is refused)."""
        self.pod_url = pod_url
        self.pod_ip = pod_ip
        self.on_drain: Callable[[], None] = self._refuse_creates
        """What ``POST /drain`` starts; the daemon's service makes it drain and exit."""
        self.capabilities = self._collect_capabilities()

    def _refuse_creates(self) -> None:
        self.manager.draining = True

    def _collect_capabilities(self) -> list[str]:
        names = {*exec_request.CAPABILITIES, *exec_run.CAPABILITIES}
        names.add(f"isolation.{self.manager.isolation.name}")
        names.add("auth.bearer" if self.token is not None else "auth.none")
        if self.manager.archive is not None:
            names.add("archive")
        if self.manager.layout.disk.enforcing:
            names.add("isolation.disk")
        for attribute in vars(type(self)).values():
            names.update(getattr(attribute, "capabilities", ()))
        return sorted(names)

    # Errors, in one place

    @app.handle_errors(APIError)
    def api_error(self, request: IRequest, failure: Failure) -> bytes:
        error = cast(APIError, failure.value)
        if isinstance(error, Unauthorized):
            request.setHeader(b"www-authenticate", b'Bearer realm="sandboxd"')  # RFC 9110
        body = {"error": error.wire_type, "detail": error.detail}
        return json_response(request, body, error.status)

    @app.handle_errors(HTTPException)
    def routing_error(self, request: IRequest, failure: Failure) -> bytes:
        error = cast(HTTPException, failure.value)
        body = {"error": type(error).__name__, "detail": error.description or ""}
        return json_response(request, body, error.code or 500)

    @app.handle_errors(Exception)
    def internal_error(self, request: IRequest, failure: Failure) -> bytes:
        log.failure("unexpected error answering {uri}", failure, uri=request.uri)
        body = {"error": "InternalError", "detail": failure.getErrorMessage()}
        return json_response(request, body, 500)

    def sandbox(self, rid: str) -> Sandbox:
        if not RID_PATTERN.match(rid):
            return self.manager.get("")
        return self.manager.get(rid)

    # Health

    @app.route("/healthz", methods=["GET"])
    def healthz(self, request: IRequest) -> bytes:
        body = {
            "status": "draining" if self.manager.draining else "ok",
            "version": sandboxd.__version__,
            "capabilities": self.capabilities,
        }
        return json_response(request, body)

    @app.route("/readyz", methods=["GET"])
    def readyz(self, request: IRequest) -> bytes:
        reason = None
        if self.manager.draining:
            reason = "draining"
        elif self.manager.recovering:
            reason = "reclaiming a predecessor's sandboxes"
        elif self.manager.isolation.uids.free == 0:
            reason = "no free uid"
        if reason is not None:
            return json_response(request, {"ready": False, "reason": reason}, 503)
        return json_response(request, {"ready": True, "isolation": self.manager.isolation.name})

    @app.route("/drain", methods=["POST"])
    @authorized
    def drain(self, request: IRequest) -> bytes:
        log.info("drain requested over HTTP")
        self.manager.draining = True
        self.on_drain()
        return no_content(request)

    @app.route("/metrics", methods=["GET"])
    @authorized
    @capability("metrics")
    def metrics(self, request: IRequest) -> bytes:
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
        return self.manager.metrics.exposition()

    # Lifecycle

    @app.route("/sandboxes", methods=["POST"])
    @authorized
    async def create(self, request: IRequest) -> bytes:
        body = json_body(request)
        image = body.get("image")
        if image is not None and not isinstance(image, str):
            raise BadRequest("image: must be a string")
        ports = body.get("exposed_ports")
        if ports is not None and not (
            isinstance(ports, list) and all(type(p) is int for p in ports)
        ):
            raise BadRequest("exposed_ports: must be a list of port numbers")
        item_id = check_item_id(body.get("item_id"))
        sandbox = await self.manager.create_restored(env=body.get("env"), item_id=item_id)
        return json_response(request, {"pod_url": self.own_url(request), "remote_id": sandbox.rid})

    def own_url(self, request: IRequest) -> str:
        """This replica's directly addressable URL: configured, else ``POD_IP`` and our port.

        Without either, the address and port the request arrived at (this host as the caller
        reached it).
        """
        if self.pod_url is not None:
            return self.pod_url.rstrip("/")
        local = request.getHost()
        host = str(self.pod_ip or getattr(local, "host", "127.0.0.1"))
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{getattr(local, 'port', 80)}"

    @app.route("/sandboxes", methods=["GET"])
    @authorized
    @capability("sandboxes.list")
    def listing(self, request: IRequest) -> bytes:
        return json_response(request, {"sandboxes": self.manager.listing()})

    @app.route("/sandboxes/<rid>", methods=["DELETE"])
    @authorized
    async def kill(self, request: IRequest, rid: str) -> bytes:
        self.sandbox(rid)
        await self.manager.kill(rid)
        return no_content(request)

    @app.route("/sandboxes/<rid>/stats", methods=["GET"])
    @authorized
    @capability("sandboxes.stats")
    def stats(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.sandbox(rid)
        usage = self.manager.stats(sandbox)
        disk = self.manager.disk_usage(sandbox)
        return json_response(
            request,
            {
                "memory_bytes": usage.memory_bytes,
                "memory_peak_bytes": usage.memory_peak_bytes,
                "cpu_usec": usage.cpu_usec,
                "pids": usage.pids,
                "oom_kills": usage.oom_kills,
                "disk_bytes": disk.bytes,
                "disk_limit_bytes": disk.bytes_limit,
                "files": disk.files,
                "files_limit": disk.files_limit,
            },
        )

    # Commands

    @app.route("/sandboxes/<rid>/exec", methods=["POST"])
    @authorized
    async def exec(self, request: IRequest, rid: str) -> None:
        sandbox = self.sandbox(rid)
        command = ExecRequest.parse(json_body(request))
        request.setHeader(b"content-type", b"application/x-ndjson")
        run = self.manager.start_exec(sandbox, command, request.write)
        request.registerProducer(run, True)  # type: ignore[attr-defined]
        try:
            try:
                frame = await run.when_finished()
            except CancelledError:
                raise  # the client went away: finally kills the command
            except Exception as e:  # in band: the status line is already sent
                log.failure("exec in {rid} failed", Failure(), rid=rid)
                kind = e.wire_type if isinstance(e, APIError) else type(e).__name__
                frame = {"error": kind, "detail": str(e)}
            for part in exec_run.frame_parts(frame):  # a megabyte at most, as it is taken
                request.write(part)
                await run.writable()
        finally:
            # Abort first: after a disconnect the request has no channel any more, and
            # unregisterProducer would raise before the command's process group is killed.
            run.abort()
            if getattr(request, "channel", None) is not None:
                request.unregisterProducer()  # type: ignore[attr-defined]

    # Files

    @app.route("/sandboxes/<rid>/file", methods=["PUT"])
    @authorized
    @capability("files.413", "files.507")
    async def upload(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.sandbox(rid)
        parts = normalise(query(request, "path"))
        refuse_too_large(request, self.manager.config.max_body)
        content = request.content
        content.seek(0)
        linkable = isinstance(content, Spool)
        if linkable:
            # The complete body becomes the sandbox's own file, then is linked into place by
            # the sandbox itself (its fs credentials: the link cannot land outside).
            identity = sandbox.identity
            os.fchown(content.fileno(), identity.uid, identity.gid)
        await self.manager.files(
            sandbox, lambda ws: workspace.write_from(ws, parts, content, linkable)
        )
        return no_content(request)

    @app.route("/sandboxes/<rid>/file", methods=["GET"])
    @authorized
    async def download(self, request: IRequest, rid: str) -> None:
        sandbox = self.sandbox(rid)
        parts = normalise(query(request, "path"))
        source, length = await self.manager.open_for_reading(sandbox, parts)
        try:
            request.setHeader(b"content-type", b"application/octet-stream")
            request.setHeader(b"content-length", str(length).encode())
            bounded = BoundedReader(source, length)
            sender = FileSender()
            sender.CHUNK_SIZE = DOWNLOAD_CHUNK
            await sender.beginFileTransfer(bounded, request)
            if bounded.remaining:
                # The file shrank while it was sent: the promised length cannot be met, so
                # the connection ends (a truncated answer for the client, never a hang).
                request.loseConnection()  # type: ignore[attr-defined]
        finally:
            source.close()

    @app.route("/sandboxes/<rid>/file", methods=["DELETE"])
    @authorized
    async def delete(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.sandbox(rid)
        parts = normalise(query(request, "path"))
        await self.manager.files(sandbox, lambda ws: workspace.delete(ws, parts))
        return no_content(request)

    @app.route("/sandboxes/<rid>/exists", methods=["GET"])
    @authorized
    async def exists(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.sandbox(rid)
        parts = normalise(query(request, "path"))
        found = await self.manager.files(sandbox, lambda ws: workspace.exists(ws, parts))
        return json_response(request, {"exists": found})

    @app.route("/sandboxes/<rid>/size", methods=["GET"])
    @authorized
    async def size(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.sandbox(rid)
        parts = normalise(query(request, "path"))
        found = await self.manager.files(sandbox, lambda ws: workspace.size(ws, parts))
        return json_response(request, {"size": found})

    @app.route("/sandboxes/<rid>/disk-usage", methods=["GET"])
    @authorized
    async def disk_usage(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.sandbox(rid)
        total = await self.manager.files(sandbox, workspace.disk_usage)
        return json_response(request, {"bytes": total})

    @app.route("/sandboxes/<rid>/walk", methods=["GET"])
    @authorized
    async def walk(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.sandbox(rid)
        parts = normalise(query(request, "root", "/"), "root")
        # Encoded in the file thread: a walk of many files must not hold the reactor.
        body = await self.manager.files(sandbox, lambda ws: workspace.walk_body(ws, parts))
        request.setHeader(b"content-type", b"application/json")
        return body

    @app.route("/sandboxes/<rid>/mkdir", methods=["POST"])
    @authorized
    async def mkdir(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.sandbox(rid)
        parts = normalise(json_body(request).get("path"))
        await self.manager.files(sandbox, lambda ws: workspace.mkdir(ws, parts))
        return no_content(request)

    @app.route("/sandboxes/<rid>/dir", methods=["DELETE"])
    @authorized
    async def rmdir(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.sandbox(rid)
        parts = normalise(query(request, "path"))
        await self.manager.files(sandbox, lambda ws: workspace.rmdir(ws, parts))
        return no_content(request)

    @app.route("/sandboxes/<rid>/rename", methods=["POST"])
    @authorized
    async def rename(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.sandbox(rid)
        body = json_body(request)
        source = normalise(body.get("src"), "src")
        target = normalise(body.get("dst"), "dst")
        await self.manager.files(sandbox, lambda ws: workspace.rename(ws, source, target))
        return no_content(request)

    # Ready marker and archive

    @app.route("/sandboxes/<rid>/mark-ready", methods=["POST"])
    @authorized
    def mark_ready(self, request: IRequest, rid: str) -> bytes:
        self.manager.mark_ready(self.sandbox(rid))
        return no_content(request)

    @app.route("/sandboxes/<rid>/ready", methods=["GET"])
    @authorized
    def ready(self, request: IRequest, rid: str) -> bytes:
        return json_response(request, {"ready": self.manager.is_ready(self.sandbox(rid))})

    @app.route("/sandboxes/<rid>/persist", methods=["POST"])
    @authorized
    async def persist(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.sandbox(rid)
        delete = json_body(request).get("delete", False)
        if not isinstance(delete, bool):
            raise BadRequest("delete: must be true or false")
        # No archive, no item_id, or not ready: a no-op, still 204 (SPEC §1 "Archive").
        await self.manager.persist(sandbox, delete)
        return no_content(request)

    # Third-party tools

    @app.route("/tools/resolve", methods=["POST"])
    @authorized
    @capability("tools.resolve")
    async def resolve_tools(self, request: IRequest) -> bytes:
        wanted = json_body(request).get("tools")
        if not isinstance(wanted, dict):
            raise BadRequest("tools: must be an object of name → manifest URL")
        if len(wanted) > MAX_TOOLS:
            raise BadRequest(f"tools: at most {MAX_TOOLS} per request")
        if self.tools is None:
            reason = "tool resolution is not available on this replica"
            return json_response(request, {"tools": {}, "refused": dict.fromkeys(wanted, reason)})
        return json_response(request, await self.tools.resolve(wanted))

    def resource(self) -> Any:
        return self.app.resource()


class BoundedReader:
    """Reads at most ``remaining`` bytes of ``source``: a download sends exactly the
    ``Content-Length`` it announced, even when the sandbox appends to the file meanwhile
    (more bytes would be taken for the next answer on a kept-alive connection)."""

    def __init__(self, source: Any, remaining: int) -> None:
        self.source = source
        self.remaining = remaining

    def read(self, size: int) -> bytes:
        data = self.source.read(min(size, self.remaining)) if self.remaining > 0 else b""
        self.remaining -= len(data)
        return bytes(data)


def check_item_id(item_id: object) -> str | None:
    """``item_id`` names one archive entry: no ``/``, no ``..``, no NUL, bounded length, and not
    the archive's own ``.sandboxd-`` names."""
    if item_id is None:
        return None
    if not isinstance(item_id, str) or not item_id:
        raise BadRequest("item_id: must be a non-empty string")
    try:
        size = len(item_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest("item_id: not valid Unicode text") from None
    if "/" in item_id or "\0" in item_id or item_id in (".", "..") or size > ITEM_ID_MAX:
        raise BadRequest(
            f"item_id: one path component of at most {ITEM_ID_MAX} bytes, no '/' or NUL"
        )
    if item_id.startswith(archive.RESERVED_PREFIX):
        raise BadRequest(f"item_id: names starting with {archive.RESERVED_PREFIX!r} are reserved")
    return item_id
