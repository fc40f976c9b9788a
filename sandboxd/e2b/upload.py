"""envd's ``/files`` upload bodies, read as streams: the files of an upload.

An upload is ``multipart/form-data`` (one part per file, named by its ``filename``, or by the
``path`` query: then every part goes there, and a second one is refused as envd refuses it) or,
from envd 0.5.7, the raw bytes of one file (``application/octet-stream``, optionally
``Content-Encoding: gzip``) named by ``path``.

The body is stored whole before the route runs (past a size, spooled to disk:
:mod:`sandboxd.web.spool`). An :class:`Upload` reads it from there a chunk at a time, in the
file thread that writes each file (never on the reactor, never whole in memory): a multipart
body's parts one after another (:class:`MultipartReader`), each copied to its target as it is
read; a gzip body inflated as it is copied (:class:`Inflating`), to at most
:func:`inflate_limit` bytes (see docs/e2b.rst, "Coverage"). A spooled body's space is given back
as it is read (:class:`~sandboxd.e2b.consumed.Consumed`): it is spooled under the sandbox's disk
limit, and would otherwise count twice against it while its files are written.
"""

import io
import zlib
from collections.abc import Iterator
from typing import Any, Protocol

from attrs import define, frozen
from twisted.web.iweb import IRequest

from sandboxd.core import Source
from sandboxd.e2b import wire
from sandboxd.e2b.consumed import Consumed
from sandboxd.e2b.paths import Place, place_of
from sandboxd.e2b.wire import RestError
from sandboxd.web.body import TooLarge, refuse_too_large
from sandboxd.web.spool import Spool

READ_CHUNK = 1 << 20
"""Bytes of the stored body read at a time (what an upload holds in memory, about)."""
HEADERS_MAX = 16 << 10
"""Bytes a multipart part's headers may take."""
FILES_MAX = 10_000
"""Files one multipart upload may hold: what is kept of each (its place, to refuse a second
file to it, and its line of the answer) is a few hundred bytes, ~6 times a part's least."""
INFLATE_RATIO_MAX = 100
"""A gzip body inflates to at most this many times its own size (a zip bomb's is ~1000)..."""
INFLATE_FLOOR = 16 << 20
"""... or to this many bytes, whatever its size (a small body of a very compressible file)."""


class Stored(Protocol):
    """A stored request body: read from its start (its file, or memory)."""

    def read(self, size: int = -1, /) -> bytes: ...

    def seek(self, offset: int, whence: int = 0, /) -> int: ...


def query(request: IRequest, name: str) -> str | None:
    values = (request.args or {}).get(name.encode())
    return values[0].decode("utf-8", "replace") if values else None


def _place(path: str | None) -> Place:
    if not path:
        raise RestError(400, "path: required")
    try:
        return place_of(path)
    except wire.ConnectError as e:
        raise RestError(400, e.message) from None


def boundary_of(content_type: str) -> bytes:
    for item in content_type.split(";")[1:]:
        key, _, value = item.strip().partition("=")
        if key.lower() == "boundary" and value:
            return value.strip('"').encode()
    raise RestError(400, "multipart/form-data without a boundary")


def _filename(headers: bytes) -> str | None:
    for line in headers.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() != b"content-disposition":
            continue
        for item in value.decode("utf-8", "replace").split(";")[1:]:
            key, _, text = item.strip().partition("=")
            if key == "filename":
                return text.strip('"')
    return None


def inflate_limit(compressed: int, size_max: int) -> int:
    """The most a gzip body of ``compressed`` bytes may inflate to: :data:`INFLATE_RATIO_MAX`
    times its size (at least :data:`INFLATE_FLOOR`), and never past ``size_max``."""
    return min(size_max, max(INFLATE_RATIO_MAX * compressed, INFLATE_FLOOR))


class Inflating:
    """The bytes the gzip stream ``source`` holds, inflated as they are read: every member
    in turn (as ``gzip -d`` reads a file of several), zero padding at the end ignored.

    :meth:`read` raises ``400`` if the stream is corrupt, cut short or followed by anything
    but zero padding, ``413`` once more than ``limit`` bytes come out of it; it holds at most
    one read of ``source`` and one of its own result in memory.
    """

    def __init__(self, source: Source, limit: int) -> None:
        self.source = source
        self.limit = limit
        self.inflated = 0
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._input = b""
        self._held = False  # the last call was cut short by its bound: output may be held

    def read(self, size: int = -1, /) -> bytes:
        """At most ``size`` inflated bytes (``b""`` at the end)."""
        wanted = size if size > 0 else READ_CHUNK
        while True:
            inflater = self._inflater
            if inflater.eof:
                if not self._next_member(inflater.unused_data):
                    return b""
                continue
            data, self._input = inflater.unconsumed_tail or self._input, b""
            if not data and not self._held:
                data = self.source.read(READ_CHUNK)
                if not data:
                    raise RestError(400, "the gzip body is truncated")
            room = min(wanted, self.limit + 1 - self.inflated)
            try:
                out = inflater.decompress(data, room)
            except zlib.error as e:
                raise RestError(400, f"the gzip body is corrupt: {e}") from None
            self._held = len(out) == room
            self.inflated += len(out)
            if self.inflated > self.limit:
                raise RestError(
                    413,
                    f"the gzip body inflates past {self.limit} bytes, the most it may "
                    f"(at most {INFLATE_RATIO_MAX} times its size, within SANDBOXD_MAX_BODY and "
                    "the sandbox's disk limit)",
                )
            if out:
                return out

    def _next_member(self, rest: bytes) -> bool:
        """Start the member that follows (``False``: only zero padding is left)."""
        while not rest.strip(b"\0"):
            rest = self.source.read(READ_CHUNK)
            if not rest:
                return False
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._input, self._held = rest, False
        return True


