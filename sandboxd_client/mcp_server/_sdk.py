"""
The one reach past the ``mcp`` SDK's public surface, in one place, pinned by a test
(``tests/client/test_client_mcp.py``).

A tool needs its session's ``Connection`` (per-connection ``state`` and ``exit_stack``, which
the SDK unwinds when the session ends: stdin closed, HTTP ``DELETE`` or idle timeout). The
SDK's lowlevel ``Context.connection`` is public, but ``MCPServer`` tools are handed a
``ServerRequestContext`` whose ``ServerSession`` keeps it as ``_connection`` (mcp 2.3).
Without it (another SDK version), ``None``: the caller then treats the whole server as one
session, whose sandboxes are killed when the server stops.
"""

from __future__ import annotations

from mcp.server.connection import Connection
from mcp.server.mcpserver import Context


def connection_of(ctx: Context) -> Connection | None:
    """The ``Connection`` of the session ``ctx``'s request arrived on, if the SDK says."""
    connection = getattr(ctx.request_context.session, "_connection", None)
    return connection if isinstance(connection, Connection) else None
