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
import sys
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import jsonschema
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from sandboxd_client import Socks5, Socks5TLS
from sandboxd_client.mcp_server._inputs import Socks5Proxy

from .mcp_harness import (
    POLLS,
    call,
    created,
    delete_sandbox,
    http_server,
    live_sandboxes,
    server_argv,
    server_env,
    tool_error,
    until,
)
from .real_daemon import REPO, Daemon, running_daemon

TOKEN = "mcp-token"
TOOLS = {
    "create_sandbox",
    "run_command",
    "run_code",
    "read_file",
    "write_file",
    "list_files",
    "kill_sandbox",
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("daemon"), TOKEN) as running:
        yield running


@asynccontextmanager
async def stdio_session(daemon: Daemon) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable, args=server_argv(daemon), env=server_env(), cwd=str(REPO)
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def run(test: Callable[[], Awaitable[None]]) -> None:
    anyio.run(test)


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


def test_create_sandboxs_socks5_takes_tls_as_true_or_an_object() -> None:
    schema = Socks5Proxy.model_json_schema()
    pem = "-----BEGIN CERTIFICATE-----\nMIIB-ca\n-----END CERTIFICATE-----\n"
    given: list[tuple[object, bool | Socks5TLS]] = [
        (True, True),
        (False, False),
        ({}, Socks5TLS()),
        ({"enabled": False}, False),
        ({"server_name": "proxy.example", "ca_cert": pem}, Socks5TLS("proxy.example", pem)),
    ]
    for tls, made in given:
        value = {"address": "203.0.113.80:1080", "tls": tls}
        jsonschema.validate(value, schema)
        proxy = Socks5Proxy.model_validate(value).to_socks5()
        assert proxy == Socks5("203.0.113.80:1080", tls=made)
    bad = {"address": "203.0.113.80:1080", "tls": {"enabled": True, "sni": "x"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    off = Socks5Proxy.model_validate({"address": "a:1", "tls": {"enabled": False, "ca_cert": pem}})
    with pytest.raises(ValueError, match="takes no other field when enabled is false"):
        off.to_socks5()


def test_each_tool(daemon: Daemon) -> None:
    async def test() -> None:
        async with stdio_session(daemon) as session:
            before = live_sandboxes(daemon)
            made = await call(session, "create_sandbox", item_id=None)
            workspace = made.pop("workspace")
            assert made == {"sandbox": "sb1", "kept": False}  # no handle: no tool takes one
            refused = await tool_error(
                session, "create_sandbox", network="host", allow_out=["192.0.2.1"], deny_out=[]
            )
            assert "need mode egress, not host" in refused  # the lists reach the daemon
            refused = await tool_error(
                session, "create_sandbox", rules={"api.example.com": {"Host": "b.example"}}
            )
            assert "Host cannot be set" in refused  # and the rules, in its shape
            socks5 = {"address": "proxy.example:1080", "username": "u", "password": "pw-s3cret"}
            refused = await tool_error(session, "create_sandbox", socks5=socks5)
            assert "socks5.address" in refused and "a host name is not supported" in refused
            assert "pw-s3cret" not in refused  # the proxy, in its shape, never its password
            sb = made["sandbox"]
            (rid,) = live_sandboxes(daemon) - before

            written = await call(
                session, "write_file", sandbox=sb, path="src/a.txt", content="hé\n"
            )
            assert written == {"path": "src/a.txt", "bytes": 4}
            binary = base64.b64encode(b"\x00\xff\x10").decode()
            await call(
                session, "write_file", sandbox=sb, path="b.bin", content=binary, encoding="base64"
            )
            text = await call(session, "read_file", sandbox=sb, path=f"{workspace}/src/a.txt")
            assert (text["content"], text["encoding"], text["size"]) == ("hé\n", "utf-8", 4)
            assert text["path"] == "src/a.txt"
            raw = await call(session, "read_file", sandbox=sb, path="b.bin")
            assert (raw["content"], raw["encoding"], raw["truncated"]) == (binary, "base64", False)
            listing = await call(session, "list_files", sandbox=sb)
            assert listing["files"] == [
                {"path": "b.bin", "size": 3},
                {"path": "src/a.txt", "size": 4},
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
            assert out["stdout"] == f"one\nin\nex\n{workspace}/src\n"
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
            assert rid not in live_sandboxes(daemon)

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
            # Not the workspace's root: the host's /src, where a command would look.
            outside = await tool_error(session, "write_file", sandbox=sb, path="/src/a", content="")
            assert "outside the workspace" in outside and "'src/a'" in outside
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
    ids: dict[str, str] = {}

    async def test() -> None:
        async with stdio_session(daemon) as session:
            _, ids["dies"] = await created(session, daemon)
            _, ids["kept"] = await created(session, daemon, keep=True)

    run(test)
    until(lambda: ids["dies"] not in live_sandboxes(daemon))
    assert ids["kept"] in live_sandboxes(daemon)
    delete_sandbox(daemon, ids["kept"])


ONE_SESSION_SERVER = """
import sys
import urllib.request
from sandboxd_client.mcp_server import _tools
_tools.connection_of = lambda ctx: None  # the SDK's session hook not found
from sandboxd_client.cli import main
main(sys.argv[1:])
"""


def test_a_server_of_one_session_kills_its_unkept_sandboxes_when_it_ends(daemon: Daemon) -> None:
    """Where the SDK's session hook is not found, every session shares one set of sandboxes,
    which no session's end kills: the server kills the unkept ones as it exits."""
    ids: dict[str, str] = {}

    async def test() -> None:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-c", ONE_SESSION_SERVER, *server_argv(daemon)[2:]],
            env=server_env(),
            cwd=str(REPO),
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            _, ids["dies"] = await created(session, daemon)
            _, ids["kept"] = await created(session, daemon, keep=True)

    run(test)
    until(lambda: ids["dies"] not in live_sandboxes(daemon))
    assert ids["kept"] in live_sandboxes(daemon)
    delete_sandbox(daemon, ids["kept"])


def test_streamable_http(daemon: Daemon, tmp_path: Path) -> None:
    """Handshake-era sessions (``ClientSession``, 2025-11-25): a session's sandboxes die with
    it (DELETE), those of a session left open with the server."""
    ids: list[str] = []

    async def test(url: str) -> None:
        async with (
            streamable_http_client(url) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            assert {t.name for t in (await session.list_tools()).tools} == TOOLS
            sb, rid = await created(session, daemon)
            ids.append(rid)
            ran = await call(session, "run_command", sandbox=sb, command="echo over http")
            assert ran["stdout"] == "over http\n"

    async def left_open(url: str) -> None:
        """A session its client never closes (no DELETE): its sandbox lives on."""
        async with (
            streamable_http_client(url, terminate_on_close=False) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            ids.append((await created(session, daemon))[1])

    with http_server(daemon, tmp_path / "mcp.log") as url:
        anyio.run(test, url)
        # The client closed its session (DELETE): its sandbox goes with it.
        until(lambda: ids[0] not in live_sandboxes(daemon))
        anyio.run(left_open, url)
        assert ids[1] in live_sandboxes(daemon)
    # Stopped (SIGTERM), the server kills the sandboxes of the sessions still open.
    assert ids[1] not in live_sandboxes(daemon)


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
    # A handshake's connection is a session; a 2026-07-28 request's lasts that request.
    assert _sdk.lives_across_requests(Connection.for_loop(object()))  # type: ignore[arg-type]
    modern = Connection.from_envelope("2026-07-28", None, None)
    assert not _sdk.lives_across_requests(modern)
    Session._connection = object()  # type: ignore[assignment]
    assert _sdk.connection_of(Ctx()) is None  # type: ignore[arg-type]


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


def _daemon_json(daemon: Daemon, method: str, path: str) -> object:
    request = urllib.request.Request(
        daemon.url + path, method=method, headers={"Authorization": f"Bearer {daemon.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    return json.loads(body) if body else None


def test_run_code_keeps_state_and_survives_a_removed_context(daemon: Daemon) -> None:
    async def test() -> None:
        async with stdio_session(daemon) as session:
            before = live_sandboxes(daemon)
            sb = (await call(session, "create_sandbox"))["sandbox"]
            (rid,) = live_sandboxes(daemon) - before
            assert (await call(session, "run_code", sandbox=sb, code="x = 2"))["text"] is None
            done = await call(session, "run_code", sandbox=sb, code="print('hi')\nx * 21")
            assert (done["text"], done["stdout"], done["error"]) == ("42", "hi\n", None)
            chart = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n1/0"
            drawn = await call(session, "run_code", sandbox=sb, code=chart)
            assert drawn["images"] == 1
            assert drawn["error"].startswith("ZeroDivisionError: division by zero\n")
            contexts = _daemon_json(daemon, "GET", f"/sandboxes/{rid}/contexts")
            assert isinstance(contexts, list)
            for context in contexts:
                _daemon_json(daemon, "DELETE", f"/sandboxes/{rid}/contexts/{context['id']}")
            fresh = await call(session, "run_code", sandbox=sb, code="'x' in dir()")
            assert fresh["text"] == "False"
            await call(session, "run_code", sandbox=sb, code="y=5", language="bash")
            shell = await call(
                session, "run_code", sandbox=sb, code="echo $y; false", language="bash"
            )
            assert (shell["stdout"], shell["error"]) == ("5\n", "exit status 1")

    run(test)
