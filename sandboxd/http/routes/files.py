"""The routes of a sandbox's files: upload, download, delete, exists, size, disk usage, walk,
mkdir, rmdir, rename, and the workspace watch (docs/extensions.rst, "Workspace watch")."""

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from twisted.logger import Logger
from twisted.web.iweb import IRequest

from sandboxd.core import Parts, WatchEvent, normalise, walking, workspace
from sandboxd.errors import TooManyEntries
from sandboxd.http import parse, wire
from sandboxd.http.parse import query
from sandboxd.http.routing import app, authorized, capability, json_response, no_content
from sandboxd.web.download import send_file
from sandboxd.web.follow import DropWhilePaused, FollowStream
from sandboxd.web.paced import PacedWriter
from sandboxd.web.site import Spool

if TYPE_CHECKING:
    from sandboxd.http.api import SandboxAPI

T = TypeVar("T")

log = Logger()

WALK_PART = 1 << 20
"""Characters of walk entries written at a time (a walk that fits is answered whole)."""


async def at_path(
    api: "SandboxAPI", request: IRequest, rid: str, operation: Callable[[str, Parts], T]
) -> T:
    """``operation(workspace, parts)`` on the path of the request's ``path`` query, run in a
    file thread as the sandbox (the routes that act on one path and take nothing else)."""
    sandbox = api.manager.get(rid)
    parts = normalise(query(request, "path"))
    return await api.manager.files(sandbox, lambda ws: operation(ws, parts))


