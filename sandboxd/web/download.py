"""A download's body: exactly the bytes its ``Content-Length`` announced, whatever the file
does while it is sent (the native front's ``GET …/file`` and the E2B front's ``GET /files``)."""

from typing import BinaryIO

from twisted.protocols.basic import FileSender
from twisted.web.iweb import IRequest

from sandboxd.web.answers import OCTETS

DOWNLOAD_CHUNK = 1 << 18
"""Bytes a download reads and sends at a time (``FileSender`` reads 16 KiB)."""


class BoundedReader:
    """Reads at most ``remaining`` bytes of ``source``: a download sends exactly the
    ``Content-Length`` it announced, even when the sandbox appends to the file meanwhile
    (more bytes would be taken for the next answer on a kept-alive connection)."""

    def __init__(self, source: BinaryIO, remaining: int) -> None:
        self.source = source
        self.remaining = remaining

    def read(self, size: int) -> bytes:
        data = self.source.read(min(size, self.remaining)) if self.remaining > 0 else b""
        self.remaining -= len(data)
        return bytes(data)


async def send_file(request: IRequest, source: BinaryIO, length: int) -> None:
    """Answer the ``length`` bytes of ``source`` (an open file, its size when opened) as
    ``application/octet-stream`` with that ``Content-Length``. A file that grew is cut at
    ``length``; one that shrank cannot meet the promise, so the connection ends (a truncated
    answer for the client, never a hang). The caller closes ``source``."""
    request.setHeader(b"content-type", OCTETS)
    request.setHeader(b"content-length", str(length).encode())
    bounded = BoundedReader(source, length)
    sender = FileSender()
    sender.CHUNK_SIZE = DOWNLOAD_CHUNK
    await sender.beginFileTransfer(bounded, request)
    if bounded.remaining:
        request.loseConnection()  # type: ignore[attr-defined]
