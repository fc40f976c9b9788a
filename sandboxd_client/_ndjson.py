"""
Incremental NDJSON line splitting.

The exec stream arrives in arbitrary chunks: a frame may be split at any byte, many frames may
share a chunk, and a final frame carrying the whole stdout may be megabytes long. ``LineSplitter``
keeps the unfinished tail as a list of pieces (no quadratic re-concatenation), scans only new
bytes for newlines, and enforces a maximum line length so a hostile server cannot make the
client buffer without limit.
"""

from __future__ import annotations

from ._types import ProtocolError

DEFAULT_MAX_LINE = 1 << 30


class LineSplitter:
    """Feed raw bytes, get back complete lines (without the newline, ``\\r`` stripped)."""

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        self._max_line = max_line
        self._pending: list[bytes] = []
        self._pending_len = 0

    @property
    def pending(self) -> int:
        """How many bytes of an unfinished line are buffered."""
        return self._pending_len

    def feed(self, data: bytes) -> list[bytes]:
        """
        Add ``data``; return every line it completes, in order. Empty lines are dropped.

        Raises ``ProtocolError`` once an unfinished line grows past ``max_line`` bytes.
        """
        lines: list[bytes] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            piece = data[start:nl]
            if self._pending:
                self._pending.append(piece)
                piece = b"".join(self._pending)
                self._pending = []
                self._pending_len = 0
            self._check(len(piece))
            piece = piece.rstrip(b"\r")
            if piece.strip():
                lines.append(piece)
            start = nl + 1
        if start < len(data):
            rest = data[start:]
            self._pending.append(rest)
            self._pending_len += len(rest)
            self._check(self._pending_len)
        return lines

    def flush(self) -> bytes:
        """Return (and forget) the unfinished tail: the last line if it had no newline."""
        tail = b"".join(self._pending).rstrip(b"\r")
        self._pending = []
        self._pending_len = 0
        return tail

    def _check(self, length: int) -> None:
        if length > self._max_line:
            raise ProtocolError(f"NDJSON line longer than {self._max_line} bytes")
