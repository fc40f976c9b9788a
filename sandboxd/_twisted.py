"""Every use the daemon makes of Twisted's private API, in one place.

Each was checked against Twisted 26.10.0 (the version ``tests/run`` installs) and is pinned by
``tests/unit/test_unit_twisted.py``: an upgrade that removes or renames one fails there first,
by name, not somewhere deep in a stream.
"""

from collections.abc import Callable
from typing import Any

from twisted.internet.process import ProcessReader
from twisted.web.http import HTTPChannel

CHECKED_AGAINST = "26.10.0"


def output_readers(process: object) -> list[ProcessReader]:
    """The readers of a spawned process's output pipes.

    ``twisted.internet.process.Process.pipes`` (private: a dict of child fd → reader).
    """
    pipes: dict[int, object] = getattr(process, "pipes", {})
    return [reader for reader in pipes.values() if isinstance(reader, ProcessReader)]


def replace_read(reader: ProcessReader, read: Callable[[], object]) -> None:
    """Make ``reader`` read with ``read`` (``ProcessReader.doRead``, which returns a
    ``CONNECTION_DONE``/``CONNECTION_LOST`` reason or ``None``, as ``fdesc.readFromFD``)."""
    reader.doRead = read  # type: ignore[method-assign]


def set_socket_sizes(transport: Any, read: int, send: int) -> None:
    """Read up to ``read`` and hand the kernel up to ``send`` bytes at a time on a TCP or UNIX
    connection (``twisted.internet.abstract.FileDescriptor.bufferSize`` and ``SEND_LIMIT``,
    undocumented class attributes)."""
    transport.bufferSize = read
    transport.SEND_LIMIT = send


def request_line(channel: HTTPChannel) -> tuple[bytes, bytes]:
    """The method and the path of the request whose headers a channel is reading
    (``HTTPChannel._command`` and ``_path``, set from the request line, deleted once its body is
    in)."""
    return channel._command, channel._path


class BadRequestChannel(HTTPChannel):
    """An ``HTTPChannel`` whose answer to a malformed request is :meth:`bad_request`.

    twisted.web answers a bad request line, too many or too large headers, a bad length or
    chunking through ``HTTPChannel._respondToBadRequestAndDisconnect`` (private).
    """

    def bad_request(self) -> None:
        """Answer a malformed request and close (twisted.web's own answer by default)."""
        super()._respondToBadRequestAndDisconnect()

    def _respondToBadRequestAndDisconnect(self) -> None:
        self.bad_request()
