"""Who may call each route of the E2B front, and the checks every RPC passes: the decorators of
:class:`~sandboxd.e2b.api.E2BFront`'s routes (the control plane's key, envd's access token, the
code interpreter's port and tokens), the user a call may name, an RPC body's encoding and size.
"""

import base64
import binascii
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar, cast

from twisted.web.iweb import IRequest

from sandboxd.e2b import interpreter
from sandboxd.e2b.admit import sandbox_id_of
from sandboxd.e2b.wire import ConnectError, RestError
from sandboxd.web.body import TooLarge, refuse_too_large

if TYPE_CHECKING:
    from sandboxd.e2b.api import E2BFront

USERS = ("", "user")
"""The users a call may name: E2B's default ``user`` is the sandbox's own uid."""


def check_user(user: str | None) -> None:
    """Refuse any user but the default (``user``): every command runs as the sandbox's own
    unprivileged uid, there is no root in a sandbox."""
    if user not in USERS and user is not None:
        raise ConnectError(
            "permission_denied",
            f"user {user!r} is not available: sandboxd runs everything in a sandbox as its own "
            "unprivileged uid (the default user); there is no root in a sandbox",
        )


def user_of(request: IRequest) -> str | None:
    header = request.getHeader(b"authorization")
    if header is None or not header.startswith(b"Basic "):
        return None
    try:
        return base64.b64decode(header[6:], validate=True).decode().split(":", 1)[0]
    except (binascii.Error, UnicodeDecodeError):
        raise ConnectError("unauthenticated", "a malformed Basic authorization") from None


def check_rpc_body(request: IRequest, max_body: int) -> None:
    """Refuse an RPC's body that is compressed (``unimplemented``, as Connect servers refuse
    an encoding they do not take), or was not stored whole: over ``max_body``
    (``resource_exhausted``), or for want of space."""
    encoding = (request.getHeader(b"content-encoding") or b"identity").lower()
    if encoding != b"identity":
        raise ConnectError(
            "unimplemented",
            f"a request body in {encoding.decode('latin-1')!r} is not accepted: send it "
            "uncompressed (identity)",
        )
    try:
        refuse_too_large(request, max_body)
    except TooLarge as e:
        raise ConnectError("resource_exhausted", f"{e.detail} (SANDBOXD_MAX_BODY)") from None


F = TypeVar("F", bound=Callable[..., Any])


def control_plane(route: F) -> F:
    """A route of the control plane: ``401`` unless the call carries the daemon's key
    (:meth:`Authoriser.control_plane`)."""

    @wraps(route)
    def checked(front: "E2BFront", request: IRequest, *args: Any, **kwargs: Any) -> Any:
        front.authoriser.control_plane(request)
        return route(front, request, *args, **kwargs)

    return cast(F, checked)


def envd(operation: str | None = None) -> Callable[[F], F]:
    """A route of envd, called with the sandbox the call is for after its request: found by
    the access token (:meth:`Authoriser.envd`), or for ``/files``'s ``operation`` by the
    token or the URL's signature (:meth:`Authoriser.files`)."""

    def route_of(route: F) -> F:
        @wraps(route)
        def found(front: "E2BFront", request: IRequest, *args: Any, **kwargs: Any) -> Any:
            authoriser = front.authoriser
            if operation is None:
                entry = authoriser.envd(request)
            else:
                entry = authoriser.files(request, operation)
            return route(front, request, entry, *args, **kwargs)

        return cast(F, found)

    return route_of


def interpreter_call(route: F) -> F:
    """A route of the code interpreter, called with the sandbox the call is for after its
    request: ``404`` without the interpreter's port header, else found by its access or
    traffic token (:mod:`sandboxd.e2b.interpreter`)."""

    @wraps(route)
    def found(front: "E2BFront", request: IRequest, *args: Any, **kwargs: Any) -> Any:
        port = request.getHeader(b"e2b-sandbox-port")
        if not interpreter.is_interpreter_call(request.path or b"", port):
            raise RestError(404, "the code interpreter answers on port 49999 only")
        entry = front.registry.get(sandbox_id_of(request))
        if not front.registry.opens_interpreter(entry, *interpreter.tokens_of(request.getHeader)):
            # With SANDBOXD_AUTH_GATE=off this is the only check (the gate's, at the headers).
            raise ConnectError("unauthenticated", "the access token is not this sandbox's")
        return route(front, request, entry, *args, **kwargs)

    return cast(F, found)
