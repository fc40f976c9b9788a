"""The native API's one authorisation: the bearer token (docs/extensions.rst, "Auth").

:class:`BearerAuthoriser` is asked twice per request, the same question each time: by the
channel as soon as the headers are in (:meth:`~BearerAuthoriser.admit`, the site's rule at
the headers, :mod:`sandboxd.web.guard`), and by each authorized route
(:meth:`~BearerAuthoriser.check`, through :func:`sandboxd.http.routing.authorized`), so that
a daemon whose gate at the headers is off (``SANDBOXD_AUTH_GATE=off``) refuses exactly the
same calls. Tokens are compared in constant time.
"""

import hmac
from collections.abc import Callable

from attrs import field, frozen
from twisted.web.http_headers import Headers
from twisted.web.iweb import IRequest

from sandboxd.http import wire
from sandboxd.http.socket_bearer import socket_authorization
from sandboxd.http.wire import Unauthorized
from sandboxd.terminal_page import is_page_path
from sandboxd.web.guard import Admission

OPEN_PATHS = frozenset({b"/healthz", b"/readyz"})
"""The paths served without the token (every other route is authorized)."""


@frozen
class BearerAuthoriser:
    """The bearer token ``token`` (``None``: no token configured, every call is served);
    ``public`` says whether a request-line path is a call to a public port (docs/extensions.rst,
    "Ports"), served without it."""

    token: bytes | None
    public: Callable[[bytes], bool] = field(default=lambda path: False)

    def carried_by(self, authorization: bytes | None) -> bool:
        """Whether an ``authorization`` header carries the token."""
        if self.token is None:
            return True
        return hmac.compare_digest(authorization or b"", b"Bearer " + self.token)

    def admit(
        self, path: bytes, authorization: bytes | None, headers: Headers | None = None
    ) -> Admission:
        """The rule at the headers: trusted with the token (or a terminal socket's
        subprotocol carrying it, :mod:`sandboxd.http.socket_bearer`), open for the paths
        served without it (the terminal page among them), refused otherwise (before any byte
        of the body is read)."""
        if self.carried_by(authorization) or (
            headers is not None and self.carried_by(socket_authorization(path, headers))
        ):
            return Admission.TRUSTED
        bare = path.split(b"?", 1)[0]
        if bare in OPEN_PATHS or is_page_path(bare) or self.public(path):
            return Admission.OPEN
        return Admission.REFUSED

    def check(self, request: IRequest) -> None:
        """A route's check: :class:`~sandboxd.http.wire.Unauthorized` (``401``) unless the
        request carries the token (in its ``authorization`` header, or a terminal socket's
        subprotocol)."""
        if not (
            self.carried_by(request.getHeader(b"authorization"))
            or self.carried_by(socket_authorization(request.uri, request.requestHeaders))
        ):
            raise Unauthorized(wire.UNAUTHORIZED_DETAIL)

    @staticmethod
    def refusal(path: bytes, verdict: Admission, headers: Headers) -> bytes:
        """The whole answer to a request refused at its headers: the route's own ``401``."""
        return wire.unauthorized_answer()
