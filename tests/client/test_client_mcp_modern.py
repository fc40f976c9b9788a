"""
``sandboxctl mcp`` driven by the official ``mcp`` SDK's ``Client`` as an application uses it:
unmodified, in its default mode, which probes ``server/discover`` and speaks 2026-07-28 (every
request with its own envelope; no handshake, no session). Each tool call is a request of its
own, so a sandbox must outlive the request that created it: created, written, run, read,
listed and killed across separate calls, over stdio and over streamable HTTP, against a real
daemon. A client without a session leaves its sandboxes to the server, which kills them when
it stops.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types.version import LATEST_MODERN_VERSION

from .mcp_harness import (
    Caller,
    call,
    created,
    http_server,
    live_sandboxes,
    server_argv,
    server_env,
    tool_error,
    until,
)
from .real_daemon import REPO, Daemon, running_daemon

TOKEN = "mcp-modern-token"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("daemon"), TOKEN) as running:
        yield running


async def a_sandbox_across_calls(client: Caller, daemon: Daemon) -> str:
    """Every tool on one sandbox, one call each; return the id of a second one left alive."""
    before = live_sandboxes(daemon)
    made = await call(client, "create_sandbox")
    sb, workspace = made["sandbox"], made["workspace"]
    (rid,) = live_sandboxes(daemon) - before
    written = await call(
        client, "write_file", sandbox=sb, path="src/app.py", content="print(6*7)\n"
    )
    assert written["bytes"] == 11
    ran = await call(client, "run_command", sandbox=sb, command="python3 src/app.py")
    assert (ran["exit_code"], ran["stdout"]) == (0, "42\n")
    # One path vocabulary: what a file tool wrote is where a command finds it.
    await call(client, "write_file", sandbox=sb, path=f"{workspace}/lib/m.py", content="X = 1\n")
    ran = await call(client, "run_command", sandbox=sb, command=f"cat {workspace}/lib/m.py")
    assert ran["stdout"] == "X = 1\n"
    refused = await tool_error(client, "write_file", sandbox=sb, path="/src/app.py", content="")
    assert f"which is {workspace}" in refused
    await call(client, "run_command", sandbox=sb, command="echo made > out.txt", cwd="lib")
    read = await call(client, "read_file", sandbox=sb, path="lib/out.txt")
    assert read["content"] == "made\n"
    listed = await call(client, "list_files", sandbox=sb)
    assert listed["files"] == [
        {"path": "lib/m.py", "size": 6},
        {"path": "lib/out.txt", "size": 5},
        {"path": "src/app.py", "size": 11},
    ]
    assert rid in live_sandboxes(daemon)
    assert await call(client, "kill_sandbox", sandbox=sb) == {"sandbox": sb, "killed": True}
    assert rid not in live_sandboxes(daemon)
    assert "no sandbox named" in await tool_error(client, "run_command", sandbox=sb, command="true")
    other, left = await created(client, daemon)
    assert other != sb
    assert (await call(client, "run_command", sandbox=other, command="true"))["exit_code"] == 0
    return left


def test_over_stdio(daemon: Daemon) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=server_argv(daemon), env=server_env(), cwd=str(REPO)
    )
    left: list[str] = []

    async def test() -> None:
        async with Client(params) as client:
            assert client.protocol_version == LATEST_MODERN_VERSION
            left.append(await a_sandbox_across_calls(client, daemon))
            assert left[0] in live_sandboxes(daemon)

    anyio.run(test)
    # The server ends with its stdin, and kills what it created.
    until(lambda: left[0] not in live_sandboxes(daemon))


def test_over_streamable_http(daemon: Daemon, tmp_path: Path) -> None:
    left: list[str] = []

    async def test(url: str) -> None:
        async with Client(url) as client:
            assert client.protocol_version == LATEST_MODERN_VERSION
            left.append(await a_sandbox_across_calls(client, daemon))

    with http_server(daemon, tmp_path / "mcp.log") as url:
        anyio.run(test, url)
        # No session ends with the client: the sandbox lives until the server stops.
        assert left[0] in live_sandboxes(daemon)
    assert left[0] not in live_sandboxes(daemon)
