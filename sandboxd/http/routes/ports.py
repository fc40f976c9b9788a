"""Ports (docs/extensions.rst, "Ports"): a server listening inside a sandbox, reached through
the daemon at ``/sandboxes/{rid}/ports/{port}/{path}``, and a port made public (served without
the token) by ``POST /sandboxes/{rid}/ports/{port}``.

The token a call carried is never passed on to the sandbox; a public port's calls are passed
on as they came (less the hop-by-hop headers, :mod:`sandboxd.ports.forward`).
"""

import re
from typing import TYPE_CHECKING

from twisted.web.iweb import IRequest

from sandboxd.errors import BadRequest
from sandboxd.http import parse, wire
from sandboxd.http.routes.sandboxes import own_url
from sandboxd.http.routing import app, authorized, capability, json_response
from sandboxd.http.wire import Unauthorized
from sandboxd.ports.forward import forward, origin_form
from sandboxd.ports.table import PORT_MAX, PORT_MIN, PortTable
from sandboxd.ports.tunnel import tunnel, wants_upgrade

if TYPE_CHECKING:
    from sandboxd.http.api import SandboxAPI

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
PROXIED = re.compile(rb"^/sandboxes/([0-9A-Za-z_-]+)/ports/([0-9]{1,5})(/[^?#]*)?(\?.*)?$", re.S)
"""A proxied call's path: the sandbox, the port, the path and query passed on."""


def proxied(path: bytes) -> tuple[str, int, bytes] | None:
    """The sandbox, port and target (path and query, ``/`` at least) of a proxied call's
    request-line ``path`` (``None``: not one; a bare ``/ports/{port}`` is the port's own call)."""
    found = PROXIED.match(path)
    if found is None or found.group(3) is None:
        return None
    rid, port, rest, query = found.groups()
    return rid.decode(), int(port), rest + (query or b"")


def public_call(table: PortTable) -> "PublicCall":
    """The rule the authoriser asks at the headers: whether a path is a proxied call to a port
    ``table`` holds public."""
    return PublicCall(table)


class PublicCall:
    """Whether a request-line path is a proxied call to a public port (served without the
    token)."""

    def __init__(self, table: PortTable) -> None:
        self.table = table

    def __call__(self, path: bytes) -> bool:
        found = proxied(path)
        return found is not None and self.table.is_public(found[0], found[1])


def checked_port(port: int) -> int:
    if not PORT_MIN <= port <= PORT_MAX:
        raise BadRequest(f"port: must be from {PORT_MIN} to {PORT_MAX}")
    return port


def port_url(api: "SandboxAPI", request: IRequest, rid: str, port: int) -> str:
    """The URL a port is reached at through this replica."""
    return f"{own_url(api, request)}/sandboxes/{rid}/ports/{port}/"


@app.route("/sandboxes/<rid:rid>/ports/<int:port>", methods=["POST"])
@authorized
@capability("ports")
def expose(api: "SandboxAPI", request: IRequest, rid: str, port: int) -> bytes:
    """Set whether the port is public (``{"public": bool}``; absent: unchanged), and answer
    where it is reached."""
    api.manager.get(rid)
    public = parse.port_public(parse.json_body(request))
    if public is not None:
        api.ports.set_public(rid, checked_port(port), public)
    body = wire.port_body(
        port_url(api, request, rid, checked_port(port)), api.ports.is_public(rid, port)
    )
    return json_response(request, body)


@app.route("/sandboxes/<rid:rid>/ports/<int:port>/", methods=METHODS, endpoint="proxy_root")
@app.route("/sandboxes/<rid:rid>/ports/<int:port>/<path:rest>", methods=METHODS)
async def proxy(
    api: "SandboxAPI", request: IRequest, rid: str, port: int, rest: str = ""
) -> bytes | None:
    """Pass the call on to ``port`` inside ``rid`` (a WebSocket upgrade: join the two
    connections); the token, unless the port is public."""
    token_carried = api.authoriser.carried_by(request.getHeader(b"authorization"))
    if not token_carried and not api.ports.is_public(rid, port):
        raise Unauthorized(wire.UNAUTHORIZED_DETAIL)
    api.manager.get(rid)
    checked_port(port)
    found = proxied(origin_form(request.uri))
    if found is None or found[:2] != (rid, port):
        raise BadRequest("the sandbox and port of a proxied call must be spelled plainly")
    drop = (b"authorization",) if api.token is not None and token_carried else ()
    if wants_upgrade(request):
        await tunnel(api.reactor, api.ports, request, rid, port, found[2], drop)
    else:
        await forward(api.reactor, api.ports, request, rid, port, found[2], drop)
    return None
