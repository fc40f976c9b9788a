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
    Exited,
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


EXIT_PART = 3 << 18
"""Bytes of kept output encoded at a time in an exit frame (a multiple of 3, so that the
parts' base64 joins into the whole's): a megabyte of base64 each."""


def final_frame_parts(outcome: Outcome) -> Iterator[bytes]:
    """The final frame of an exec stream, :func:`final_frame` as :func:`frame_line` writes it,
    in parts whose concatenation is that line.

    An exit frame carries up to ``max_output`` of stdout and of stderr in base64: each part
    is encoded from the kept bytes as it is asked for, a megabyte of base64 at a time, so
    the writer that takes them as the connection does never holds the line whole, nor
    spends one long turn of the reactor on it.
    """
    if not isinstance(outcome, Exited):
        yield frame_line(final_frame(outcome))
        return
    marks = b"".join(
        b',"%s":true' % key
        for key, value in ((b"truncated", outcome.truncated), (b"oom_killed", outcome.oom_killed))
        if value
    )
    yield b'{"exit":%d,"out":"' % outcome.code
    yield from _base64_parts(outcome.out)
    yield b'","err":"'
    yield from _base64_parts(outcome.err)
    yield b'"%s}\n' % marks


def _base64_parts(data: bytes) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(view), EXIT_PART):
        yield pybase64.b64encode(view[start : start + EXIT_PART])


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
