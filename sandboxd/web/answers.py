"""The few answers the web plumbing makes itself, the same on every front: a JSON ``400`` for a
request that is malformed before any route sees it, and the ``401`` of a site given a rule at
the headers but no refusal of its own (each front passes its own, :data:`~sandboxd.web.guard.
Refusal`); and what both fronts answer with: the JSON answer of a route (:func:`answer`), the
content types, and the error body.

Their bodies have the shape of the native API's error bodies (docs/contract.rst, "Errors"):
``{"error": <type>, "detail": <message>}``.
"""

import json

from twisted.web.iweb import IRequest

JSON = b"application/json"
OCTETS = b"application/octet-stream"


def answer(request: IRequest, status: int, body: bytes) -> bytes:
    """A JSON answer of ``status`` whose ``body`` the front's wire made."""
    request.setResponseCode(status)
    request.setHeader(b"content-type", JSON)
    return body


def error_body(kind: str, detail: str) -> bytes:
    """``{"error": <kind>, "detail": <detail>}``, as ``json.dumps`` writes it."""
    return json.dumps({"error": kind, "detail": detail}).encode()


def bad_request_body(detail: str) -> bytes:
    """A ``400 BadRequest`` body."""
    return error_body("BadRequest", detail)


UNAUTHORIZED_DETAIL = "the request is not authorised"
"""The ``detail`` of the plumbing's own ``401``."""


def unauthorized_answer() -> bytes:
    """A whole ``401`` answer, status line to body, that closes the connection: what a site
    sends a request its rule refused when no front's refusal was given."""
    body = error_body("Unauthorized", UNAUTHORIZED_DETAIL)
    return (
        b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )
