"""The routes of templates (docs/extensions.rst, "Templates"): list, show, import (an archive
body), build (a Dockerfile, NDJSON progress) and delete. Klein names each route after its
function: these names are the module's own (a ``delete`` here would replace the files'
``delete``)."""

import io
import os
from typing import IO, TYPE_CHECKING

from twisted.internet.defer import Deferred
from twisted.web.iweb import IRequest

from sandboxd.core import (
    TemplateRoot,
    TemplateStore,
    check_name,
    read_dockerfile,
    start_build,
)
from sandboxd.errors import BadRequest, TemplateCannotRun, TemplatesUnavailable
from sandboxd.http import parse, wire
from sandboxd.http.routing import app, authorized, json_response, no_content
from sandboxd.http.wire.build import build_frame
from sandboxd.web.follow import FollowStream

if TYPE_CHECKING:
    from sandboxd.http.api import SandboxAPI


def store(api: "SandboxAPI") -> TemplateStore:
    """The replica's template store (``503`` when it has none)."""
    if api.templates is None:
        raise TemplatesUnavailable("templates are not available on this replica")
    return api.templates


def template_root(api: "SandboxAPI", name: object) -> TemplateRoot:
    """A create's ``template``: ``400`` unless a name, ``404`` unless a template of this
    replica, ``501`` where its isolation cannot switch a sandbox's root (the mount namespace
    and the exec helper, as root): a create that names one must never give a sandbox that
    silently runs on the host's root instead."""
    if not isinstance(name, str):
        raise BadRequest("template: must be a template's name")
    root = store(api).root(name)
    if not api.manager.isolation.namespaces.switches_root:
        raise TemplateCannotRun(
            f"template {name!r}: this replica cannot run sandboxes in templates (it needs"
            " root, the mount namespace and the exec helper)"
        )
    return root


@app.route("/templates", methods=["GET"])
@authorized
def list_templates(api: "SandboxAPI", request: IRequest) -> bytes:
    return json_response(request, wire.templates_body(store(api).listing()))


@app.route("/templates/<name>", methods=["GET"])
@authorized
def show_template(api: "SandboxAPI", request: IRequest, name: str) -> bytes:
    return json_response(request, wire.template_body(store(api).get(name)))


@app.route("/templates/<name>", methods=["PUT"])
@authorized
async def import_template(api: "SandboxAPI", request: IRequest, name: str) -> bytes:
    """The body is the archive, stored like any upload's (``SANDBOXD_MAX_BODY``); its kind is
    read from its content, whatever its content type says."""
    templates = store(api)
    check_name(name)
    parse.refuse_too_large(request, api.manager.config.max_body)
    template = await templates.put(name, own_copy(request.content))
    return json_response(request, wire.template_body(template), 201)


@app.route("/templates/<name>/build", methods=["POST"])
@authorized
async def build_template(api: "SandboxAPI", request: IRequest, name: str) -> None:
    """The body is the build's context as a tar with its ``Dockerfile`` at the top, or JSON
    ``{dockerfile, network?}`` (no context); without a ``network`` (or a recipe's), its
    ``RUN`` steps have ``SANDBOXD_BUILD_NETWORK``'s. A Dockerfile the builder cannot follow, a name
    taken or an unknown base is answered at once; then ``200`` and NDJSON frames: each step's
    start, its output lines, the end. While the client is behind, the running ``RUN``'s output
    is not read (it waits on its pipe). The client's going cancels the build."""
    templates = store(api)
    check_name(name)
    parse.refuse_too_large(request, api.manager.config.max_body)
    content_type = request.getHeader(b"content-type") or b""
    is_json = content_type.split(b";")[0].strip() == wire.JSON
    context = None if is_json else own_copy(request.content)
    default_network = api.manager.config.build_network  # a build that names none
    try:
        if context is None:
            body = parse.with_recipe(parse.json_body(request))  # {recipe}: a built-in Dockerfile
            text, network = body.get("dockerfile"), body.get("network", default_network)
            if not isinstance(text, str):
                raise BadRequest("dockerfile: must be the Dockerfile's text")
        else:
            text = await templates.in_thread(read_dockerfile, context)
            network = parse.query(request, "network", default_network)
        stream = FollowStream(request, api.manager.clock, api.manager.config.keepalive)
        build = start_build(
            templates, name, text, context, network, lambda e: stream.write(build_frame(e))
        )
        stream.pause, stream.resume = build.pause_output, build.resume_output  # back-pressure
        request.setHeader(b"content-type", wire.NDJSON)
        stream.start()
        ended: Deferred[None] = Deferred()
        Deferred.fromCoroutine(build.run()).addBoth(lambda _: ended.callback(None))
        ended.addBoth(lambda _: stream.end())
        try:
            await stream.wait()
        finally:
            build.cancel()  # the client went: the build stops, leaves nothing (none once ended)
            await ended  # cancelled with the request, it leaves the build to end as it does
    finally:
        if context is not None:
            context.close()


def own_copy(content: IO[bytes]) -> IO[bytes]:
    """The body as a file of the import's own, at its start: the request closes its content
    when its client goes, and the import goes on without it (a body held in memory is
    copied, being small; a spooled one is the same file through a descriptor of its own,
    whether in the daemon's spool or, on a state root without unnamed files, twisted.web's
    temporary file). The store closes it."""
    if isinstance(content, io.BytesIO):
        return io.BytesIO(content.getvalue())
    copy = os.fdopen(os.dup(content.fileno()), "rb")
    copy.seek(0)
    return copy


@app.route("/templates/<name>", methods=["DELETE"])
@authorized
async def delete_template(api: "SandboxAPI", request: IRequest, name: str) -> bytes:
    await store(api).delete(name)
    return no_content(request)
