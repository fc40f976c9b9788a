"""Connect-RPC with the JSON codec, as the E2B front speaks it (docs/e2b.rst): its content
types, JSON messages, envelopes, the fields of a message, and the events of a process stream."""

import base64
import binascii
import json
import struct
from collections.abc import Iterator
from typing import Any

from sandboxd.e2b.wire.errors import ConnectError, error_json

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


# Envelopes


def envelope(message: Any, flags: int = 0) -> bytes:
    payload = body(message)
    return HEADER.pack(flags, len(payload)) + payload


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
