"""The routes of terminals (docs/extensions.rst, "Terminals"): create, list, resize, kill,
the WebSocket a client attaches with (:mod:`sandboxd.http.terminal_socket`), and the page a
browser does it from (:mod:`sandboxd.terminal_page`).

A terminal is a background process of its sandbox (the same table and cap; its id works
with every ``processes/{id}`` route: output as NDJSON, stdin, signal).
"""

from typing import TYPE_CHECKING, Any

from twisted.web.iweb import IRequest

from sandboxd.core import DEFAULT_TERM, ExecSpec, Process, TerminalSize
from sandboxd.errors import BadRequest, ProcessNotFound
from sandboxd.http import parse, wire
from sandboxd.http.routing import app, authorized, capability, json_response, no_content
from sandboxd.terminal_page import TerminalPage

if TYPE_CHECKING:
    from sandboxd.http.api import SandboxAPI

TERM_MAX = 64
PAGE = TerminalPage()
"""The terminal page, read from its vendored files once they are there."""


def terminal_start_body(body: dict[str, Any]) -> tuple[ExecSpec, TerminalSize, str | None]:
    """``POST terminals``: the command as a background process takes it (``cmd``: ``["sh"]``
    when absent), ``rows``, ``cols`` (24 x 80) and ``term`` (``TERM``, :data:`DEFAULT_TERM`)."""
    term = body.get("term", DEFAULT_TERM)
    if not isinstance(term, str) or not term or len(term) > TERM_MAX or "\0" in term:
        raise BadRequest(f"term: must be a name of at most {TERM_MAX} characters")
    size = TerminalSize.parse(body.get("rows", 24), body.get("cols", 80))
    rest = {k: v for k, v in body.items() if k not in ("rows", "cols", "term")}
    rest.setdefault("cmd", ["sh"])
    spec, tag, stdin = parse.process_start_body(rest)
    if stdin:
        raise BadRequest("stdin: a terminal's input is its keyboard")
    spec.env.setdefault("TERM", term)
    return spec, size, tag


def _terminal(api: "SandboxAPI", rid: str, terminal_id: str) -> Process:
    process = api.manager.get(rid).processes.get(terminal_id)
    if process.listing().pty is None:
        raise ProcessNotFound(f"no terminal {terminal_id!r} in this sandbox")
    return process


@app.route("/sandboxes/<rid:rid>/terminals", methods=["POST"])
@authorized
@capability("terminals")
def start_terminal(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    sandbox = api.manager.get(rid)
    spec, size, tag = terminal_start_body(parse.json_body(request))
    process = api.manager.start_terminal(sandbox, spec, size, tag=tag)
    return json_response(request, wire.terminal_body(process))


@app.route("/sandboxes/<rid:rid>/terminal", methods=["GET"])
def terminal_page(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    """The terminal page, without the token (the channel admits its path open): the same
    page for any ``rid``, whose calls carry the token it is given."""
    page = PAGE.answer()
    request.setResponseCode(page.status)
    request.setHeader(b"content-type", page.content_type)
    for name, value in page.headers.items():
        request.setHeader(name, value)
    return page.body


@app.route("/sandboxes/<rid:rid>/terminals", methods=["GET"])
@authorized
def terminals(api: "SandboxAPI", request: IRequest, rid: str) -> bytes:
    return json_response(request, wire.terminals_body(api.manager.get(rid).processes.all()))


@app.route("/sandboxes/<rid:rid>/terminals/<terminal_id>", methods=["GET"])
@authorized
def terminal(api: "SandboxAPI", request: IRequest, rid: str, terminal_id: str) -> Any:
    """With ``Upgrade: websocket``, the terminal's WebSocket (from byte ``offset`` of its
    output when given, else from what its scrollback holds); else its listing."""
    process = _terminal(api, rid, terminal_id)
    upgrade = request.getHeader(b"upgrade") or b""
    if upgrade.lower() != b"websocket":
        return json_response(request, wire.process_json(process.listing()))
    # From 0: what fell out of the scrollback is skipped, what it holds is shown
    offset = parse.offset_param(request)
    if offset > process.log.written:
        raise BadRequest(f"offset: past the end of the output ({process.log.written} bytes)")
    # WebSockets imported at the first terminal attach: the daemon starts without them
    from autobahn.twisted.resource import WebSocketResource

    from sandboxd.http.terminal_socket import TerminalSocketFactory

    return WebSocketResource(TerminalSocketFactory(process, offset))


@app.route("/sandboxes/<rid:rid>/terminals/<terminal_id>/resize", methods=["POST"])
@authorized
def resize_terminal(api: "SandboxAPI", request: IRequest, rid: str, terminal_id: str) -> bytes:
    body = parse.json_body(request)
    _terminal(api, rid, terminal_id).resize(TerminalSize.parse(body.get("rows"), body.get("cols")))
    return no_content(request)


@app.route("/sandboxes/<rid:rid>/terminals/<terminal_id>", methods=["DELETE"])
@authorized
def kill_terminal(api: "SandboxAPI", request: IRequest, rid: str, terminal_id: str) -> bytes:
    """SIGKILL the terminal's process group (its record stays, with its exit)."""
    process = _terminal(api, rid, terminal_id)
    if process.running:
        process.signal("KILL")
    return no_content(request)
