"""The one Klein app of the native front, and what every route of it shares.

The route modules (:mod:`sandboxd.http.routes`) register their functions on :data:`app`;
:class:`sandboxd.http.api.SandboxAPI` holds it as a class attribute, so each route is called
with the :class:`SandboxAPI` serving the request as its first argument.
"""

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar, cast

from klein import Klein
from twisted.web.iweb import IRequest

from sandboxd.http import parse, wire
from sandboxd.web.answers import answer

if TYPE_CHECKING:
    from sandboxd.http.api import SandboxAPI

F = TypeVar("F", bound=Callable[..., Any])

app = Klein()
app.url_map.converters["rid"] = parse.RidConverter

ROUTE_CAPABILITIES: set[str] = set()
"""The capabilities the registered routes implement (listed by ``/healthz``)."""


def capability(*names: str) -> Callable[[F], F]:
    """Tag a route as implementing the named capabilities (listed by ``/healthz``)."""

    def tag(route: F) -> F:
        ROUTE_CAPABILITIES.update(names)
        return route

    return tag


def authorized(route: F) -> F:
    """Refuse the call with ``401`` unless it carries the configured bearer token (the API's
    :class:`~sandboxd.http.auth.BearerAuthoriser`)."""

    @wraps(route)
    def checked(api: "SandboxAPI", request: IRequest, *args: Any, **kwargs: Any) -> Any:
        api.authoriser.check(request)
        return route(api, request, *args, **kwargs)

    return cast(F, checked)


def json_response(request: IRequest, value: Any, status: int = 200) -> bytes:
    """A JSON answer of ``value``."""
    return answer(request, status, wire.body(value))


def no_content(request: IRequest) -> bytes:
    request.setResponseCode(204)
    return b""
