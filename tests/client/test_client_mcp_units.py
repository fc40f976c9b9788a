"""The pure parts of ``sandboxctl mcp``: output clipping, file encodings, session bookkeeping."""

from __future__ import annotations

import pytest

from sandboxd_client import SandboxHandle
from sandboxd_client.mcp_server._output import (
    LiveText,
    clip,
    file_bytes,
    file_content,
)
from sandboxd_client.mcp_server._session import Created, Registry, UnknownSandbox


def test_clip_keeps_both_ends_and_says_how_much_is_left_out() -> None:
    assert clip(b"short", 10) == ("short", False)
    text, cut = clip(b"a" * 10 + b"b" * 100 + b"c" * 10, 20)
    assert cut and text == "a" * 10 + "\n[... 100 bytes omitted ...]\n" + "c" * 10


def test_files_are_text_when_they_are_utf8_else_base64() -> None:
    assert file_content("é".encode()) == ("é", "utf-8")
    assert file_content(b"\xff") == ("/w==", "base64")
    assert file_bytes("/w==", "base64") == b"\xff"
    assert file_bytes("é", "utf-8") == "é".encode()
    with pytest.raises(ValueError):
        file_bytes("@@", "base64")
    with pytest.raises(ValueError, match="encoding"):
        file_bytes("x", "latin-1")


def test_live_text_decodes_a_character_split_between_chunks() -> None:
    live, data = LiveText(), "é".encode()
    assert live.feed(data[:1]) + live.feed(data[1:]) == "é"


def test_sessions_name_their_sandboxes_and_give_up_the_unkept_ones() -> None:
    registry = Registry()
    one, two = registry.open(), registry.open()
    assert one.add(SandboxHandle("h1"), keep=False, workspace="/w1") == "sb1"
    assert one.add(SandboxHandle("h2"), keep=True, workspace="/w2") == "sb2"
    assert two.add(SandboxHandle("h3"), keep=False, workspace="/w3") == "sb1"  # per session
    assert one.get("sb2") == Created(SandboxHandle("h2"), keep=True, workspace="/w2")
    with pytest.raises(UnknownSandbox, match="known: sb1, sb2"):
        one.get("sb3")
    assert registry.take_unkept() == [SandboxHandle("h1"), SandboxHandle("h3")]
    assert registry.take_unkept() == []
    registry.close(two)
    registry.close(two)
    assert registry.sessions == [one]
    one.forget("sb2")
    with pytest.raises(UnknownSandbox, match="none yet"):
        one.get("sb2")


def test_without_a_session_hook_the_server_is_one_session() -> None:
    from sandboxd_client.mcp_server._tools import session_sandboxes

    class Request:
        session = object()  # no connection to be found

    class Ctx:
        request_context = Request()

    registry = Registry()
    kills: list[object] = []
    first = session_sandboxes(Ctx(), registry, kills.append)  # type: ignore[arg-type]
    assert session_sandboxes(Ctx(), registry, kills.append) is first  # type: ignore[arg-type]
    assert registry.sessions == [first] and kills == []  # killed only when the server stops


def test_the_bridge_refuses_a_reactor_that_already_runs() -> None:
    from sandboxd_client.mcp_server._bridge import ReactorThread

    class Running:
        running = True

    with pytest.raises(RuntimeError, match="already runs"):
        ReactorThread(Running()).start()


def test_the_bridge_reports_a_reactor_that_could_not_start() -> None:
    from sandboxd_client.mcp_server._bridge import ReactorThread

    class Broken:
        running = False

        def callWhenRunning(self, f: object) -> None:
            pass

        def run(self, installSignalHandlers: bool) -> None:
            raise OSError("no")

    bridge = ReactorThread(Broken())
    with pytest.raises(RuntimeError, match="could not be started"):
        bridge.start()
    bridge.stop()  # its thread has ended: nothing to stop (Broken has no callFromThread)


def test_a_tool_error_names_the_failure_and_its_text() -> None:
    from sandboxd_client import SandboxNotFound
    from sandboxd_client.mcp_server._tools import describe

    assert describe(SandboxNotFound("gone", status=404)) == "SandboxNotFound: gone"
    assert describe(FileNotFoundError(2, "No such file")) == "FileNotFoundError: No such file"
    assert describe(OSError("bare")) == "OSError: bare"
    assert describe(ValueError("bad")) == "ValueError: bad"


