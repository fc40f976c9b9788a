"""
``sandboxctl mcp`` driven by the official MCP TypeScript SDK (``@modelcontextprotocol/client``
from npm, unmodified, ``tests/client/mcp_js``) with version negotiation on, which picks
2026-07-28: create, write, run, read, list and kill in separate calls, each naming the sandbox
an earlier call returned, over stdio and streamable HTTP, against a real daemon.

Skipped where Node.js 20 or later is missing, or the SDK is not installed (``tests/run`` runs
``npm ci`` in ``tests/client/mcp_js`` where it can).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .mcp_harness import http_server, live_sandboxes, server_argv, server_env, until
from .real_daemon import REPO, Daemon, running_daemon

TOKEN = "mcp-js-token"
DRIVER = REPO / "tests" / "client" / "mcp_js"


def node_major() -> int:
    node = shutil.which("node")
    if node is None:
        return 0
    done = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    return int(done.stdout.strip().lstrip("v").split(".")[0] or 0)


pytestmark = [
    pytest.mark.skipif(node_major() < 20, reason="needs Node.js 20 or later"),
    pytest.mark.skipif(
        not (DRIVER / "node_modules" / "@modelcontextprotocol" / "client").is_dir(),
        reason="the MCP TypeScript SDK is not installed (npm ci in tests/client/mcp_js)",
    ),
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("daemon"), TOKEN) as running:
        yield running


def drive(*argv: str) -> dict[str, Any]:
    """Run the TypeScript client (``drive.mjs``); its report."""
    done = subprocess.run(
        ["node", "drive.mjs", *argv],
        cwd=DRIVER,
        env=server_env(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def check(report: dict[str, Any]) -> None:
    """Each call did what the one before it set up, on 2026-07-28."""
    assert report["protocol"] == "2026-07-28"
    calls = report["calls"]
    assert [c["name"] for c in calls] == [
        "create_sandbox",
        "write_file",
        "run_command",
        "read_file",
        "list_files",
        "kill_sandbox",
        "run_command",
        "create_sandbox",
    ]
    assert [c["isError"] for c in calls] == [False] * 6 + [True, False]
    made, written, ran, read, listed, killed, _, other = (c["structured"] for c in calls)
    assert made["sandbox"] == "sb1" and made["workspace"].startswith("/")
    assert written == {"path": "src/app.py", "bytes": 11}
    assert (ran["exit_code"], ran["stdout"]) == (0, "42\n")
    assert read["content"] == "print(6*7)\n"
    assert listed["files"] == [{"path": "src/app.py", "size": 11}]
    assert killed == {"sandbox": "sb1", "killed": True}
    assert other["sandbox"] == "sb2"


def test_over_stdio(daemon: Daemon) -> None:
    before = live_sandboxes(daemon)
    check(drive("stdio", sys.executable, *server_argv(daemon)))
    # sb1 killed, sb2 with the server when the client closed its stdin.
    until(lambda: live_sandboxes(daemon) <= before)


def test_over_streamable_http(daemon: Daemon, tmp_path: Path) -> None:
    before = live_sandboxes(daemon)
    with http_server(daemon, tmp_path / "mcp.log") as url:
        check(drive("http", url))
        assert len(live_sandboxes(daemon) - before) == 1  # sb2: no session ends it
    assert live_sandboxes(daemon) <= before
