"""envd's ``/files`` upload bodies: the files of an upload.

An upload is ``multipart/form-data`` (one part per file, named by its ``filename``; a single
file may be named by the ``path`` query instead) or, from envd 0.5.7, the raw bytes of one
file (``application/octet-stream``, optionally ``Content-Encoding: gzip``) named by ``path``.
Gzip bodies are decompressed in memory up to a bound (:data:`INFLATE_MAX`).
"""

import io
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from twisted.web.iweb import IRequest

from sandboxd.e2b import wire
from sandboxd.e2b.paths import Place, place_of
from sandboxd.e2b.wire import RestError

INFLATE_MAX = 1 << 30
"""Bytes a gzip upload may inflate to."""


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


def _boundary(content_type: str) -> bytes:
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


def multipart_files(body: bytes, content_type: str) -> list[tuple[str | None, bytes]]:
    """The ``(filename, bytes)`` of each part of a ``multipart/form-data`` body."""
    delimiter = b"--" + _boundary(content_type)
    sections = body.split(delimiter)
    if len(sections) < 3 or not sections[-1].startswith(b"--"):
        raise RestError(400, "a malformed multipart body")
    found = []
    for section in sections[1:-1]:
        if not section.startswith(b"\r\n") or not section.endswith(b"\r\n"):
            raise RestError(400, "a malformed multipart part")
        headers, separator, data = section[2:-2].partition(b"\r\n\r\n")
        if not separator:
            raise RestError(400, "a multipart part without headers")
        found.append((_filename(headers), data))
    return found


def inflate(data: bytes, limit: int = INFLATE_MAX) -> bytes:
    """The bytes a gzip body holds, every member of it in turn (as ``gzip -d`` reads a file
    of several): ``400`` if it is corrupt, cut short or followed by anything but zero
    padding, ``413`` past ``limit`` bytes."""
    out = bytearray()
    rest = data
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += inflater.decompress(rest, limit + 1 - len(out))
        except zlib.error as e:
            raise RestError(400, f"the gzip body is corrupt: {e}") from None
        if len(out) > limit:
            raise RestError(413, f"the gzip body inflates past {limit} bytes")
        if not inflater.eof:
            raise RestError(400, "the gzip body is truncated")
        rest = inflater.unused_data
        if not rest.strip(b"\0"):
            return bytes(out)


def parts(request: IRequest) -> Iterator[tuple[Place, BinaryIO]]:
    """Each file of the upload: where it goes, and its bytes."""
    content_type = (request.getHeader(b"content-type") or b"").decode("latin-1")
    content = request.content
    content.seek(0)
    path = query(request, "path")
    if content_type.lower().startswith("multipart/form-data"):
        found = multipart_files(content.read(), content_type)
        if path is not None and len(found) == 1:
            found = [(path, found[0][1])]
        for name, data in found:
            yield _place(name), io.BytesIO(data)
        return
    if (request.getHeader(b"content-encoding") or b"").lower() == b"gzip":
        yield _place(path), io.BytesIO(inflate(content.read()))
        return
    yield _place(path), content
