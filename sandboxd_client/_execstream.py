"""
Decoding the exec NDJSON stream (docs/contract.rst, "The exec stream") into live output and
one ``ExecResult``.

Frames, one JSON object per line:

- ``{"o": base64}``: a live chunk (stdout and stderr interleaved); keepalives are ``{"o": ""}``
  and are not forwarded;
- ``{"e": base64}``: a live stderr chunk (only when the request asked ``split: true``, and
  ``{"o": …}`` then carries stdout alone);
- ``{"exit": int, "out": base64, "err": base64, "truncated"?: bool}``: the final result;
- ``{"error": type, "detail": msg}``: the host failed while running the command.

The decoder is pure (no I/O, no reactor): feed it bytes in any split and it behaves the same.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable

import pybase64

from ._errors import error_from_frame
from ._ndjson import DEFAULT_MAX_LINE, LineSplitter
from ._types import ExecResult, ProtocolError, SandboxNotFound

OutputCallback = Callable[[bytes], object]


def _b64(frame: dict[str, object], key: str) -> bytes:
    value = frame.get(key, "")
    if value is None:
        return b""
    if not isinstance(value, str):
        raise ProtocolError(f"exec frame field {key!r} is not a base64 string")
    try:
        return pybase64.b64decode(value, validate=True)
    except ValueError:  # binascii.Error, or text that is not ASCII
        raise ProtocolError(f"exec frame field {key!r} is not valid base64") from None


_LIVE_HEAD = b'{"o":"'
_LIVE_TAIL = b'"}'
_EXIT_HEAD = b'{"exit":'
_EXIT_TAILS = {b'"}': False, b'","truncated":false}': False, b'","truncated":true}': True}
_JSON_INT = re.compile(rb"-?(?:0|[1-9][0-9]*)")


def _plain_base64(line: memoryview) -> bytes | None:
    """``line`` decoded when it is strict base64 (no whitespace, no escapes), else ``None``."""
    try:
        return pybase64.b64decode(line, validate=True)
    except ValueError:
        return None


def fast_live_chunk(line: bytes) -> bytes | None:
    """The chunk of a live frame written exactly as the host writes it, ``{"o":"<base64>"}``;
    ``None`` for any other line (which JSON then decodes, to the same result).

    Plain base64 holds no quote and no backslash, so such a line is one JSON string, as is:
    slicing it out and decoding it skips ``json.loads`` and two copies of the chunk.
    """
    if line.startswith(_LIVE_HEAD) and line.endswith(_LIVE_TAIL):
        return _plain_base64(memoryview(line)[len(_LIVE_HEAD) : -len(_LIVE_TAIL)])
    return None


def fast_exit(line: bytes) -> ExecResult | None:
    """The result of an exit frame written exactly as the host writes it,
    ``{"exit":N,"out":"<base64>","err":"<base64>"}`` with an optional ``"truncated"``;
    ``None`` for any other line (which JSON then decodes, to the same result).

    The exit frame carries the whole kept output (megabytes): found by its quotes and decoded
    in place, it is never turned into text and back.
    """
    if not line.startswith(_EXIT_HEAD):
        return None
    out_key = line.find(b',"out":"', len(_EXIT_HEAD))
    if out_key < 0 or not _JSON_INT.fullmatch(line, len(_EXIT_HEAD), out_key):
        return None
    out_start = out_key + len(b',"out":"')
    out_end = line.find(b'"', out_start)
    if out_end < 0 or not line.startswith(b'","err":"', out_end):
        return None
    err_start = out_end + len(b'","err":"')
    err_end = line.find(b'"', err_start)
    if err_end < 0 or line[err_end:] not in _EXIT_TAILS:
        return None
    view = memoryview(line)
    out = _plain_base64(view[out_start:out_end])
    err = _plain_base64(view[err_start:err_end])
    if out is None or err is None:
        return None
    code = int(line[len(_EXIT_HEAD) : out_key])
    return ExecResult(code, out, err, _EXIT_TAILS[line[err_end:]])


class ExecStreamDecoder:
    """
    Incremental exec-stream decoder.

    ``feed`` calls ``on_output`` synchronously for every non-empty ``o`` chunk (``on_stderr``
    for every ``e`` chunk), in order, and
    lets its exceptions propagate (the caller then drops the stream). Frames after the final
    ``exit``/``error`` frame are ignored, as are unknown fields.
    """

    def __init__(
        self,
        on_output: OutputCallback | None,
        max_line: int = DEFAULT_MAX_LINE,
        on_stderr: OutputCallback | None = None,
    ):
        self._on_output = on_output
        self._on_stderr = on_stderr
        self._lines = LineSplitter(max_line)
        self._result: ExecResult | None = None
        self._error: Exception | None = None

    @property
    def done(self) -> bool:
        """True once the final ``exit`` or ``error`` frame has been decoded."""
        return self._result is not None or self._error is not None

    def feed(self, data: bytes) -> None:
        """Decode every frame ``data`` completes. ``ProtocolError`` for a malformed frame."""
        for line in self._lines.feed(data):
            if not self.done:
                self._frame(line)

    def _frame(self, line: bytes) -> None:
        chunk = fast_live_chunk(line)
        if chunk is not None:
            if chunk and self._on_output is not None:
                self._on_output(chunk)
            return
        result = fast_exit(line)
        if result is not None:
            self._result = result
            return
        try:
            frame = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            raise ProtocolError(f"exec stream frame is not JSON: {line[:80]!r}") from None
        if not isinstance(frame, dict):
            raise ProtocolError(f"exec stream frame is not an object: {line[:80]!r}")
        if "exit" in frame:
            code = frame["exit"]
            truncated = frame.get("truncated", False)
            if isinstance(code, bool) or not isinstance(code, int):
                raise ProtocolError(f"exec exit code is not an integer: {code!r}")
            if not isinstance(truncated, bool):
                raise ProtocolError(f"exec 'truncated' is not a boolean: {truncated!r}")
            self._result = ExecResult(code, _b64(frame, "out"), _b64(frame, "err"), truncated)
        elif "error" in frame:
            self._error = error_from_frame(frame["error"], frame.get("detail"))
        elif "o" in frame:
            chunk = _b64(frame, "o")
            if chunk and self._on_output is not None:
                self._on_output(chunk)
        elif "e" in frame:
            chunk = _b64(frame, "e")
            if chunk and self._on_stderr is not None:
                self._on_stderr(chunk)

    def finish(self) -> ExecResult:
        """
        The result once the stream has ended.

        Raises the mapped exception of an ``error`` frame, or ``SandboxNotFound`` when the
        stream ended with neither (the replica died; delivered chunks stay delivered).
        """
        tail = self._lines.flush()
        if tail.strip() and not self.done:
            # A last frame sent without its newline counts; one cut off mid-frame means the
            # replica died, which is reported below.
            with contextlib.suppress(ProtocolError):
                self._frame(tail)
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise SandboxNotFound("exec stream ended without an exit frame: the replica died")
        return self._result
