"""Decoding the streams that follow a background process's output and a workspace watch."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from ._errors import error_from_frame
from ._ndjson import DEFAULT_MAX_LINE, LineSplitter
from ._types import OutputChunk, ProcessOutput, ProtocolError, SandboxNotFound, WatchEvent

STREAMS = {"o": "stdout", "e": "stderr"}


def _frame(line: bytes) -> dict[str, Any]:
    try:
        frame = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError(f"not an NDJSON frame: {line[:80]!r}") from None
    if not isinstance(frame, dict):
        raise ProtocolError(f"not an NDJSON object: {line[:80]!r}")
    return frame


class OutputDecoder:
    """Feeds the frames of ``GET …/processes/{id}/output`` to ``on_output``."""

    def __init__(
        self,
        offset: int,
        on_output: Callable[[OutputChunk], object] | None,
        max_line: int = DEFAULT_MAX_LINE,
    ) -> None:
        self.offset = offset
        self.on_output = on_output
        self.dropped = 0
        self.exit_code: int | None = None
        self.ended = False
        self._lines = LineSplitter(max_line)

    def feed(self, data: bytes) -> None:
        for line in self._lines.feed(data):
            self._take(_frame(line))

    def _take(self, frame: dict[str, Any]) -> None:
        if self.ended:
            raise ProtocolError("a frame after the end of a process output stream")
        for key, stream in STREAMS.items():
            if key in frame:
                chunk = _chunk(frame, key, stream)
                self.offset = chunk.end
                if self.on_output is not None:
                    self.on_output(chunk)
                return
        if "dropped" in frame:
            count = frame["dropped"]
            if type(count) is not int or count < 0:
                raise ProtocolError(f"bad dropped frame: {frame!r}")
            self.dropped += count
            self.offset += count
        elif "exit" in frame:
            if type(frame["exit"]) is not int:
                raise ProtocolError(f"bad exit frame: {frame!r}")
            self.exit_code = frame["exit"]
            self.ended = True
        elif "error" in frame:
            raise error_from_frame(frame.get("error"), frame.get("detail"))

    def finish(self, follow: bool) -> ProcessOutput:
        """The result once the stream ended; a following read that ended without an exit
        frame lost its replica (``SandboxNotFound``)."""
        if follow and not self.ended:
            raise SandboxNotFound("the process output stream ended without an exit frame")
        return ProcessOutput(self.exit_code, self.offset, self.dropped)


def _chunk(frame: dict[str, Any], key: str, stream: str) -> OutputChunk:
    at = frame.get("at")
    if type(at) is not int:
        raise ProtocolError(f"output frame without an offset: {frame!r}")
    try:
        data = base64.b64decode(frame[key], validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ProtocolError(f"output frame is not base64: {frame!r}") from None
    return OutputChunk(stream, data, at)


class WatchDecoder:
    """Feeds the frames of ``GET …/watch`` to ``on_event`` (keepalives skipped)."""

    def __init__(
        self, on_event: Callable[[WatchEvent], object], max_line: int = DEFAULT_MAX_LINE
    ) -> None:
        self.on_event = on_event
        self._lines = LineSplitter(max_line)

    def feed(self, data: bytes) -> None:
        for line in self._lines.feed(data):
            frame = _frame(line)
            if "error" in frame:
                raise error_from_frame(frame.get("error"), frame.get("detail"))
            event = frame.get("event")
            if event is None:
                continue  # keepalive
            path = frame.get("path")
            if not isinstance(event, str) or not (path is None or isinstance(path, str)):
                raise ProtocolError(f"bad watch frame: {frame!r}")
            self.on_event(WatchEvent(event, path, bool(frame.get("dir", False))))
