"""The E2B front's wire: every body and frame it sends, and the parsing of what it receives.

Connect-RPC with the JSON codec (the only one the SDK uses): a unary call's body is one bare
JSON object; a stream's body is a run of *envelopes* (one flag byte, a 4-byte big-endian
length, that many bytes of JSON), the last one flagged end-of-stream (``0x02``) and holding
``{}`` or ``{"error": {...}}``. Errors of unary calls are a non-200 status with a Connect error
body ``{"code": "<code>", "message": "..."}``. The control plane (REST) answers errors as
``{"code": <int status>, "message": "..."}``, which is what the SDK's generated client needs.

Core errors become Connect codes and REST statuses in one table searched along the class
hierarchy, :data:`ERROR_ANSWERS`.
"""

import base64
import binascii
import json
import math
import struct
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from attrs import frozen

from sandboxd.config import Config
from sandboxd.core import context_events as events
from sandboxd.errors import (
    BadRequest,
    ContextNotFound,
    ContextsUnavailable,
    Draining,
    InsufficientStorage,
    NoCapacity,
    PathNotFound,
    ProcessConflict,
    ProcessNotFound,
    SandboxdError,
    SandboxNotFound,
    TooMany,
)

if TYPE_CHECKING:
    from sandboxd.e2b.registry import E2BSandbox

JSON = b"application/json"
CONNECT_JSON = b"application/connect+json"
"""A stream's content type, exactly (the SDK refuses any parameter on it)."""

FLAG_END = 0x02
FLAG_COMPRESSED = 0x01
HEADER = struct.Struct(">BI")
MESSAGE_MAX = 16 << 20
"""Bytes of one envelope's payload the front accepts."""

STREAM_PATHS = frozenset(
    b"/" + name
    for name in (
        b"process.Process/Start",
        b"process.Process/Connect",
        b"process.Process/StreamInput",
        b"filesystem.Filesystem/WatchDir",
    )
)
"""The paths of the streaming RPCs: their errors are a stream's end, never an HTTP status."""
RPC_PREFIXES = (b"/process.", b"/filesystem.")
"""What the paths of the RPCs begin with: their errors are Connect's, not REST's."""


class ConnectError(Exception):
    """An error answered as Connect ``code`` (``invalid_argument``, ``not_found``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class RestError(Exception):
    """A control-plane or ``/files`` error: its HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


STATUS_OF_CODE = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}
"""The HTTP status of each Connect code (the Connect protocol's table)."""


@frozen
class ErrorAnswer:
    """How the front answers one kind of core error."""

    code: str
    """Its Connect code (the RPC routes; its HTTP status: :data:`STATUS_OF_CODE`)."""
    status: int
    """Its HTTP status on the REST routes (the control plane, ``/files``, ``/health``)."""
    gone: bool = False
    """It means the sandbox is not running: envd's routes say so in the SDK's words
    (:func:`not_running`; ``502`` on ``/files`` and ``/health``)."""


ERROR_ANSWERS: Mapping[type[SandboxdError], ErrorAnswer] = {
    BadRequest: ErrorAnswer("invalid_argument", 400),
    PathNotFound: ErrorAnswer("not_found", 404),
    ProcessNotFound: ErrorAnswer("not_found", 404),
    ContextNotFound: ErrorAnswer("not_found", 404),
    ContextsUnavailable: ErrorAnswer("unimplemented", 501),
    ProcessConflict: ErrorAnswer("failed_precondition", 400),
    InsufficientStorage: ErrorAnswer("resource_exhausted", 507),  # NotEnoughSpaceException
    TooMany: ErrorAnswer("resource_exhausted", 429),
    NoCapacity: ErrorAnswer("unavailable", 503),
    Draining: ErrorAnswer("unavailable", 503),
    SandboxNotFound: ErrorAnswer("unavailable", 404, gone=True),
    SandboxdError: ErrorAnswer("internal", 500),
}
"""Core error → how it is answered; a subclass answers as its nearest base (any other core
error as :class:`~sandboxd.errors.SandboxdError`: ``internal``, ``500``)."""


def answer_of(error: SandboxdError) -> ErrorAnswer:
    """How ``error`` is answered: the entry of its class, or of its nearest base, in
    :data:`ERROR_ANSWERS`."""
    return next(ERROR_ANSWERS[kind] for kind in type(error).__mro__ if kind in ERROR_ANSWERS)


