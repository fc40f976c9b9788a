"""The bearer token of a browser's terminal socket (docs/extensions.rst, "The terminal page").

A browser's ``WebSocket`` cannot send an ``Authorization`` header: the one header of the
handshake a page sets is ``Sec-WebSocket-Protocol``. The terminal page offers two
subprotocols, :data:`SUBPROTOCOL` and :data:`BEARER_PREFIX` followed by the token in
unpadded base64url (as Kubernetes takes a bearer token from a browser); the daemon answers
with :data:`SUBPROTOCOL` alone, never echoing the token. Only the handshake of a terminal's
socket (``GET /sandboxes/{rid}/terminals/{id}`` with ``Upgrade: websocket``) may carry it that
way: a proxied port's handshake is passed to the sandbox's server as it is, token and all, so
there it is never taken.
"""

import base64
import binascii
import re

from twisted.web.http_headers import Headers

SUBPROTOCOL = "sandboxd.terminal"
"""The subprotocol a terminal's socket answers with when a client offers it."""
BEARER_PREFIX = b"sandboxd.bearer."
"""A subprotocol that starts with this carries the bearer token (unpadded base64url)."""
TERMINAL_SOCKET_PATH = re.compile(rb"/sandboxes/[^/?#]+/terminals/[^/?#]+(\?[^#]*)?")
"""The request-line paths of a terminal's socket."""


def socket_authorization(path: bytes, headers: Headers) -> bytes | None:
    """The ``Authorization`` value the subprotocols of a terminal socket's handshake carry
    (``Bearer <token>``), or ``None``: not a terminal's socket, not an upgrade to a
    WebSocket, no such subprotocol, or one that is not base64url."""
    upgrade = headers.getRawHeaders(b"upgrade", [b""])[0]
    if upgrade.lower() != b"websocket" or TERMINAL_SOCKET_PATH.fullmatch(path) is None:
        return None
    for value in headers.getRawHeaders(b"sec-websocket-protocol", []):
        for offered in value.split(b","):
            offered = offered.strip()
            if offered.startswith(BEARER_PREFIX):
                encoded = offered[len(BEARER_PREFIX) :]
                try:
                    token = base64.b64decode(
                        encoded + b"=" * (-len(encoded) % 4), altchars=b"-_", validate=True
                    )
                except binascii.Error:
                    return None
                return b"Bearer " + token
    return None
