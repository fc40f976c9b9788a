"""E2B's template build API on the front (docs/e2b.rst, "Building templates"): the calls of
the SDK's ``Template.build``, ``build_in_background``, ``get_build_status``, ``exists`` /
``alias_exists`` and its tags, parsed here and answered from the builds the front keeps
(:mod:`sandboxd.e2b.template_builds`) on the replica's template store.

Every call but the upload needs the API key (the routes'
:func:`~sandboxd.e2b.guards.control_plane`); the upload's link carries its build's own token
instead, judged at the headers
(:func:`upload_admission`) before a byte of its body is stored.
"""

import io
import os
import re
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from twisted.web.iweb import IRequest

from sandboxd.core import Template, TemplateStore, check_name
from sandboxd.e2b import upload, wire
from sandboxd.e2b.template_builds import TemplateBuilds, template_id_of
from sandboxd.e2b.wire import RestError
from sandboxd.e2b.wire import templates as bodies
from sandboxd.errors import BadRequest
from sandboxd.web.answers import answer
from sandboxd.web.guard import Admission
from sandboxd.web.spool import Spool

if TYPE_CHECKING:
    from sandboxd.e2b.api import E2BFront

UPLOAD_PATH = re.compile(rb"/templates/[^/?]+/files/([0-9a-f]{64})/upload\Z")
BODY_MAX = 1 << 20
"""Bytes of a JSON body read at most (a template of many steps is far below)."""


def builds_of(front: "E2BFront") -> TemplateBuilds:
    """The front's builds (``400`` on a replica without templates, as a create names one)."""
    if front.builds is None:
        raise RestError(400, "this sandboxd builds no templates (it has no template store)")
    return front.builds


def store_of(front: "E2BFront") -> TemplateStore:
    return builds_of(front).store


def _json(request: IRequest) -> dict[str, Any]:
    content = request.content
    content.seek(0)
    try:
        return wire.parse_message(content.read(BODY_MAX))
    except wire.ConnectError as e:
        raise RestError(400, e.message) from None