@app.route("/sandboxes/<rid:rid>/file", methods=["PUT"])
@authorized
@capability("files.413", "files.507")
async def upload(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    sandbox = api.manager.get(rid)
    parts = normalise(query(request, "path"))
    parse.refuse_too_large(request, api.manager.config.max_body)
    content = request.content
    content.seek(0)
    linkable = isinstance(content, Spool)
    if linkable:
        # The complete body becomes the sandbox's own file, then is linked into place by
        # the sandbox itself (its fs credentials: the link cannot land outside).
        identity = sandbox.identity
        os.fchown(content.fileno(), identity.uid, identity.gid)
    await api.manager.files(sandbox, lambda ws: workspace.write_from(ws, parts, content, linkable))
    return no_content(request)


@app.route("/sandboxes/<rid:rid>/file", methods=["GET"])
@authorized
async def download(api: "SandboxAPI", request: IRequest, rid: str) -> None:
    sandbox = api.manager.get(rid)
    parts = normalise(query(request, "path"))
    source, length = await api.manager.open_for_reading(sandbox, parts)
    try:
        await send_file(request, source, length)
    finally:
        source.close()


@app.route("/sandboxes/<rid:rid>/file", methods=["DELETE"])
@authorized
async def delete(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    await at_path(api, request, rid, workspace.delete)
    return no_content(request)


@app.route("/sandboxes/<rid:rid>/exists", methods=["GET"])
@authorized
async def exists(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    found = await at_path(api, request, rid, workspace.exists)
    return json_response(request, wire.field_body("exists", found))


@app.route("/sandboxes/<rid:rid>/size", methods=["GET"])
@authorized
async def size(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    found = await at_path(api, request, rid, workspace.size)
    return json_response(request, wire.field_body("size", found))


@app.route("/sandboxes/<rid:rid>/disk-usage", methods=["GET"])
@authorized
async def disk_usage(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    sandbox = api.manager.get(rid)
    total = await api.manager.files(sandbox, walking.disk_usage)
    return json_response(request, wire.field_body("bytes", total))


def measure_walk(ws: str, parts: Parts, limit: int, most: int) -> int:
    """The size of the walk body of the path (``TooManyEntries`` past ``limit`` files or
    ``most`` bytes), one batch in memory at a time; 0 on an error, as a walk answers nothing
    then."""
    try:
        return wire.walk_size(walking.walk_batches(ws, parts, wire.walk_entries, limit), most)
    except OSError:
        return 0


@app.route("/sandboxes/<rid:rid>/walk", methods=["GET"])
@authorized
async def walk(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    """A walk that fits :data:`WALK_PART` is answered whole; a larger one is first counted
    (``413`` past ``SANDBOXD_WALK_MAX`` files or ``SANDBOXD_WALK_BYTES_MAX`` bytes, before
    any byte is sent), then written a part at a time as the client takes it, in the same
    bytes: one part in memory at a time (docs/contract.rst, "Limits")."""
    sandbox = api.manager.get(rid)
    parts = normalise(query(request, "root", "/"), "root")
    limit = api.manager.config.walk_max
    most = api.manager.config.walk_bytes_max
    walks: list[Iterator[list[str]]] = []

    def first(ws: str) -> tuple[list[str], bool]:
        walks.append(walking.walk_batches(ws, parts, wire.walk_entries, limit))
        return wire.next_walk_part(walks[0], WALK_PART)

    def more(ws: str) -> tuple[list[str], bool]:
        return wire.next_walk_part(walks[0], WALK_PART)

    try:
        try:
            # Encoded in the file thread: a walk of many files must not hold the reactor.
            entries, done = await api.manager.files(sandbox, first)
        except OSError:
            entries, done = [], True  # as a walk answers an error: nothing
        if done:
            body = wire.walk_body(entries)
            if len(body) > most:
                raise wire.walk_too_large(most)
            request.setHeader(b"content-type", wire.JSON)
            return body
        await api.manager.files(sandbox, lambda ws: measure_walk(ws, parts, limit, most))
        request.setHeader(b"content-type", wire.JSON)
        writer = PacedWriter(request)
        try:
            sent = len(wire.WALK_TAIL)
            part = wire.WALK_HEAD + wire.walk_part(entries, True)
            while True:
                sent += len(part)
                if sent > most:  # the tree grew since it was measured
                    raise wire.walk_too_large(most)
                await writer.write(part)
                if done or writer.stopped:
                    break
                entries, done = await api.manager.files(sandbox, more)
                part = wire.walk_part(entries, False)
            await writer.write(wire.WALK_TAIL)
        except (OSError, TooManyEntries) as e:
            # The status is sent: end the answer unfinished, so no client takes it whole.
            log.warn("walk of {rid} cut short: {error}", rid=rid, error=e)
            request.loseConnection()  # type: ignore[attr-defined]
        finally:
            writer.close()
        return b""
    finally:
        for batches in walks:
            batches.close()  # type: ignore[attr-defined]


@app.route("/sandboxes/<rid:rid>/mkdir", methods=["POST"])
@authorized
async def mkdir(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    sandbox = api.manager.get(rid)
    parts = normalise(parse.json_body(request).get("path"))
    await api.manager.files(sandbox, lambda ws: workspace.mkdir(ws, parts))
    return no_content(request)


@app.route("/sandboxes/<rid:rid>/dir", methods=["DELETE"])
@authorized
async def rmdir(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    await at_path(api, request, rid, workspace.rmdir)
    return no_content(request)


@app.route("/sandboxes/<rid:rid>/rename", methods=["POST"])
@authorized
async def rename(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    sandbox = api.manager.get(rid)
    body = parse.json_body(request)
    source = normalise(body.get("src"), "src")
    target = normalise(body.get("dst"), "dst")
    await api.manager.files(sandbox, lambda ws: workspace.rename(ws, source, target))
    return no_content(request)


# Workspace watch (docs/extensions.rst, "Workspace watch")


@app.route("/sandboxes/<rid:rid>/watch", methods=["GET"])
@authorized
@capability("watch")
async def watch(api: "SandboxAPI", request: IRequest, rid: str) -> None:
    sandbox = api.manager.get(rid)
    root = normalise(query(request, "root", "/"), "root")
    recursive = parse.flag(request, "recursive", True)
    feed = DropWhilePaused(lambda: stream.write(wire.watch_frame("overflow")))
    stream = FollowStream(
        request, api.manager.clock, api.manager.config.keepalive, feed.pause, feed.resume
    )

    def deliver(event: WatchEvent) -> None:
        if event.gone:
            stream.write(wire.error_frame("SandboxNotFound", "the sandbox was killed"))
            stream.end()
        elif feed.admits():
            stream.write(wire.watch_frame(event.kind, event.path, event.is_dir))

    # Set first: what the watch sees while its walk runs is written as it comes (an
    # error answer sets its own type).
    request.setHeader(b"content-type", wire.NDJSON)
    watch = await api.manager.watch(sandbox, root, recursive, deliver)
    try:
        stream.start()
        await stream.wait()
    finally:
        watch.close()
