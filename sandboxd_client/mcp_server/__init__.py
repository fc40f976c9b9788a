"""
``sandboxctl mcp``: a Model Context Protocol server for a sandboxd service
(docs/client.rst, "MCP server").

Built on the official ``mcp`` SDK (install ``sandboxd-client[mcp]``), over stdio by default or
streamable HTTP on request, backed by one ``HttpSandbox``. ``HttpSandbox`` runs on Twisted's
reactor in a thread of its own and the SDK on its asyncio loop (see ``_bridge``). The tools are
in ``_tools``, their paths in ``_paths``; each session's sandboxes, and their end, in
``_session``.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Literal

from twisted.internet.defer import succeed

from .. import HttpSandbox
from ._bridge import ReactorThread
from ._session import Registry
from ._tools import Limits, build_server

__all__ = ["Limits", "build_server", "serve"]


def _stop_on_sigterm() -> None:
    """SIGTERM (an MCP host closing the server) unwinds like Ctrl-C, so the sessions end and
    their sandboxes are killed, instead of the process dying on the spot."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def serve(
    url: str,
    token: str | None,
    *,
    transport: Literal["stdio", "http"] = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    path: str = "/mcp",
    limits: Limits | None = None,
) -> int:
    """Serve until the client goes (stdio) or the process is stopped; return the exit code.

    Sandboxes created without ``keep`` are killed at the end of their session; the server's
    own (those of requests without a session, as on protocol 2026-07-28) and any a session
    could not kill (the process was stopped) are killed here before the reactor stops.
    """
    from twisted.internet import reactor

    bridge = ReactorThread(reactor)
    bridge.start()
    registry = Registry()
    # Made on the reactor thread, like everything the client does from here on.
    client = bridge.blocking(lambda: succeed(HttpSandbox(url, token=token, reactor=reactor)))
    limits = limits if limits is not None else Limits()
    server = build_server(client, bridge, registry, limits, log_level="WARNING")
    _stop_on_sigterm()
    try:
        if transport == "stdio":
            server.run("stdio")
        else:
            server.run("streamable-http", host=host, port=port, streamable_http_path=path)
    except KeyboardInterrupt:
        pass
    finally:
        for handle in registry.take_unkept():
            with contextlib.suppress(Exception):
                bridge.blocking(client.kill, handle)
        with contextlib.suppress(Exception):
            bridge.blocking(client.close)
        bridge.stop()
    return 0


def run_from_args(args: Any) -> int:
    """``sandboxctl mcp`` with its parsed arguments (see ``cli``)."""
    from ..cli._commands import read_token

    return serve(
        args.url,
        read_token(args.token_file),
        transport=args.transport,
        host=args.host,
        port=args.port,
        path=args.path,
        limits=Limits(output_bytes=args.max_output),
    )