@frozen
class Part:
    """A part of a multipart body: its ``filename`` (``None``: none given), its bytes read
    from its reader up to the next delimiter."""

    filename: str | None
    reader: "MultipartReader"

    def read(self, size: int = -1, /) -> bytes:
        """At most ``size`` bytes of the part (``b""`` at its end)."""
        return self.reader.read_part(size if size > 0 else READ_CHUNK)


class MultipartReader:
    """The parts of a ``multipart/form-data`` body read from ``source`` a chunk at a time,
    one after another: :meth:`next_part` skips what is left of the part before.

    A body cut short, without a part, or with a part whose headers are missing or over
    :data:`HEADERS_MAX` bytes is ``400``. What follows the closing delimiter is ignored.
    """

    def __init__(self, source: Source, boundary: bytes) -> None:
        self.source = source
        self.delimiter = b"\r\n--" + boundary
        self._buffer = bytearray(b"\r\n")  # the first delimiter has no line break before it
        self._in_part = True  # the preamble: skipped as a part is
        self._parts = 0
        self._ended = False

    def _more(self) -> bool:
        data = self.source.read(READ_CHUNK)
        self._buffer += data
        return bool(data)

    def read_part(self, size: int) -> bytes:
        """At most ``size`` bytes of the current part, ``b""`` once its delimiter is read."""
        buffer = self._buffer
        while self._in_part:
            found = buffer.find(self.delimiter)
            if found == 0:
                del buffer[: len(self.delimiter)]
                self._in_part = False
                break
            # Bytes that cannot be the start of a delimiter are the part's.
            ready = found if found > 0 else len(buffer) - len(self.delimiter) + 1
            if ready > 0:
                out = bytes(buffer[: min(ready, size)])
                del buffer[: len(out)]
                return out
            if not self._more():
                raise RestError(400, "a malformed multipart body (cut short)")
        return b""

    def next_part(self) -> Part | None:
        """The next part, its headers read (``None`` after the closing delimiter)."""
        while self.read_part(READ_CHUNK):
            pass  # what the last part's reader left
        if self._ended:
            return None
        buffer = self._buffer
        while len(buffer) < 2 and self._more():
            pass
        if buffer.startswith(b"--"):
            self._ended = True
            if not self._parts:
                raise RestError(400, "a multipart body without a part")
            return None
        if not buffer.startswith(b"\r\n"):
            raise RestError(400, "a malformed multipart part")
        bound = HEADERS_MAX + 4  # the line break before them, their blank line after
        while (end := buffer.find(b"\r\n\r\n", 0, bound)) < 0:
            if len(buffer) >= bound:
                raise RestError(400, f"a multipart part's headers are over {HEADERS_MAX} bytes")
            if not self._more():
                raise RestError(400, "a multipart part without headers")
        headers = bytes(buffer[2:end])
        if self.delimiter in b"\r\n" + headers:
            raise RestError(400, "a multipart part without headers")
        del buffer[: end + 4]
        self._in_part = True
        self._parts += 1
        return Part(_filename(headers), self)


def check_stored(request: IRequest, max_body: int) -> None:
    """Refuse a body that was not stored whole: over ``max_body`` (``413``), or that could
    not be written (``507`` for want of space)."""
    try:
        refuse_too_large(request, max_body)
    except TooLarge as e:
        raise RestError(413, f"{e.detail} (SANDBOXD_MAX_BODY)") from None


@define
class Upload:
    """The files of an upload, each taken in turn by :meth:`next_file` (in a file thread: it
    reads the stored body) and read from there by the write of that file."""

    content_type: str
    gzip: bool
    path: str | None
    body: Stored
    size_max: int
    """The most an upload's file may hold (the gzip bound: :func:`inflate_limit`)."""
    _files: Iterator[tuple[Place, Source]] | None = None

    @classmethod
    def of(cls, request: IRequest, size_max: int) -> "Upload":
        content_type = (request.getHeader(b"content-type") or b"").decode("latin-1")
        gzip = (request.getHeader(b"content-encoding") or b"").lower() == b"gzip"
        content: Any = request.content
        if isinstance(content, Spool):
            content = Consumed(content)  # its space given back as its files are written
        return cls(content_type, gzip, query(request, "path"), content, size_max)

    def next_file(self) -> tuple[Place, Source] | None:
        """Where the next file goes, and its bytes (``None``: no more files)."""
        if self._files is None:
            self._files = self._each_file()
        return next(self._files, None)

    def _each_file(self) -> Iterator[tuple[Place, Source]]:
        self.body.seek(0)
        if self.content_type.lower().startswith("multipart/form-data"):
            yield from self._parts(MultipartReader(self.body, boundary_of(self.content_type)))
            return
        source: Source = self.body
        if self.gzip:
            compressed = self.body.seek(0, io.SEEK_END)
            self.body.seek(0)
            source = Inflating(self.body, inflate_limit(compressed, self.size_max))
        yield _place(self.path), source

    def _parts(self, reader: MultipartReader) -> Iterator[tuple[Place, Source]]:
        places: set[Place] = set()
        while (part := reader.next_part()) is not None:
            place = _place(self.path if self.path is not None else part.filename)
            if place in places:
                raise RestError(
                    400,
                    f"you cannot upload multiple files to the same path '{place.display}' in "
                    "one upload request, only the first specified file was uploaded",
                )
            if len(places) == FILES_MAX:
                raise RestError(
                    400,
                    f"an upload holds at most {FILES_MAX} files: the first {FILES_MAX} were "
                    "uploaded, send the rest in another",
                )
            places.add(place)
            yield place, part
