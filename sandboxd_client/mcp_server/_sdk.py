"""
The reaches past the ``mcp`` SDK's public surface, in one place, pinned by tests
(``tests/client/test_client_mcp.py``).

A tool needs its session's ``Connection`` (per-connection ``state`` and ``exit_stack``, which
the SDK unwinds when the connection ends). The SDK's lowlevel ``Context.connection`` is
public, but ``MCPServer`` tools are handed a ``ServerRequestContext`` whose ``ServerSession``
keeps it as ``_connection`` (mcp 2.3). Without it (another SDK version), ``None``: the caller
then treats the whole server as one session, whose sandboxes are killed when the server stops.

A ``Connection`` is not always a session. On the handshake protocol versions (2025-11-25 and
older) it is: made at ``initialize``, it lasts until stdin closes or the HTTP session is
deleted or times out. On 2026-07-28 (no handshake: every request carries its own envelope)
the SDK makes a fresh one for every request and unwinds it as soon as the answer is sent, over
stdio as over HTTP, so nothing kept there outlives the call.
"""

from __future__ import annotations

from mcp.server.connection import Connection
from mcp.server.mcpserver import Context
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS


def connection_of(ctx: Context) -> Connection | None:
    """The ``Connection`` of the session ``ctx``'s request arrived on, if the SDK says."""
    connection = getattr(ctx.request_context.session, "_connection", None)
    return connection if isinstance(connection, Connection) else None


def lives_across_requests(connection: Connection) -> bool:
    """Whether ``connection`` is a session (a handshake's), not one request's (2026-07-28 or
    any later, per-request protocol version)."""
    return connection.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
