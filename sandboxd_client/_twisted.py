"""
Every use of Twisted's private API in the client, in one place.

Each name here reaches past Twisted's public surface; each was checked against Twisted 26.10
and is pinned by ``tests/client/test_client_twisted.py``, so an upgrade that moves it fails
there, by name, rather than somewhere in the client.
"""

from __future__ import annotations

from twisted.internet.abstract import FileDescriptor
from twisted.web._newclient import ParseError

__all__ = ["ParseError", "response_connection"]

# ``ParseError`` (``twisted.web._newclient``, Twisted 26.10): what the HTTP client parser raises
# for a status line or header it cannot read; it arrives as a leaf of ``ResponseFailed`` and is
# the only sign that the peer is not speaking HTTP. No public module exports it.


def response_connection(transport: object) -> FileDescriptor | None:
    """
    The TCP connection under a response body's transport, or ``None``.

    twisted.web hands ``IResponse.deliverBody``'s protocol a ``TransportProxyProducer`` whose
    ``_producer`` attribute is the connection (Twisted 26.10). Anything else there (a TLS
    wrapper, an in-memory transport) gives ``None``.
    """
    connection = getattr(transport, "_producer", None)
    return connection if isinstance(connection, FileDescriptor) else None
