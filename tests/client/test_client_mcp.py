"""
``sandboxctl mcp`` with the official ``mcp`` client library against a real daemon
(``twistd -n sandboxd --isolation=none`` on a free loopback port): the handshake, tools listed
with valid JSON schemas, each tool called (output streamed as progress), errors returned as
tool errors (``isError``) and not protocol failures, and each session's sandboxes killed when
it ends unless kept. Over stdio (the server as an MCP host starts it) and streamable HTTP.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from .real_daemon import REPO, Daemon, free_port, running_daemon

TOKEN = "mcp-token"
TOOLS = {"create_sandbox", "run_command", "read_file", "write_file", "list_files", "kill_sandbox"}
POLLS = 600
"""Looks at the daemon or the server before giving up (a hang guard, not a timing)."""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("daemon"), TOKEN) as running:
        yield running


def server_argv(daemon: Daemon, *extra: str) -> list[str]:
    token = daemon.root.parent / "token"
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    env["PYTHONPATH"] = str(REPO)
    return env


@asynccontextmanager
async def stdio_session(daemon: Daemon) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable, args=server_argv(daemon), env=server_env(), cwd=str(REPO)
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def live_sandboxes(daemon: Daemon) -> set[str]:
    request = urllib.request.Request(
        daemon.url + "/sandboxes", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return {s["remote_id"] for s in json.loads(response.read())["sandboxes"]}


def remote_id(handle: str) -> str:
    return str(json.loads(base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)))["r"])


def until(predicate: Callable[[], bool]) -> None:
    for _ in range(POLLS):
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("gave up waiting (hang guard)")


def run(test: Callable[[], Awaitable[None]]) -> None:
    anyio.run(test)


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that must succeed; its structured result."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def tool_error(session: ClientSession, tool: str, **arguments: Any) -> str:
    """A tool call that must fail as a tool error; its text."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result
    return " ".join(getattr(c, "text", "") for c in result.content)


