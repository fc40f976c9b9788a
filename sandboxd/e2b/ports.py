"""Ports on the E2B front (docs/e2b.rst, "Ports"): host-based routing as the SDK's
``get_host(port)`` builds it, ``{port}-{sandbox_id}.{domain}`` (``SANDBOXD_E2B_DOMAIN``).

A request whose one ``Host`` header names a port of a sandbox of this front goes to that port
inside that sandbox (:mod:`sandboxd.ports`), whatever its path; every other request is the
front's own. It needs that sandbox's traffic token in ``e2b-traffic-access-token`` (each
sandbox has its own, ``trafficAccessToken`` in the create answer: another sandbox's is
refused), unless the sandbox was created with ``network.allowPublicTraffic: true`` or the
port was made public through the native API. The ``Host`` header picks the sandbox and the
token is that sandbox's: a spoofed ``Host`` reaches only a sandbox whose token the caller
holds. The traffic token and the envd access token are never passed on to the sandbox.
"""

import hmac
import re
from typing import Any

from attrs import frozen
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.web.http_headers import Headers
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource
from twisted.web.server import NOT_DONE_YET
from zope.interface import implementer

from sandboxd.e2b import wire
from sandboxd.e2b.registry import E2BSandbox, Registry
from sandboxd.e2b.wire import RestError
from sandboxd.errors import BadRequest, SandboxdError, SandboxNotFound, TooMany
from sandboxd.ports.dial import PortClosed, PortsUnavailable
from sandboxd.ports.forward import forward, origin_form
from sandboxd.ports.table import PORT_MAX, PortTable
from sandboxd.ports.tunnel import tunnel, wants_upgrade
from sandboxd.web.guard import Admission

log = Logger()

TRAFFIC_HEADER = b"e2b-traffic-access-token"
DROPPED = (TRAFFIC_HEADER, b"x-access-token")
"""The front's credentials, never passed on to the sandbox."""

STATUS = {
    PortClosed: 502,
    PortsUnavailable: 409,
    TooMany: 429,
    BadRequest: 400,
}


def port_host(headers: Headers, domain: str | None) -> tuple[str, int] | None:
    """The sandbox id and port the one ``Host`` header names under ``domain``
    (``{port}-{id}.{domain}``, a ``:port`` of the listener allowed); ``None``: not a port
    host (no domain configured, no or several ``Host`` headers, another name)."""
    hosts = headers.getRawHeaders(b"host", [])
    if domain is None or len(hosts) != 1:
        return None
    pattern = rb"([0-9]{1,5})-([0-9A-Za-z_-]+)\.%s(:[0-9]+)?" % re.escape(domain.lower().encode())
    found = re.fullmatch(pattern, hosts[0].strip().lower())
    if found is None or not 1 <= int(found.group(1)) <= PORT_MAX:
        return None
    return found.group(2).decode(), int(found.group(1))


@frozen
class PortAccess:
    """Who may reach a port of the front's sandboxes (see the module's doc)."""

    registry: Registry
    table: PortTable
    domain: str | None

    def allowed(self, entry: E2BSandbox, port: int, headers: Headers) -> bool:
        if entry.public_traffic or self.table.is_public(entry.id, port):
            return True
        given = (headers.getRawHeaders(TRAFFIC_HEADER) or [b""])[0]
        return hmac.compare_digest(given, entry.traffic_token.encode())

    def admit(self, headers: Headers) -> Admission | None:
        """The rule at the headers for a port host (``None``: not one): absent for a sandbox
        the front does not hold, trusted with its traffic token, open when public, refused
        otherwise."""
        target = port_host(headers, self.domain)
        if target is None:
            return None
        found = self.registry.named_or_all(target[0])
        if not found:
            return Admission.ABSENT
        if found[0].public_traffic or self.table.is_public(found[0].id, target[1]):
            return Admission.OPEN
        return (
            Admission.TRUSTED if self.allowed(found[0], target[1], headers) else (Admission.REFUSED)
        )

    def refusal(self, verdict: Admission, headers: Headers) -> bytes | None:
        """The whole answer to a port host's request refused at its headers (``None``: not
        one): ``502`` for a sandbox not held, ``403`` without its traffic token (as E2B)."""
        target = port_host(headers, self.domain)
        if target is None:
            return None
        if verdict is Admission.ABSENT:
            return wire.rest_answer(502, f"The sandbox {target[0]} was not found")
        return wire.rest_answer(403, missing_token(target[0]))


