"""The HTTP front: the routes of wire contract v1 (SPEC §1) and its extensions (SPEC §2).

A Klein app as a class attribute; its dependencies come in through ``__init__``. Each route
parses its request (:mod:`sandboxd.http.parse`), calls the core, and encodes the answer
(:mod:`sandboxd.http.wire`); errors are answered in one place (:meth:`SandboxAPI.api_error`,
from the wire's error-type table), and the bearer-token check is one decorator
(:func:`authorized`).
"""

import hmac
import os
from collections.abc import Callable, Iterable, Iterator
from functools import wraps
from typing import Any, TypeVar, cast

from klein import Klein
from prometheus_client import CONTENT_TYPE_LATEST
from twisted.internet.defer import Deferred, DeferredList
from twisted.logger import Logger
from twisted.protocols.basic import FileSender
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from werkzeug.exceptions import HTTPException

import sandboxd
from sandboxd.core.exec import run as exec_run
from sandboxd.core.exec import spec as exec_spec
from sandboxd.core.files import workspace
from sandboxd.core.files.paths import normalise
from sandboxd.core.manager import SandboxManager
from sandboxd.core.processes.process import SIGNALS, ReaderEvent
from sandboxd.core.tools.resolver import ToolResolver
from sandboxd.core.watch.watch import WatchEvent
from sandboxd.errors import SandboxdError, TooManyEntries
from sandboxd.http import parse, wire
from sandboxd.http.follow import FollowStream
from sandboxd.http.guard import Admission, Admit
from sandboxd.http.paced import PacedWriter
from sandboxd.http.parse import query
from sandboxd.http.site import Spool
from sandboxd.http.stream import ExecStream
from sandboxd.http.wire import Unauthorized

F = TypeVar("F", bound=Callable[..., Any])

DOWNLOAD_CHUNK = 1 << 18
"""Bytes a download reads and sends at a time (``FileSender`` reads 16 KiB)."""

log = Logger()

WALK_PART = 1 << 20
"""Characters of walk entries written at a time (a walk that fits is answered whole)."""


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
                raise Unauthorized(wire.UNAUTHORIZED_DETAIL)
        return route(self, request, *args, **kwargs)

    return cast(F, checked)


OPEN_PATHS = frozenset({b"/healthz", b"/readyz"})
"""The paths served without the token (every other route is :func:`authorized`)."""


def admission(token: bytes | None) -> Admit:
    """How the channel judges a request from its path and ``authorization`` header alone, as
    soon as its headers are in (the same rule as :func:`authorized`, before any body)."""
    expected = None if token is None else b"Bearer " + token

    def admit(path: bytes, authorization: bytes | None, headers: object = None) -> Admission:
        if expected is None:
            return Admission.TRUSTED
        if hmac.compare_digest(authorization or b"", expected):
            return Admission.TRUSTED
        if path.split(b"?", 1)[0] in OPEN_PATHS:
            return Admission.OPEN
        return Admission.REFUSED

    return admit


def answer(request: IRequest, status: int, body: bytes) -> bytes:
    """A JSON answer of ``status`` whose ``body`` the wire module made."""
    request.setResponseCode(status)
    request.setHeader(b"content-type", wire.JSON)
    return body


def json_response(request: IRequest, value: Any, status: int = 200) -> bytes:
    """A JSON answer of ``value``."""
    return answer(request, status, wire.body(value))


def no_content(request: IRequest) -> bytes:
    request.setResponseCode(204)
    return b""


