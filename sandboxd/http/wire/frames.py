"""The NDJSON frames of the HTTP front's streams (docs/contract.rst, docs/extensions.rst): the
exec stream's (its exit frame written in parts), a background process's output and the
workspace watch."""

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pybase64

from sandboxd.core import (
    STDERR,
    Chunk,
    Dropped,
    Ended,
    Outcome,
    ReaderEvent,
    SandboxGone,
    SpawnFailed,
    context_events,
)
from sandboxd.errors import SandboxdError
from sandboxd.http.wire.errors import status_and_type
from sandboxd.web import follow

# NDJSON frames of the exec stream

KEEPALIVE_FRAME = b'{"o":""}\n'
"""The frame sent while a command is silent (an empty live chunk)."""


def output_frame(data: bytes, key: bytes = b"o") -> bytes:
    """The NDJSON line of one live output chunk (``pybase64``: SIMD, much faster than
    ``base64`` for bulk output); ``key`` ``b"e"`` marks stderr (``split: true``)."""
    return b"".join((b'{"', key, b'":"', pybase64.b64encode(data), b'"}\n'))


def error_frame(kind: str, detail: str) -> bytes:
    """The in-band error frame ending an exec stream whose status line is already sent."""
    return frame_line({"error": kind, "detail": detail})


def in_band_error(error: BaseException) -> bytes:
    """The in-band error frame for a failure while running exec."""
    kind = status_and_type(error)[1] if isinstance(error, SandboxdError) else type(error).__name__
    return error_frame(kind, str(error))


def frame_line(frame: Mapping[str, Any]) -> bytes:
    """Any NDJSON line, as compact ``json.dumps``."""
    return json.dumps(frame, separators=(",", ":")).encode() + b"\n"


def final_frame(outcome: Outcome) -> dict[str, Any]:
    """The last frame of an exec stream for how the command ended."""
    if isinstance(outcome, SpawnFailed):
        return {"error": "SpawnFailed", "detail": outcome.detail}
    frame: dict[str, Any] = {
        "exit": outcome.code,
        "out": pybase64.b64encode_as_string(outcome.out),
        "err": pybase64.b64encode_as_string(outcome.err),
    }
    if outcome.truncated:
        frame["truncated"] = True
    if outcome.oom_killed:
        frame["oom_killed"] = True  # the sandbox reached SANDBOXD_MEMORY_MAX meanwhile
    return frame


_BASE64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_EXIT_KEYS = ["exit", "out", "err"]
_EXIT_MARKS = ("truncated", "oom_killed")
"""Keys an exit frame may carry after its output, each ``true`` or ``false``."""

PART_SIZE = 1 << 20
"""Bytes of an exit frame's base64 checked, encoded and written at a time."""


def _is_base64_text(value: object) -> bool:
    """``value`` is base64 text (which JSON writes as is), checked a megabyte at a time
    (``bytes.translate`` allocates a result as large as its input)."""
    if not isinstance(value, str) or not value.isascii():
        return False
    for start in range(0, len(value), PART_SIZE):
        if value[start : start + PART_SIZE].encode("ascii").translate(None, _BASE64):
            return False
    return True


def _slices(text: str) -> Iterator[bytes]:
    for start in range(0, len(text), PART_SIZE):
        yield text[start : start + PART_SIZE].encode("ascii")


def frame_parts(frame: Mapping[str, Any]) -> Iterator[bytes]:
    """An NDJSON line, in parts whose concatenation is the line.

    The exit frame carries up to ``max_output`` of output in base64: its parts are the very
    bytes ``json.dumps`` gives, its buffers a megabyte at a time, encoded as they are asked
    for. Written as the connection takes them, the line is never held whole as bytes, nor
    copied whole into the connection's buffer.
    """
    keys = list(frame)
    marks = keys[3:]
    if (
        keys[:3] == _EXIT_KEYS
        and type(frame["exit"]) is int
        and all(key in _EXIT_MARKS and type(frame[key]) is bool for key in marks)
    ):
        out, err = frame["out"], frame["err"]
        if _is_base64_text(out) and _is_base64_text(err):
            tail = b'"%s}\n' % b"".join(
                b',"%s":%s' % (key.encode(), b"true" if frame[key] else b"false") for key in marks
            )
            yield b'{"exit":%d,"out":"' % frame["exit"]
            yield from _slices(out)
            yield b'","err":"'
            yield from _slices(err)
            yield tail
            return
    yield frame_line(frame)


# Background processes (docs/extensions.rst, "Background processes")

STREAM_KEEPALIVE_FRAME = follow.KEEPALIVE_FRAME
"""The frame a process-output or watch stream sends while it has nothing to say (the followed
stream's own, ``{}``)."""


def reader_frame(event: ReaderEvent) -> bytes:
    """The NDJSON line of one reader event (``b""`` for a reader that caught up: its
    stream simply ends)."""
    if isinstance(event, Chunk):
        key = b"e" if event.fd == STDERR else b"o"
        return b"".join(
            (b'{"', key, b'":"', pybase64.b64encode(event.data), b'","at":%d}\n' % event.at)
        )
    if isinstance(event, Dropped):
        return b'{"dropped":%d}\n' % event.count
    if isinstance(event, Ended):
        if event.code is None:
            return error_frame("SpawnFailed", event.detail)
        return b'{"exit":%d}\n' % event.code
    if isinstance(event, SandboxGone):
        return error_frame("SandboxNotFound", "the sandbox was killed")
    return b""


# Workspace watch (docs/extensions.rst, "Workspace watch")


def watch_frame(event: str, path: str | None = None, is_dir: bool = False) -> bytes:
    """One change under a watched root (``overflow`` has no path)."""
    if path is None:
        return frame_line({"event": event})
    return frame_line({"event": event, "path": path, "dir": is_dir})


# Contexts (docs/extensions.rst, "Contexts")


def context_frame(event: context_events.Event) -> bytes:
    """One NDJSON line of ``POST /contexts/{cid}/run``, keyed by ``type``."""
    frame: dict[str, Any]
    if isinstance(event, context_events.Count):
        frame = {"type": "count", "execution_count": event.execution_count}
    elif isinstance(event, context_events.Output):
        frame = {"type": event.stream, "text": event.text}
    elif isinstance(event, context_events.Result):
        frame = {"type": "result", "is_main_result": event.is_main_result, "data": event.data}
    elif isinstance(event, context_events.Error):
        frame = {
            "type": "error",
            "name": event.name,
            "value": event.value,
            "traceback": list(event.traceback),
        }
    else:
        frame = {"type": "end"}
    return json.dumps(frame, separators=(",", ":")).encode() + b"\n"


# Terminals (docs/extensions.rst, "Terminals")


def terminal_end_message(event: ReaderEvent) -> str:
    """The last text message of a terminal's WebSocket: how it ended (``{"exit": CODE}``,
    ``{"error": ...}`` for one that never started or whose sandbox was killed)."""
    if isinstance(event, Ended) and event.code is not None:
        return json.dumps({"exit": event.code})
    if isinstance(event, Ended):
        return json.dumps({"error": "SpawnFailed", "message": event.detail})
    return json.dumps({"error": "SandboxNotFound", "message": "the sandbox was killed"})