def missing_token(sandbox_id: str) -> str:
    return (
        f"the sandbox {sandbox_id}'s ports need its traffic access token in the "
        "e2b-traffic-access-token header"
    )


@implementer(IResource)
class PortHosts:
    """The front's resource: a port host's requests go to the sandbox's port, every other to
    ``inner`` (the front's Klein resource)."""

    isLeaf = True

    def __init__(self, inner: IResource, access: PortAccess, reactor: Any) -> None:
        self.inner = inner
        self.access = access
        self.reactor = reactor

    def getChildWithDefault(self, name: bytes, request: IRequest) -> IResource:
        return self  # a leaf: never called by twisted.web

    def putChild(self, path: bytes, child: IResource) -> None:
        raise NotImplementedError("a leaf resource has no children")

    def render(self, request: IRequest) -> Any:
        target = port_host(request.requestHeaders, self.access.domain)
        if target is None:
            return self.inner.render(request)
        served = Deferred.fromCoroutine(self._serve(request, *target))
        cast_request(request).notifyFinish().addErrback(lambda _: served.cancel())
        return NOT_DONE_YET

    async def _serve(self, request: IRequest, sandbox_id: str, port: int) -> None:
        live = cast_request(request)
        try:
            entry = self.access.registry.get(sandbox_id)
            if not self.access.allowed(entry, port, request.requestHeaders):
                raise RestError(403, missing_token(sandbox_id))
            path = origin_form(request.uri)
            table = self.access.table
            if wants_upgrade(request):
                await tunnel(self.reactor, table, request, entry.id, port, path, DROPPED)
            else:
                await forward(self.reactor, table, request, entry.id, port, path, DROPPED)
        except CancelledError:
            return  # the client went
        except (SandboxdError, RestError) as e:  # raised before the answer began
            status, message = _answer_of(e, sandbox_id)
            live.setResponseCode(status)
            live.setHeader(b"content-type", wire.JSON)
            live.write(wire.rest_error_body(status, message))
        except Exception:  # pragma: no cover - defensive: the proxy raises only the above
            log.failure("proxying to port {port} of {id} failed", port=port, id=sandbox_id)
            live.channel.transport.abortConnection()
            return
        live.finish()  # the answer has ended (in this turn of the reactor: the client is here)


def cast_request(request: IRequest) -> Any:
    """The twisted.web ``Request`` behind ``request`` (its ``startedWriting``, ``finished``
    and channel)."""
    return request


def _answer_of(error: Exception, sandbox_id: str) -> tuple[int, str]:
    if isinstance(error, RestError):
        return error.status, error.message
    if isinstance(error, SandboxNotFound):
        return 502, f"The sandbox {sandbox_id} was not found"
    assert isinstance(error, SandboxdError)
    status = next((code for kind, code in STATUS.items() if isinstance(error, kind)), 500)
    return status, error.detail


def public_traffic_of(network: object) -> bool:
    """``network`` of a create: its ``allowPublicTraffic`` (a boolean; absent: false, the
    sandbox's ports need its traffic token); its egress lists are
    :func:`sandboxd.e2b.network.e2b_policy`'s."""
    if not isinstance(network, dict):
        return False  # absent, or refused by the egress lists' reading
    public = network.get("allowPublicTraffic", False)
    if not isinstance(public, bool):
        raise RestError(400, "network.allowPublicTraffic: must be true or false")
    return public