def test_a_chunk_queued_as_the_command_ends_is_still_given_out() -> None:
    import asyncio

    from sandboxd_client.mcp_server._tools import _until_done

    async def main() -> list[bytes]:
        loop = asyncio.get_running_loop()
        run: asyncio.Future[None] = loop.create_future()
        chunks: asyncio.Queue[bytes] = asyncio.Queue()
        got: list[bytes] = []

        async def consume() -> None:
            async for batch in _until_done(run, chunks):
                got.append(batch)

        consuming = asyncio.ensure_future(consume())
        chunks.put_nowait(b"first")
        for _ in range(100):  # turns of the loop until the first batch is out
            if got:
                break
            await asyncio.sleep(0)
        for _ in range(10):  # and its reader waits on the empty queue
            await asyncio.sleep(0)
        assert got == [b"first"]
        # The end, then a chunk from the reactor's thread in the very next callback: the
        # wait sees the end before its reader has taken the chunk.
        run.set_result(None)
        loop.call_soon(chunks.put_nowait, b"last")
        await consuming
        return got

    assert asyncio.run(main()) == [b"first", b"last"]


def test_chunks_queued_together_are_given_out_as_one_batch() -> None:
    import asyncio

    from sandboxd_client.mcp_server._tools import _until_done

    async def main() -> list[bytes]:
        loop = asyncio.get_running_loop()
        run: asyncio.Future[None] = loop.create_future()
        chunks: asyncio.Queue[bytes] = asyncio.Queue()
        for chunk in (b"one ", b"two ", b"three"):  # all there before the reader first looks
            chunks.put_nowait(chunk)
        batches = _until_done(run, chunks)
        first = await batches.__anext__()
        run.set_result(None)
        return [first, *[batch async for batch in batches]]

    assert asyncio.run(main()) == [b"one two three"]


def test_tool_paths_are_relative_to_the_workspace_or_absolute_under_it() -> None:
    from sandboxd_client.mcp_server._paths import shown, to_workspace

    assert to_workspace("src/a", "/w/x") == "/src/a"
    assert to_workspace("./src//a", "/w/x") == "/src/a"
    assert to_workspace("/w/x/src/a", "/w/x") == "/src/a"
    assert to_workspace("//w/./x/", "/w/x") == "/"
    assert to_workspace("/w/x/../y", "/w/x") == "/../y"  # the host refuses the climb
    with pytest.raises(ValueError, match=r"'/w/xy/a' is outside the workspace.*'w/xy/a'"):
        to_workspace("/w/xy/a", "/w/x")
    with pytest.raises(ValueError, match=r"which is /w/x .*such as '\.'"):
        to_workspace("/", "/w/x")
    assert shown("/src/a") == "src/a"
    assert shown("/") == "."


def test_a_sandbox_whose_commands_cannot_run_is_killed_and_not_named() -> None:
    """``create_sandbox`` learns where commands run with one; if that command fails, the model
    is told, and the sandbox (whose name it never learnt) is killed. On the SDK's in-process
    ``Client``, with a stand-in for ``HttpSandbox`` on a reactor of the bridge's own."""
    import anyio
    from mcp import Client
    from twisted.internet.defer import Deferred, succeed
    from twisted.internet.selectreactor import SelectReactor

    from sandboxd_client import ExecResult
    from sandboxd_client.mcp_server._bridge import ReactorThread
    from sandboxd_client.mcp_server._tools import build_server

    killed: list[SandboxHandle] = []

    class NoShell:
        def create(self, spec: object) -> Deferred[SandboxHandle]:
            return succeed(SandboxHandle("h1"))

        def exec(self, handle: SandboxHandle, cmd: list[str]) -> Deferred[ExecResult]:
            return succeed(ExecResult(127, b"", b"sh: not found\n"))

        def kill(self, handle: SandboxHandle) -> Deferred[None]:
            killed.append(handle)
            return succeed(None)

    bridge = ReactorThread(SelectReactor())
    bridge.start()
    registry = Registry()
    server = build_server(NoShell(), bridge, registry)  # type: ignore[arg-type]

    async def test() -> str:
        async with Client(server) as client:
            result = await client.call_tool("create_sandbox", {})
            assert result.is_error
            return " ".join(getattr(c, "text", "") for c in result.content)

    try:
        text = anyio.run(test)
    finally:
        bridge.stop()
    assert "commands cannot run: sh: not found" in text
    assert killed == [SandboxHandle("h1")]
    assert registry.take_unkept() == []
