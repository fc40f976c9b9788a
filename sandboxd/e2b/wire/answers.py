"""The E2B front's error answers: a unary call's Connect error body, the control plane's REST
error body, and the whole answers the channel sends (status line to body) before any route
sees a request."""

from http import HTTPStatus

from sandboxd.e2b.wire.connect import (
    CONNECT_JSON,
    RPC_PREFIXES,
    STREAM_PATHS,
    body,
    end_of_stream,
)
from sandboxd.e2b.wire.errors import (
    STATUS_OF_CODE,
    ConnectError,
    error_json,
    no_sandbox_named,
    not_running,
)
from sandboxd.web.answers import JSON


def connect_error_body(error: ConnectError) -> tuple[int, bytes]:
    """A unary call's error: its status and Connect error body."""
    return STATUS_OF_CODE.get(error.code, 500), body(error_json(error))


def rest_error_body(status: int, message: str) -> bytes:
    """A control-plane error body (``code`` is the integer status)."""
    return body({"code": status, "message": message})


def refused_answer(path: bytes, message: str = "Invalid API key or access token") -> bytes:
    """A whole ``401`` answer, status line to body, that closes the connection: sent by the
    channel as soon as a request's headers lack the key or the access token (a Connect error
    on the RPC routes, the REST error body elsewhere)."""
    if path.startswith((b"/process.Process/", b"/filesystem.Filesystem/")):
        message = "the access token is not this sandbox's"
        payload = body({"code": "unauthenticated", "message": message})
    else:
        payload = rest_error_body(401, message)
    return _whole_answer(401, JSON, payload)


def rest_answer(status: int, message: str) -> bytes:
    """A whole REST error answer, status line to body, that closes the connection."""
    return _whole_answer(status, JSON, rest_error_body(status, message))


def absent_answer(path: bytes, sandbox_id: str) -> bytes:
    """A whole answer, status line to body, that closes the connection: sent by the channel
    as soon as the headers of an envd request name a sandbox the front does not hold, or none.
    It is what the route answers: the end of a stream on a streaming RPC, a Connect error on a
    unary one, the REST error on ``/files`` and ``/health`` (``502`` for a sandbox not held)."""
    error = not_running(sandbox_id) if sandbox_id else no_sandbox_named()
    route = path.split(b"?", 1)[0]
    if route in STREAM_PATHS:
        return _whole_answer(200, CONNECT_JSON, end_of_stream(error))
    status, payload = connect_error_body(error)
    if route.startswith(RPC_PREFIXES):
        return _whole_answer(status, JSON, payload)
    status = 502 if sandbox_id else status
    return _whole_answer(status, JSON, rest_error_body(status, error.message))


def _whole_answer(status: int, content_type: bytes, payload: bytes) -> bytes:
    head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: "
    tail = f"\r\ncontent-length: {len(payload)}\r\nconnection: close\r\n\r\n"
    return head.encode() + content_type + tail.encode() + payload