def connect_error_of(error: Exception) -> ConnectError:
    """The Connect error a core (or front) error is answered with."""
    if isinstance(error, ConnectError):
        return error
    if isinstance(error, SandboxdError):
        return ConnectError(answer_of(error).code, error.detail)
    return ConnectError("internal", str(error) or type(error).__name__)


def not_running(sandbox_id: str) -> ConnectError:
    """A sandbox unknown or killed: the SDK matches ``was not found`` (not running)."""
    return ConnectError("unavailable", f"The sandbox {sandbox_id} was not found")


def no_sandbox_named() -> ConnectError:
    """An envd call without the ``E2b-Sandbox-Id`` header."""
    return ConnectError("invalid_argument", "the E2b-Sandbox-Id header is required")


def events_dropped() -> ConnectError:
    """How a ``WatchDir`` stream ends when its client read too slowly to be told every change
    (what it was not told is gone: it must list the directory again)."""
    return ConnectError(
        "data_loss",
        "events were dropped: the client read the watch stream too slowly (watch again and "
        "list the directory)",
    )


# JSON bodies


def body(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def parse_message(data: bytes) -> dict[str, Any]:
    """One JSON message; ``invalid_argument`` unless it is a JSON object."""
    try:
        value = json.loads(data or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise ConnectError("invalid_argument", f"the message is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ConnectError("invalid_argument", "the message must be a JSON object")
    return value


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


# Envelopes


def envelope(message: Any, flags: int = 0) -> bytes:
    payload = body(message)
    return HEADER.pack(flags, len(payload)) + payload


def error_json(error: ConnectError) -> dict[str, str]:
    """A Connect error as JSON (a unary call's body, a stream's last envelope's ``error``)."""
    return {"code": error.code, "message": error.message}


def end_of_stream(error: ConnectError | None = None) -> bytes:
    """The last envelope of a stream: ``{}``, or the error the stream ends with."""
    if error is None:
        return envelope({}, FLAG_END)
    return envelope({"error": error_json(error)}, FLAG_END)


def read_envelopes(data: bytes) -> Iterator[dict[str, Any]]:
    """The messages of a streamed request body, up to its end-of-stream envelope (which a
    client may also leave out); ``invalid_argument`` for a truncated or compressed envelope,
    or one whose payload is not a JSON object."""
    offset = 0
    while offset < len(data):
        if len(data) - offset < HEADER.size:
            raise ConnectError("invalid_argument", "a truncated envelope header")
        flags, length = HEADER.unpack_from(data, offset)
        offset += HEADER.size
        if length > MESSAGE_MAX:
            raise ConnectError("invalid_argument", f"an envelope is over {MESSAGE_MAX} bytes")
        if len(data) - offset < length:
            raise ConnectError("invalid_argument", "a truncated envelope")
        payload = data[offset : offset + length]
        offset += length
        if flags & FLAG_COMPRESSED:
            raise ConnectError("invalid_argument", "compressed envelopes are not accepted")
        if flags & FLAG_END:
            return
        yield parse_message(payload)


def first_message(data: bytes) -> dict[str, Any]:
    """The one message of a server-streaming call's request."""
    for message in read_envelopes(data):
        return message
    raise ConnectError("invalid_argument", "the request stream holds no message")


# Fields


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: object, field: str) -> bytes:
    """Bytes of a proto-JSON ``bytes`` field (standard or URL-safe base64, padding optional)."""
    if not isinstance(text, str):
        raise ConnectError("invalid_argument", f"{field}: must be a base64 string")
    padded = text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4)
    try:
        return base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        raise ConnectError("invalid_argument", f"{field}: not base64") from None


def text_field(message: dict[str, Any], name: str, default: str | None = None) -> str:
    value = message.get(name, default)
    if not isinstance(value, str):
        raise ConnectError("invalid_argument", f"{name}: must be a string")
    return value


def object_field(message: dict[str, Any], name: str) -> dict[str, Any]:
    value = message.get(name, {})
    if not isinstance(value, dict):
        raise ConnectError("invalid_argument", f"{name}: must be an object")
    return value


def int_field(message: dict[str, Any], name: str, default: int = 0) -> int:
    """A proto-JSON integer: a number, or a string of digits."""
    value = message.get(name, default)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConnectError("invalid_argument", f"{name}: must be an integer")
    return value


def bool_field(message: dict[str, Any], name: str) -> bool:
    value = message.get(name, False)
    if not isinstance(value, bool):
        raise ConnectError("invalid_argument", f"{name}: must be a boolean")
    return value


# Process events


def start_event(pid: int) -> bytes:
    return envelope({"event": {"start": {"pid": pid}}})


def data_event(fd: int, data: bytes, pty: bool = False) -> bytes:
    """Output of a process: ``stdout``/``stderr`` by ``fd``, or ``pty`` for a terminal's."""
    name = "pty" if pty else "stdout" if fd == 1 else "stderr"
    return envelope({"event": {"data": {name: b64(data)}}})


def end_event(exit_code: int, exited: bool, status: str, error: str | None) -> bytes:
    end: dict[str, Any] = {"exitCode": exit_code, "exited": exited, "status": status}
    if error is not None:
        end["error"] = error
    return envelope({"event": {"end": end}})


PROCESS_KEEPALIVE = envelope({"event": {"keepalive": {}}})
WATCH_KEEPALIVE = envelope({"keepalive": {}})
WATCH_START = envelope({"start": {}})


# Control-plane bodies (REST)

ENVD_VERSION = "0.5.7"
"""The envd version the front advertises: commands with stdin and ``close_stdin``,
octet-stream and gzip uploads; not write metadata (0.6.2) nor watch entries (0.6.3)."""
CLIENT_ID = "sandboxd"


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def sandbox_json(entry: "E2BSandbox", domain: str | None = None) -> dict[str, Any]:
    """The ``Sandbox`` a create or connect answers (``domain``: where its port hosts are,
    ``SANDBOXD_E2B_DOMAIN``; its ``trafficAccessToken`` opens them, docs/e2b.rst, "Ports")."""
    return {
        "templateID": entry.template,
        "sandboxID": entry.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": entry.token,
        "trafficAccessToken": entry.traffic_token,
        "domain": domain,
    }


def detail_json(config: Config, entry: "E2BSandbox") -> dict[str, Any]:
    """The ``SandboxDetail`` (and ``ListedSandbox``) of a sandbox under the replica's
    ``config`` (its limits); ``allowInternetAccess`` says whether its network mode reaches
    beyond its loopback (``egress``, ``host``)."""
    return {
        "templateID": entry.template,
        "sandboxID": entry.id,
        "clientID": CLIENT_ID,
        "startedAt": _when(entry.started_at),
        "endAt": _when(entry.end_at),
        "envdVersion": ENVD_VERSION,
        "cpuCount": max(1, math.ceil(config.cpu_cores)),
        "memoryMB": config.memory_max >> 20,
        "diskSizeMB": (config.disk_max or 0) >> 20,
        "state": "running",
        "metadata": entry.metadata,
        "allowInternetAccess": entry.sandbox.network != "none",
    }


# The code interpreter (docs/e2b.rst, "Code interpreter")

INTERPRETER_KEEPALIVE = b'{"type":"keepalive"}\n'
"""The frame of an ``/execute`` stream during silence (E2B's, every 5 s there)."""
MIME_KEYS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}
"""A MIME bundle's types → the keys of the SDK's ``Result`` (other types go in ``extra``)."""


def result_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """A MIME bundle as the SDK's ``Result`` reads it."""
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for mime, value in data.items():
        if mime in MIME_KEYS:
            fields[MIME_KEYS[mime]] = value
        else:
            extra[mime] = value
    if extra:
        fields["extra"] = extra
    return fields


def interpreter_frame(event: events.Event, timestamp: str) -> bytes:
    """One line of an ``/execute`` stream, keyed by ``type``."""
    frame: dict[str, Any]
    if isinstance(event, events.Count):
        frame = {"type": "number_of_executions", "execution_count": event.execution_count}
    elif isinstance(event, events.Output):
        frame = {"type": event.stream, "text": event.text, "timestamp": timestamp}
    elif isinstance(event, events.Result):
        frame = {"type": "result", "is_main_result": event.is_main_result}
        frame.update(result_fields(event.data))
    elif isinstance(event, events.Error):
        traceback = "\n".join(event.traceback)
        frame = {"type": "error", "name": event.name, "value": event.value, "traceback": traceback}
    else:
        frame = {"type": "end_of_execution"}
    return json.dumps(frame).encode() + b"\n"
