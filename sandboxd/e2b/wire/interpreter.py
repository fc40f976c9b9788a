"""The code interpreter's frames (docs/e2b.rst, "Code interpreter"): one JSON line per event
of an ``/execute`` stream, keyed by ``type``, as the ``e2b-code-interpreter`` SDK reads them."""

import json
from collections.abc import Mapping
from typing import Any

from sandboxd.core import context_events as events

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