def _strings(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RestError(400, f"{key}: must be a list of strings")
    return value


def _name(name: object, what: str = "name") -> str:
    if not isinstance(name, str):
        raise RestError(400, f"{what}: must be a template's name")
    try:
        return check_name(name)
    except BadRequest as e:
        raise RestError(400, f"{what}: {e.detail}") from None


def _empty(request: IRequest, status: int) -> bytes:
    """An answer of ``status`` without a body, saying so (``Content-Length: 0``): the JS SDK
    parses any other answer's body as JSON (openapi-fetch), and an async route's answer
    is otherwise chunked."""
    request.setResponseCode(status)
    request.setHeader(b"content-length", b"0")
    return b""


def _answer(request: IRequest, status: int, value: Any) -> bytes:
    return answer(request, status, wire.body(value))


# The build


def request_build(front: "E2BFront", request: IRequest) -> bytes:
    """``POST /v3/templates``: a build of ``name`` (``name:tag``; with ``tags``, one
    ``name:tag`` for each); its resources (``cpuCount``, ``memoryMB``) are the replica's."""
    body = _json(request)
    name = _name(body.get("name"))
    tags = _strings(body, "tags")
    for tag in tags:
        _name(f"{template_id_of(name)}:{tag}", "tags")
    build = builds_of(front).request(name, tags)
    return _answer(request, 202, bodies.requested_json(build))


def upload_link(front: "E2BFront", request: IRequest, template_id: str, files_hash: str) -> bytes:
    """``GET /templates/{id}/files/{hash}``: where to upload a ``COPY``'s files (on this
    front, the link carrying the build's upload token)."""
    build, path = builds_of(front).upload_link(template_id, files_hash)
    scheme = "https" if request.isSecure() else "http"
    host = (request.getHeader(b"host") or b"127.0.0.1").decode("latin-1")
    url = f"{scheme}://{host}{path}&token={build.token}"
    return _answer(request, 201, bodies.upload_json(url))


def receive_upload(
    front: "E2BFront", request: IRequest, template_id: str, files_hash: str
) -> bytes:
    """``PUT`` of an upload link: the files kept (the body the site stored, at most
    ``SANDBOXD_MAX_BODY`` and ``SANDBOXD_TEMPLATE_MAX``) until the build has used them."""
    builds = builds_of(front)
    build = builds.uploading(
        upload.query(request, "build"), upload.query(request, "token"), files_hash
    )
    if build.template_id != template_id:
        raise RestError(404, "this build does not wait for these files")
    upload.check_stored(request, min(front.manager.config.max_body, builds.store.limit))
    builds.keep_upload(build, files_hash, own_copy(request.content))
    return _empty(request, 200)


def own_copy(content: IO[bytes]) -> IO[bytes]:
    """The stored body as a file of the build's own (a spooled body through a descriptor of
    its own; a small one, held in memory by the site, copied)."""
    if isinstance(content, Spool):
        return os.fdopen(os.dup(content.fileno()), "rb")
    content.seek(0)
    return io.BytesIO(content.read())


async def trigger(front: "E2BFront", request: IRequest, template_id: str, build_id: str) -> bytes:
    """``POST /v2/templates/{id}/builds/{build}``: the build started with the template the
    SDK sent (``400`` naming a step that does not map); it runs on after the ``202``."""
    builds = builds_of(front)
    build = builds.get(template_id, build_id)
    await builds.trigger(build, _json(request))
    return _empty(request, 202)


def status(front: "E2BFront", request: IRequest, template_id: str, build_id: str) -> bytes:
    """``GET /templates/{id}/builds/{build}/status``: its status and log from ``logsOffset``."""
    build = builds_of(front).get(template_id, build_id)
    offset = _count(upload.query(request, "logsOffset"), 0, "logsOffset")
    limit = _count(upload.query(request, "limit"), bodies.LOGS_LIMIT, "limit")
    return _answer(request, 200, bodies.status_json(build, offset, limit))


def _count(text: str | None, default: int, what: str) -> int:
    if text is None:
        return default
    if not text.isdigit():
        raise RestError(400, f"{what}: must be a count")
    return int(text)


# Names and tags


def _named(store: TemplateStore, template_id: str) -> list[Template]:
    """The templates of name ``template_id`` (itself, and ``template_id:tag``)."""
    return [t for t in store.listing() if template_id_of(t.name) == template_id]


def alias(front: "E2BFront", request: IRequest, name: str) -> bytes:
    """``GET /templates/aliases/{alias}``: ``200`` when templates of that name exist (or it
    is ``base``, the host's root), else ``404``."""
    template_id = template_id_of(name)
    if template_id != "base" and (front.builds is None or not _named(store_of(front), template_id)):
        raise RestError(404, f"no template named {name!r}")
    return _answer(request, 200, bodies.alias_json(template_id))


def _tag(template_id: str, tag: str) -> str:
    """A tag given as ``tag`` or ``name:tag`` as the template's name ``template_id:tag``."""
    if ":" in tag:
        name, _, tag = tag.partition(":")
        if name != template_id:
            raise RestError(400, f"tag {name}:{tag}: not a tag of {template_id!r}")
    if not tag:
        raise RestError(400, "a tag must not be empty")
    return _name(f"{template_id}:{tag}", "tags")


async def assign_tags(front: "E2BFront", request: IRequest) -> bytes:
    """``POST /templates/tags``: each tag made a name of template ``target`` (a copy of it,
    sharing its files where the state root's filesystem can); a tag that names another
    template is moved (that template deleted first: ``409`` while sandboxes use it)."""
    body = _json(request)
    target = _name(body.get("target"), "target")
    store = store_of(front)
    source = store.get(target)
    names = [_tag(template_id_of(target), tag) for tag in _strings(body, "tags")]
    if not names:
        raise RestError(400, "tags: at least one")
    for name in names:
        if name == target:
            continue
        if name in store.templates:
            await store.delete(name)  # a tag moves to its new target (409 while in use)
        await builds_of(front).copy(target, name)
    tags = [name.partition(":")[2] for name in names]
    return _answer(request, 201, bodies.tags_json(source, tags))


async def remove_tags(front: "E2BFront", request: IRequest) -> bytes:
    """``DELETE /templates/tags``: the templates ``name:tag`` of each tag removed."""
    body = _json(request)
    template_id = template_id_of(_name(body.get("name")))
    store = store_of(front)
    names = [_tag(template_id, tag) for tag in _strings(body, "tags")]
    for name in names:
        store.get(name)
    for name in names:
        await store.delete(name)
    request.setResponseCode(204)
    return b""


def list_tags(front: "E2BFront", request: IRequest, template_id: str) -> bytes:
    """``GET /templates/{id}/tags``: the templates of that name, each with its tag."""
    found = _named(store_of(front), template_id_of(template_id))
    if not found:
        raise RestError(404, f"no template named {template_id!r}")
    return _answer(request, 200, bodies.tag_list_json(found))


# At the headers


def upload_admission(front: "E2BFront", path: bytes) -> Admission | None:
    """What an upload's headers earn it (``None``: not an upload): open with a link the
    front gave, for a build that waits for those files; else refused."""
    route, _, raw = path.partition(b"?")
    matched = UPLOAD_PATH.match(route)
    if matched is None:
        return None
    query = dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
    builds = front.builds
    if builds is not None and builds.upload_admitted(query, matched.group(1).decode()):
        return Admission.OPEN
    return Admission.REFUSED