class SandboxAPI:
    """The Klein application serving one :class:`SandboxManager`."""

    app = Klein()
    app.url_map.converters["rid"] = parse.RidConverter

    def __init__(
        self,
        manager: SandboxManager,
        *,
        token: bytes | None = None,
        pod_url: str | None = None,
        pod_ip: str | None = None,
        tools: ToolResolver | None = None,
        extra_capabilities: Iterable[str] = (),
    ) -> None:
        self.manager = manager
        self.token = token
        self.tools = tools
        """Resolves ``POST /tools/resolve`` (``None``: every tool is refused)."""
        self.pod_url = pod_url
        self.pod_ip = pod_ip
        self.on_drain: Callable[[], None] = self._refuse_creates
        """What ``POST /drain`` starts; the daemon's service makes it drain and exit."""
        self.capabilities = sorted({*self._collect_capabilities(), *extra_capabilities})
        """What ``/healthz`` lists: the routes', the isolation's, and the front's
        (``extra_capabilities``: how the daemon listens)."""
        self._streams: set[Deferred[None]] = set()

    def _refuse_creates(self) -> None:
        self.manager.draining = True

    def _collect_capabilities(self) -> list[str]:
        names = {*exec_spec.CAPABILITIES, *exec_run.CAPABILITIES, "exec.split"}
        names.add(f"isolation.{self.manager.isolation.name}")
        names.update(self.manager.isolation.layers)
        names.add("auth.bearer" if self.token is not None else "auth.none")
        names.update(self.manager.isolation.namespaces.capabilities())
        if self.manager.archive is not None:
            names.add("archive")
        if self.manager.layout.disk.enforcing:
            names.add("isolation.disk")
        for attribute in vars(type(self)).values():
            names.update(getattr(attribute, "capabilities", ()))
        return sorted(names)

    # Errors, in one place

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
        body = parse.json_body(request)
        env, item_id = parse.create_body(body)
        # The network mode is the core's to check (which modes this replica offers and allows).
        sandbox = await self.manager.create_restored(
            env=env, item_id=item_id, network=body.get("network")
        )
        return json_response(request, {"pod_url": self.own_url(request), "remote_id": sandbox.rid})

    def own_url(self, request: IRequest) -> str:
        """This replica's directly addressable URL: configured, else ``POD_IP`` and our port.

        Without either, the address and port the request arrived at (this host as the caller
        reached it), ``https`` when it came over TLS.
        """
        if self.pod_url is not None:
            return self.pod_url.rstrip("/")
        local = request.getHost()
        host = str(self.pod_ip or getattr(local, "host", "127.0.0.1"))
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if request.isSecure() else "http"
        return f"{scheme}://{host}:{getattr(local, 'port', 80)}"

    @app.route("/sandboxes", methods=["GET"])
    @authorized
    @capability("sandboxes.list")
    def listing(self, request: IRequest) -> bytes:
        return json_response(request, {"sandboxes": self.manager.listing()})

    @app.route("/sandboxes/<rid:rid>", methods=["DELETE"])
    @authorized
    async def kill(self, request: IRequest, rid: str) -> bytes:
        self.manager.get(rid)
        await self.manager.kill(rid)
        return no_content(request)

    @app.route("/sandboxes/<rid:rid>/stats", methods=["GET"])
    @authorized
    @capability("sandboxes.stats")
    def stats(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.manager.get(rid)
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

    @app.route("/sandboxes/<rid:rid>/exec", methods=["POST"])
    @authorized
    async def exec(self, request: IRequest, rid: str) -> None:
        sandbox = self.manager.get(rid)
        body = parse.json_body(request)
        spec = parse.exec_spec(body)
        split = parse.exec_split(body)
        request.setHeader(b"content-type", wire.NDJSON)
        stream = ExecStream(
            request, self.manager.clock, self.manager.config.keepalive, split_stderr=split
        )
        stream.attach(self.manager.start_exec(sandbox, spec, stream.output))
        written: Deferred[None] = Deferred()
        self._streams.add(written)
        try:
            await stream.finish(rid)
        finally:
            self._streams.discard(written)
            written.callback(None)

    # Background processes (SPEC §2.1)

    @app.route("/sandboxes/<rid:rid>/processes", methods=["POST"])
    @authorized
    @capability("processes")
    def start_process(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.manager.get(rid)
        spec, tag, stdin = parse.process_start_body(parse.json_body(request))
        process = self.manager.start_process(sandbox, spec, tag=tag, stdin=stdin)
        return json_response(request, wire.process_started_body(process))

    @app.route("/sandboxes/<rid:rid>/processes", methods=["GET"])
    @authorized
    def processes(self, request: IRequest, rid: str) -> bytes:
        table = self.manager.get(rid).processes
        return json_response(request, wire.processes_body(table.all()))

    @app.route("/sandboxes/<rid:rid>/processes/<process_id>/output", methods=["GET"])
    @authorized
    async def process_output(self, request: IRequest, rid: str, process_id: str) -> None:
        process = self.manager.get(rid).processes.get(process_id)
        offset = parse.offset_param(request)
        follow = parse.flag(request, "follow", False)
        stream: FollowStream | None = None

        def deliver(event: ReaderEvent) -> None:
            assert stream is not None
            stream.write(wire.reader_frame(event))
            if reader.done:
                stream.end()

        reader = process.reader(offset, follow, deliver)
        request.setHeader(b"content-type", wire.NDJSON)
        stream = FollowStream(
            request, self.manager.clock, self.manager.config.keepalive, reader.pause, reader.resume
        )
        try:
            stream.start()
            await stream.wait()
        finally:
            reader.stop()

    @app.route("/sandboxes/<rid:rid>/processes/<process_id>/stdin", methods=["POST"])
    @authorized
    def process_stdin(self, request: IRequest, rid: str, process_id: str) -> bytes:
        process = self.manager.get(rid).processes.get(process_id)
        parse.refuse_too_large(request, parse.JSON_BODY_LIMIT)
        content = request.content
        content.seek(0)
        process.write_stdin(content.read(parse.JSON_BODY_LIMIT))
        return no_content(request)

    @app.route("/sandboxes/<rid:rid>/processes/<process_id>/stdin", methods=["DELETE"])
    @authorized
    def process_close_stdin(self, request: IRequest, rid: str, process_id: str) -> bytes:
        self.manager.get(rid).processes.get(process_id).close_stdin()
        return no_content(request)

    @app.route("/sandboxes/<rid:rid>/processes/<process_id>/signal", methods=["POST"])
    @authorized
    def process_signal(self, request: IRequest, rid: str, process_id: str) -> bytes:
        process = self.manager.get(rid).processes.get(process_id)
        process.signal(parse.signal_body(parse.json_body(request), SIGNALS))
        return no_content(request)

    # Workspace watch (SPEC §2.2)

    @app.route("/sandboxes/<rid:rid>/watch", methods=["GET"])
    @authorized
    @capability("watch")
    async def watch(self, request: IRequest, rid: str) -> None:
        sandbox = self.manager.get(rid)
        root = normalise(query(request, "root", "/"), "root")
        recursive = parse.flag(request, "recursive", True)
        stream = FollowStream(request, self.manager.clock, self.manager.config.keepalive)

        def deliver(event: WatchEvent) -> None:
            if event.gone:
                stream.write(wire.error_frame("SandboxNotFound", "the sandbox was killed"))
                stream.end()
            else:
                stream.write(wire.watch_frame(event.kind, event.path, event.is_dir))

        # Set first: what the watch sees while its walk runs is written as it comes (an
        # error answer sets its own type).
        request.setHeader(b"content-type", wire.NDJSON)
        watch = await self.manager.watch(sandbox, root, recursive, deliver)
        try:
            stream.start()
            await stream.wait()
        finally:
            watch.close()

    def streams_written(self) -> Deferred[Any]:
        """Fires once every exec stream open now has written its last frame (a drain kills
        the commands; the daemon exits only after their final frames are out)."""
        return DeferredList(list(self._streams))

    # Files

    @app.route("/sandboxes/<rid:rid>/file", methods=["PUT"])
    @authorized
    @capability("files.413", "files.507")
    async def upload(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.manager.get(rid)
        parts = normalise(query(request, "path"))
        parse.refuse_too_large(request, self.manager.config.max_body)
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

    @app.route("/sandboxes/<rid:rid>/file", methods=["GET"])
    @authorized
    async def download(self, request: IRequest, rid: str) -> None:
        sandbox = self.manager.get(rid)
        parts = normalise(query(request, "path"))
        source, length = await self.manager.open_for_reading(sandbox, parts)
        try:
            request.setHeader(b"content-type", wire.OCTETS)
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

    @app.route("/sandboxes/<rid:rid>/file", methods=["DELETE"])
    @authorized
    async def delete(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.manager.get(rid)
        parts = normalise(query(request, "path"))
        await self.manager.files(sandbox, lambda ws: workspace.delete(ws, parts))
        return no_content(request)

    @app.route("/sandboxes/<rid:rid>/exists", methods=["GET"])
    @authorized
    async def exists(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.manager.get(rid)
        parts = normalise(query(request, "path"))
        found = await self.manager.files(sandbox, lambda ws: workspace.exists(ws, parts))
        return json_response(request, {"exists": found})

    @app.route("/sandboxes/<rid:rid>/size", methods=["GET"])
    @authorized
    async def size(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.manager.get(rid)
        parts = normalise(query(request, "path"))
        found = await self.manager.files(sandbox, lambda ws: workspace.size(ws, parts))
        return json_response(request, {"size": found})

    @app.route("/sandboxes/<rid:rid>/disk-usage", methods=["GET"])
    @authorized
    async def disk_usage(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.manager.get(rid)
        total = await self.manager.files(sandbox, workspace.disk_usage)
        return json_response(request, {"bytes": total})

    @app.route("/sandboxes/<rid:rid>/walk", methods=["GET"])
    @authorized
    async def walk(self, request: IRequest, rid: str) -> bytes:
        """A walk that fits :data:`WALK_PART` is answered whole; a larger one is first counted
        (``413`` past ``SANDBOXD_WALK_MAX``, before any byte is sent), then written a part at
        a time as the client takes it, in the same bytes: one part in memory at a time."""
        sandbox = self.manager.get(rid)
        parts = normalise(query(request, "root", "/"), "root")
        limit = self.manager.config.walk_max
        walking: list[Iterator[list[str]]] = []

        def first(ws: str) -> tuple[list[str], bool]:
            walking.append(workspace.walk_batches(ws, parts, wire.walk_entries, limit))
            return wire.next_walk_part(walking[0], WALK_PART)

        def more(ws: str) -> tuple[list[str], bool]:
            return wire.next_walk_part(walking[0], WALK_PART)

        try:
            try:
                # Encoded in the file thread: a walk of many files must not hold the reactor.
                entries, done = await self.manager.files(sandbox, first)
            except OSError:
                entries, done = [], True  # as a walk answers an error: nothing
            request.setHeader(b"content-type", wire.JSON)
            if done:
                return wire.walk_body(entries)
            await self.manager.files(sandbox, lambda ws: workspace.count_files(ws, parts, limit))
            writer = PacedWriter(request)
            try:
                await writer.write(wire.WALK_HEAD + wire.walk_part(entries, True))
                while not done and not writer.stopped:
                    entries, done = await self.manager.files(sandbox, more)
                    await writer.write(wire.walk_part(entries, False))
                await writer.write(wire.WALK_TAIL)
            except (OSError, TooManyEntries) as e:
                # The status is sent: end the answer unfinished, so no client takes it whole.
                log.warn("walk of {rid} cut short: {error}", rid=rid, error=e)
                request.loseConnection()  # type: ignore[attr-defined]
            finally:
                writer.close()
            return b""
        finally:
            for batches in walking:
                batches.close()  # type: ignore[attr-defined]

    @app.route("/sandboxes/<rid:rid>/mkdir", methods=["POST"])
    @authorized
    async def mkdir(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.manager.get(rid)
        parts = normalise(parse.json_body(request).get("path"))
        await self.manager.files(sandbox, lambda ws: workspace.mkdir(ws, parts))
        return no_content(request)

    @app.route("/sandboxes/<rid:rid>/dir", methods=["DELETE"])
    @authorized
    async def rmdir(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.manager.get(rid)
        parts = normalise(query(request, "path"))
        await self.manager.files(sandbox, lambda ws: workspace.rmdir(ws, parts))
        return no_content(request)

    @app.route("/sandboxes/<rid:rid>/rename", methods=["POST"])
    @authorized
    async def rename(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.manager.get(rid)
        body = parse.json_body(request)
        source = normalise(body.get("src"), "src")
        target = normalise(body.get("dst"), "dst")
        await self.manager.files(sandbox, lambda ws: workspace.rename(ws, source, target))
        return no_content(request)

    # Ready marker and archive

    @app.route("/sandboxes/<rid:rid>/mark-ready", methods=["POST"])
    @authorized
    def mark_ready(self, request: IRequest, rid: str) -> bytes:
        self.manager.mark_ready(self.manager.get(rid))
        return no_content(request)

    @app.route("/sandboxes/<rid:rid>/ready", methods=["GET"])
    @authorized
    def ready(self, request: IRequest, rid: str) -> bytes:
        return json_response(request, {"ready": self.manager.is_ready(self.manager.get(rid))})

    @app.route("/sandboxes/<rid:rid>/persist", methods=["POST"])
    @authorized
    async def persist(self, request: IRequest, rid: str) -> bytes:
        sandbox = self.manager.get(rid)
        delete = parse.persist_body(parse.json_body(request))
        # No archive, no item_id, or not ready: a no-op, still 204 (SPEC §1 "Archive").
        await self.manager.persist(sandbox, delete)
        return no_content(request)

    # Third-party tools

    @app.route("/tools/resolve", methods=["POST"])
    @authorized
    @capability("tools.resolve")
    async def resolve_tools(self, request: IRequest) -> bytes:
        wanted = parse.tools_body(parse.json_body(request))
        if self.tools is None:
            reason = "tool resolution is not available on this replica"
            return json_response(request, {"tools": {}, "refused": dict.fromkeys(wanted, reason)})
        return json_response(request, await self.tools.resolve(wanted))


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
