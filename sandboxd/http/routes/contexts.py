"""The routes of interpreter contexts (docs/extensions.rst, "Contexts")."""

from typing import TYPE_CHECKING

from twisted.web.iweb import IRequest

from sandboxd.core import context_events
from sandboxd.http import parse, wire
from sandboxd.http.routing import app, authorized, json_response, no_content
from sandboxd.web.follow import FollowStream

if TYPE_CHECKING:
    from sandboxd.http.api import SandboxAPI


@app.route("/sandboxes/<rid:rid>/contexts", methods=["POST"])
@authorized
async def create_context(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    sandbox = api.manager.get(rid)
    language, cwd = parse.context_create_body(parse.json_body(request))
    context = await api.manager.create_context(sandbox, language, cwd)
    return json_response(request, wire.context_body(context))


@app.route("/sandboxes/<rid:rid>/contexts", methods=["GET"])
@authorized
def contexts(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    sandbox = api.manager.get(rid)
    return json_response(request, [wire.context_body(c) for c in sandbox.contexts.values()])


@app.route("/sandboxes/<rid:rid>/contexts/<cid>/run", methods=["POST"])
@authorized
async def run_code(api: "SandboxAPI", request: IRequest, rid: str, cid: str) -> None:
    """The execution's events as NDJSON lines, ``{}`` during silence, ``end`` last; the
    client's going interrupts it."""
    sandbox = api.manager.get(rid)
    context = api.manager.context(sandbox, cid)
    code, env, timeout = parse.run_code_body(parse.json_body(request))
    request.setHeader(b"content-type", wire.NDJSON)
    stream = FollowStream(request, api.manager.clock, api.manager.config.keepalive)

    def deliver(event: context_events.Event) -> None:
        stream.write(wire.context_frame(event))
        if isinstance(event, context_events.End):
            stream.end()

    stream.start()
    execution = api.manager.run_code(sandbox, context, code, env, deliver, timeout)
    try:
        await stream.wait()
    finally:
        execution.cancel()  # the client went: interrupt it (nothing once it has ended)


@app.route("/sandboxes/<rid:rid>/contexts/<cid>/restart", methods=["POST"])
@authorized
async def restart_context(api: "SandboxAPI", request: IRequest, rid: str, cid: str) -> bytes:
    sandbox = api.manager.get(rid)
    context = api.manager.context(sandbox, cid)
    await api.manager.restart_context(sandbox, context)
    return json_response(request, wire.context_body(context))


@app.route("/sandboxes/<rid:rid>/contexts/<cid>", methods=["DELETE"])
@authorized
async def remove_context(api: "SandboxAPI", request: IRequest, rid: str, cid: str) -> bytes:
    sandbox = api.manager.get(rid)
    await api.manager.remove_context(sandbox, api.manager.context(sandbox, cid))
    return no_content(request)
