"""The routes of commands: ``exec`` (a command streamed to its end) and background processes
(docs/extensions.rst, "Background processes")."""

from typing import TYPE_CHECKING

from twisted.web.iweb import IRequest

from sandboxd.core import SIGNALS, ReaderEvent
from sandboxd.http import parse, wire
from sandboxd.http.routing import app, authorized, capability, json_response, no_content
from sandboxd.http.stream import ExecStream
from sandboxd.web.follow import FollowStream

if TYPE_CHECKING:
    from sandboxd.http.api import SandboxAPI


@app.route("/sandboxes/<rid:rid>/exec", methods=["POST"])
@authorized
async def exec(api: "SandboxAPI", request: IRequest, rid: str) -> None:
    sandbox = api.manager.get(rid)
    body = parse.json_body(request)
    spec = parse.exec_spec(body)
    split = parse.exec_split(body)
    request.setHeader(b"content-type", wire.NDJSON)
    stream = ExecStream(
        request, api.manager.clock, api.manager.config.keepalive, split_stderr=split
    )
    stream.attach(api.manager.start_exec(sandbox, spec, stream.output))
    api.stream_open(request)
    await stream.finish(rid)


# Background processes (docs/extensions.rst, "Background processes")


@app.route("/sandboxes/<rid:rid>/processes", methods=["POST"])
@authorized
@capability("processes")
async def start_process(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    sandbox = api.manager.get(rid)
    spec, tag, stdin = parse.process_start_body(parse.json_body(request))
    process = api.manager.start_process(sandbox, spec, tag=tag, stdin=stdin)
    await process.run.when_started()  # its pid, from a spawn server's answer
    return json_response(request, wire.process_started_body(process))


@app.route("/sandboxes/<rid:rid>/processes", methods=["GET"])
@authorized
def processes(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    table = api.manager.get(rid).processes
    return json_response(request, wire.processes_body(table.all()))


@app.route("/sandboxes/<rid:rid>/processes/<process_id>/output", methods=["GET"])
@authorized
async def process_output(api: "SandboxAPI", request: IRequest, rid: str, process_id: str) -> None:
    process = api.manager.get(rid).processes.get(process_id)
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
        request, api.manager.clock, api.manager.config.keepalive, reader.pause, reader.resume
    )
    try:
        stream.start()
        await stream.wait()
    finally:
        reader.stop()


@app.route("/sandboxes/<rid:rid>/processes/<process_id>/stdin", methods=["POST"])
@authorized
@capability("processes.stdin-backpressure")
async def process_stdin(api: "SandboxAPI", request: IRequest, rid: str, process_id: str) -> bytes:
    """Answered once the bytes are in the command's pipe: a client that sends the next chunk
    only then (``sandboxctl exec``) keeps one chunk in the daemon, however slowly the command
    reads."""
    process = api.manager.get(rid).processes.get(process_id)
    parse.refuse_too_large(request, parse.JSON_BODY_LIMIT)
    content = request.content
    content.seek(0)
    await process.feed_stdin(content, parse.JSON_BODY_LIMIT)
    return no_content(request)


@app.route("/sandboxes/<rid:rid>/processes/<process_id>/stdin", methods=["DELETE"])
@authorized
def process_close_stdin(api: "SandboxAPI", request: IRequest, rid: str, process_id: str) -> bytes:
    api.manager.get(rid).processes.get(process_id).close_stdin()
    return no_content(request)


@app.route("/sandboxes/<rid:rid>/processes/<process_id>/signal", methods=["POST"])
@authorized
def process_signal(api: "SandboxAPI", request: IRequest, rid: str, process_id: str) -> bytes:
    process = api.manager.get(rid).processes.get(process_id)
    process.signal(parse.signal_body(parse.json_body(request), SIGNALS))
    return no_content(request)
