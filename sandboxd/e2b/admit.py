"""The E2B front's rule at the headers (docs/operating.rst, "Connections"): what a request's
headers earn it before one byte of its body is read.

The control plane and every route that is not envd's need ``X-API-Key`` = the daemon's token
(any key when it has none). envd's routes need the access token of the sandbox that
``E2b-Sandbox-Id`` names; a sandbox this front does not know is let through, so that the
front answers what the SDK expects of a sandbox that is gone (the body is then bounded by
``SANDBOXD_MAX_BODY`` like any other), and so is a ``/files`` URL signed instead
(:mod:`sandboxd.e2b.signing`: its signature is judged by the route). Keys are compared in
constant time.
"""

import hmac
from urllib.parse import parse_qsl

from twisted.web.http_headers import Headers

from sandboxd.e2b import signing
from sandboxd.e2b.registry import Registry
from sandboxd.http.guard import Admission, Admit

ENVD_ROUTES = (b"/health", b"/files", b"/process.Process/", b"/filesystem.Filesystem/")
"""The paths envd serves (the rest is the control plane, or unsupported)."""


def _header(headers: Headers, name: bytes) -> bytes | None:
    values = headers.getRawHeaders(name)
    return values[0] if values else None


def _signed(path: bytes) -> bool:
    query = path.partition(b"?")[2].decode("utf-8", "replace")
    return signing.is_signed(dict(parse_qsl(query, keep_blank_values=True)))


def admission(token: bytes | None, registry: Registry) -> Admit:
    """The rule of a front whose API key is ``token`` and whose sandboxes ``registry`` holds."""

    def admit(path: bytes, authorization: bytes | None, headers: Headers) -> Admission:
        route = path.split(b"?", 1)[0]
        if not route.startswith(ENVD_ROUTES):
            key = _header(headers, b"x-api-key")
            if token is None or (key is not None and hmac.compare_digest(key, token)):
                return Admission.TRUSTED
            return Admission.REFUSED
        access_header = _header(headers, b"x-access-token")
        if access_header is None and route == b"/files" and _signed(path):
            return Admission.OPEN  # a signed URL: its signature is judged by the route
        sandbox_id = (_header(headers, b"e2b-sandbox-id") or b"").decode("utf-8", "replace")
        access = (access_header or b"").decode("utf-8", "replace")
        held = registry.holds(sandbox_id, access)
        if held is None:
            return Admission.OPEN
        return Admission.TRUSTED if held else Admission.REFUSED

    return admit