def test_handshake_and_tools_with_valid_schemas(daemon: Daemon) -> None:
    async def test() -> None:
        params = StdioServerParameters(
            command=sys.executable, args=server_argv(daemon), env=server_env(), cwd=str(REPO)
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            init = await session.initialize()
            assert init.server_info.name == "sandboxd"
            assert init.capabilities.tools is not None
            assert "keep=true" in (init.instructions or "")
            listed = (await session.list_tools()).tools
        assert {t.name for t in listed} == TOOLS
        for tool in listed:
            jsonschema.Draft202012Validator.check_schema(tool.input_schema)
            assert tool.output_schema is not None
            jsonschema.Draft202012Validator.check_schema(tool.output_schema)
            assert tool.description and len(tool.description) > 100, tool.name
            assert tool.annotations is not None
        by_name = {t.name: t for t in listed}
        run_schema = by_name["run_command"].input_schema
        assert set(run_schema["required"]) == {"sandbox", "command"}
        assert set(run_schema["properties"]) >= {"cwd", "env", "timeout", "stdin"}
        network = by_name["create_sandbox"].input_schema["properties"]["network"]
        jsonschema.validate("egress", network)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate("everything", network)
        assert by_name["read_file"].annotations.read_only_hint is True  # type: ignore[union-attr]

    run(test)


def test_each_tool(daemon: Daemon) -> None:
    async def test() -> None:
        async with stdio_session(daemon) as session:
            created = await call(session, "create_sandbox", item_id=None)
            assert created["sandbox"] == "sb1" and created["kept"] is False
            sb = created["sandbox"]
            assert remote_id(created["handle"]) in live_sandboxes(daemon)

            written = await call(
                session, "write_file", sandbox=sb, path="src/a.txt", content="hé\n"
            )
            assert written == {"path": "src/a.txt", "bytes": 4}
            binary = base64.b64encode(b"\x00\xff\x10").decode()
            await call(
                session, "write_file", sandbox=sb, path="b.bin", content=binary, encoding="base64"
            )
            text = await call(session, "read_file", sandbox=sb, path="/src/a.txt")
            assert (text["content"], text["encoding"], text["size"]) == ("hé\n", "utf-8", 4)
            raw = await call(session, "read_file", sandbox=sb, path="b.bin")
            assert (raw["content"], raw["encoding"], raw["truncated"]) == (binary, "base64", False)
            listing = await call(session, "list_files", sandbox=sb)
            assert listing["files"] == [
                {"path": "/b.bin", "size": 3},
                {"path": "/src/a.txt", "size": 4},
            ]

            progress: list[tuple[float, str | None]] = []

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                progress.append((done, message))

            script = "echo one; sleep 0.3; echo two >&2; cat; echo $X; pwd; exit 3"
            result = await session.call_tool(
                "run_command",
                {
                    "sandbox": sb,
                    "command": script,
                    "cwd": "src",
                    "env": {"X": "ex"},
                    "stdin": "in\n",
                },
                progress_callback=on_progress,
            )
            assert not result.is_error, result.content
            out = result.structured_content
            assert out is not None and out["exit_code"] == 3 and out["stderr"] == "two\n"
            assert out["stdout"].startswith("one\nin\nex\n") and out["stdout"].endswith("/src\n")
            assert out["truncated"] is False
            streamed = "".join(m or "" for _, m in progress)
            assert "one\n" in streamed and "two\n" in streamed  # live, both streams
            assert [d for d, _ in progress] == sorted(d for d, _ in progress)
            timed = await call(session, "run_command", sandbox=sb, command="sleep 5", timeout=0.5)
            assert timed["exit_code"] == 124
            big = await call(
                session, "run_command", sandbox=sb, command="head -c 200000 /dev/zero | tr '\\0' x"
            )
            assert big["truncated"] is True and "bytes omitted" in big["stdout"]
            assert len(big["stdout"]) < 70_000

            assert await call(session, "kill_sandbox", sandbox=sb) == {
                "sandbox": sb,
                "killed": True,
            }
            assert remote_id(created["handle"]) not in live_sandboxes(daemon)

    run(test)


def test_errors_are_tool_errors(daemon: Daemon) -> None:
    async def test() -> None:
        async with stdio_session(daemon) as session:
            assert "no sandbox named 'sb7'" in await tool_error(
                session, "read_file", sandbox="sb7", path="x"
            )
            sb = (await call(session, "create_sandbox"))["sandbox"]
            assert "FileNotFoundError" in await tool_error(
                session, "read_file", sandbox=sb, path="nope"
            )
            assert "ValueError" in await tool_error(
                session, "write_file", sandbox=sb, path="../out", content="x"
            )
            bad = await tool_error(
                session, "write_file", sandbox=sb, path="f", content="@@", encoding="base64"
            )
            assert "base64" in bad.lower() or "Error" in bad
            assert await tool_error(session, "run_command", sandbox=sb)  # missing the command
            assert "ValueError" in await tool_error(
                session, "run_command", sandbox=sb, command="true", cwd="../.."
            )
            await call(session, "kill_sandbox", sandbox=sb)
            assert "no sandbox named" in await tool_error(session, "kill_sandbox", sandbox=sb)
            # The session is still usable after every error: none was a protocol failure.
            assert (await call(session, "create_sandbox"))["sandbox"] == "sb2"

    run(test)


def test_sandboxes_die_with_their_session_unless_kept(daemon: Daemon) -> None:
    handles: dict[str, str] = {}

    async def test() -> None:
        async with stdio_session(daemon) as session:
            handles["dies"] = (await call(session, "create_sandbox"))["handle"]
            handles["kept"] = (await call(session, "create_sandbox", keep=True))["handle"]
            live = live_sandboxes(daemon)
            assert {remote_id(h) for h in handles.values()} <= live

    run(test)
    until(lambda: remote_id(handles["dies"]) not in live_sandboxes(daemon))
    assert remote_id(handles["kept"]) in live_sandboxes(daemon)
    request = urllib.request.Request(
        f"{daemon.url}/sandboxes/{remote_id(handles['kept'])}",
        method="DELETE",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 204


ONE_SESSION_SERVER = """
import sys
from sandboxd_client.mcp_server import _tools
_tools.connection_of = lambda ctx: None  # the SDK's session hook not found
from sandboxd_client.cli import main
main(sys.argv[1:])
"""


def test_a_server_of_one_session_kills_its_unkept_sandboxes_when_it_ends(daemon: Daemon) -> None:
    """Where the SDK's session hook is not found, every session shares one set of sandboxes,
    which no session's end kills: the server kills the unkept ones as it exits."""
    handles: dict[str, str] = {}

    async def test() -> None:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-c", ONE_SESSION_SERVER, *server_argv(daemon)[2:]],
            env=server_env(),
            cwd=str(REPO),
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            handles["dies"] = (await call(session, "create_sandbox"))["handle"]
            handles["kept"] = (await call(session, "create_sandbox", keep=True))["handle"]
            assert {remote_id(h) for h in handles.values()} <= live_sandboxes(daemon)

    run(test)
    until(lambda: remote_id(handles["dies"]) not in live_sandboxes(daemon))
    kept = remote_id(handles["kept"])
    assert kept in live_sandboxes(daemon)
    request = urllib.request.Request(
        f"{daemon.url}/sandboxes/{kept}",
        method="DELETE",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 204


def test_streamable_http(daemon: Daemon, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "mcp.log"
    argv = [sys.executable, *server_argv(daemon, "--transport", "http", "--port", str(port))]
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=server_env())
    url = f"http://127.0.0.1:{port}/mcp"
    handles: list[str] = []

    async def test() -> None:
        async with (
            streamable_http_client(url) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            assert {t.name for t in (await session.list_tools()).tools} == TOOLS
            created = await call(session, "create_sandbox")
            handles.append(created["handle"])
            ran = await call(
                session, "run_command", sandbox=created["sandbox"], command="echo over http"
            )
            assert ran["stdout"] == "over http\n"

    async def left_open() -> None:
        """A session its client never closes (no DELETE): its sandbox lives on."""
        async with (
            streamable_http_client(url, terminate_on_close=False) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            handles.append((await call(session, "create_sandbox"))["handle"])

    try:
        until(lambda: _listening(port) or server.poll() is not None)
        assert server.poll() is None, log.read_text()
        run(test)
        # The client closed its session (DELETE): its sandbox goes with it.
        until(lambda: remote_id(handles[0]) not in live_sandboxes(daemon))
        run(left_open)
        assert remote_id(handles[1]) in live_sandboxes(daemon)
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0, log.read_text()
    # Stopped (SIGTERM), the server kills the sandboxes of the sessions still open.
    assert remote_id(handles[1]) not in live_sandboxes(daemon)


def test_the_session_hook_is_found_or_the_server_is_one_session() -> None:
    """Pins ``_sdk.connection_of``: the SDK's ``ServerSession._connection`` (mcp 2.3); the
    streamable HTTP test above fails if it is not found (its sandbox would outlive its
    session), and anything else there means one server-wide session."""
    from mcp.server.connection import Connection

    from sandboxd_client.mcp_server import _sdk

    class Session:
        _connection = Connection.__new__(Connection)

    class Request:
        session = Session()

    class Ctx:
        request_context = Request()

    assert _sdk.connection_of(Ctx()) is Session._connection  # type: ignore[arg-type]
    Session._connection = object()  # type: ignore[assignment]
    assert _sdk.connection_of(Ctx()) is None  # type: ignore[arg-type]


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_wire_transcript(daemon: Daemon, tmp_path: Path) -> None:
    """The JSON-RPC lines themselves, as an MCP host and the server exchange them (teed off
    the server's stdin and stdout): tools/list, and a tools/call whose output arrives as
    progress notifications before its result. ``SANDBOXD_MCP_TRANSCRIPT=FILE`` keeps it."""
    sent, received = tmp_path / "sent.jsonl", tmp_path / "received.jsonl"
    argv = " ".join(f"'{a}'" for a in [sys.executable, *server_argv(daemon)])
    params = StdioServerParameters(
        command="sh",
        args=["-c", f"tee '{sent}' | {argv} | tee '{received}'"],
        env=server_env(),
        cwd=str(REPO),
    )

    async def test() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await session.list_tools()
            sb = (await call(session, "create_sandbox"))["sandbox"]

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                pass

            await session.call_tool(
                "run_command",
                {"sandbox": sb, "command": "echo hello; sleep 0.2; echo world"},
                progress_callback=on_progress,
            )

    run(test)
    out = [json.loads(line) for line in sent.read_text().splitlines()]
    back = [json.loads(line) for line in received.read_text().splitlines()]
    listing = next(m for m in out if m.get("method") == "tools/list")
    tools = next(m for m in back if m.get("id") == listing["id"])["result"]["tools"]
    assert {t["name"] for t in tools} == TOOLS
    run_call = next(
        m for m in out if m.get("method") == "tools/call" and m["params"]["name"] == "run_command"
    )
    token = run_call["params"]["_meta"]["progressToken"]
    progress = [
        m["params"]
        for m in back
        if m.get("method") == "notifications/progress" and m["params"]["progressToken"] == token
    ]
    assert "".join(p.get("message", "") for p in progress) == "hello\nworld\n"
    result = next(m for m in back if m.get("id") == run_call["id"])["result"]
    assert result["isError"] is False
    assert result["structuredContent"] == {
        "exit_code": 0,
        "stdout": "hello\nworld\n",
        "stderr": "",
        "truncated": False,
    }
    keep = os.environ.get("SANDBOXD_MCP_TRANSCRIPT")
    if keep:
        wanted = [listing, {"id": listing["id"], "result": {"tools": tools}}, run_call]
        wanted += [{"method": "notifications/progress", "params": p} for p in progress]
        wanted.append({"id": run_call["id"], "result": result})
        Path(keep).write_text("".join(json.dumps(m) + "\n" for m in wanted))


def test_a_cancelled_call_kills_its_command(daemon: Daemon) -> None:
    """Cancelling a run_command (notifications/cancelled) cancels the client's exec: the
    stream is dropped and the host kills the command."""

    async def test() -> None:
        async with stdio_session(daemon) as session:
            sb = (await call(session, "create_sandbox"))["sandbox"]
            started = anyio.Event()

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                started.set()

            async def long_command() -> None:
                await session.call_tool(
                    "run_command",
                    {"sandbox": sb, "command": "echo $$ > pid; echo started; exec sleep 300"},
                    progress_callback=on_progress,
                )

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(long_command)
                await started.wait()
                tasks.cancel_scope.cancel()
            for _ in range(POLLS):
                probe = await call(session, "run_command", sandbox=sb, command="kill -0 $(cat pid)")
                if probe["exit_code"] != 0:
                    break
                await anyio.sleep(0.05)
            else:
                raise AssertionError("the cancelled command still runs")

    run(test)
