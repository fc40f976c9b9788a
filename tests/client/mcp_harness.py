"""
What the ``sandboxctl mcp`` tests share: the server's command line and environment against a
real daemon (:mod:`.real_daemon`), the streamable HTTP server as a process of its own, the
daemon's live sandboxes as the truth of what the server did, and tool calls that must succeed
or fail as tool errors.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from mcp_types import CallToolResult

from .real_daemon import REPO, Daemon, free_port

POLLS = 600
"""Looks at the daemon or the server before giving up (a hang guard, not a timing)."""


class Caller(Protocol):
    """A ``ClientSession`` or a ``Client``: both call tools the same way."""

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> CallToolResult:
        raise NotImplementedError


def server_argv(daemon: Daemon, *extra: str) -> list[str]:
    """``python`` arguments of ``sandboxctl mcp`` for ``daemon`` (its token file)."""
    token = daemon.log.parent / "token"  # beside the log, in the directory the daemon was given
    return [
        "-m",
        "sandboxd_client.cli",
        "--url",
        daemon.url,
        "--token-file",
        str(token),
        "mcp",
        *extra,
    ]


def server_env() -> dict[str, str]:
    """This process's environment (coverage's marks included), without ``SANDBOXD_*``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def live_sandboxes(daemon: Daemon) -> set[str]:
    """The remote ids of the sandboxes ``daemon`` holds now."""
    request = urllib.request.Request(
        daemon.url + "/sandboxes", headers={"Authorization": f"Bearer {daemon.token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return {s["remote_id"] for s in json.loads(response.read())["sandboxes"]}


def delete_sandbox(daemon: Daemon, remote_id: str) -> None:
    """Kill a sandbox through the daemon's own API (one a test left alive on purpose)."""
    request = urllib.request.Request(
        f"{daemon.url}/sandboxes/{remote_id}",
        method="DELETE",
        headers={"Authorization": f"Bearer {daemon.token}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 204


def until(predicate: Callable[[], bool]) -> None:
    for _ in range(POLLS):
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("gave up waiting (hang guard)")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def http_server(daemon: Daemon, log: Path) -> Iterator[str]:
    """``sandboxctl mcp --transport http`` on a free loopback port: its URL while it runs.

    Stopped with SIGTERM (as a service manager would), which must end it cleanly (exit 0).
    """
    port = free_port()
    argv = [sys.executable, *server_argv(daemon, "--transport", "http", "--port", str(port))]
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=server_env())
    try:
        until(lambda: listening(port) or server.poll() is not None)
        assert server.poll() is None, log.read_text()
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0, log.read_text()


async def call(session: Caller, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that must succeed; its structured result."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def tool_error(session: Caller, tool: str, **arguments: Any) -> str:
    """A tool call that must fail as a tool error; its text."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result
    return " ".join(getattr(c, "text", "") for c in result.content)


async def created(session: Caller, daemon: Daemon, **arguments: Any) -> tuple[str, str]:
    """``create_sandbox``: the name the model is given and the remote id the daemon made
    (the one sandbox that appeared; the model itself is never shown an id)."""
    before = live_sandboxes(daemon)
    name = (await call(session, "create_sandbox", **arguments))["sandbox"]
    (new,) = live_sandboxes(daemon) - before
    return str(name), new
