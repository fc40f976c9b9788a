"""The SDK's ``AsyncSandbox`` against the same daemon: commands, files, and the streamed
``watch_dir``; and a malformed stream body sent straight to the front."""

import asyncio
import json
import urllib.request

import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FilesystemEvent,
    FilesystemEventType,
    TimeoutException,
)

from tests.e2b.conftest import E2BDaemon
from tests.e2b.test_files import native_upload


async def commands_and_files() -> None:
    sbx = await AsyncSandbox.create(timeout=60)
    try:
        out: list[str] = []
        result = await sbx.commands.run("echo a; echo b >&2", on_stdout=out.append)
        assert (result.stdout, result.stderr, "".join(out)) == ("a\n", "b\n", "a\n")
        with pytest.raises(CommandExitException):
            await sbx.commands.run("exit 7")
        handle = await sbx.commands.run("cat", background=True, stdin=True)
        await sbx.commands.send_stdin(handle.pid, "in")
        await sbx.commands.close_stdin(handle.pid)
        assert (await handle.wait()).stdout == "in"
        await sbx.files.write("x/y.txt", "async")
        assert await sbx.files.read("/home/user/x/y.txt") == "async"
        assert [e.name for e in await sbx.files.list("x")] == ["y.txt"]
    finally:
        await sbx.kill()


def test_async_commands_and_files(e2b_daemon: E2BDaemon) -> None:
    asyncio.run(commands_and_files())


async def timed_out_commands() -> None:
    sbx = await AsyncSandbox.create(timeout=60)
    try:
        with pytest.raises(TimeoutException, match="reached its timeout"):
            await sbx.commands.run("sleep 20", timeout=1)
        handle = await sbx.commands.run("sleep 20", timeout=1, background=True)
        with pytest.raises(TimeoutException, match="reached its timeout"):
            await handle.wait()
        assert await sbx.commands.list() == []  # killed, as envd kills it
    finally:
        await sbx.kill()


def test_a_command_past_its_timeout_is_the_sdks_timeout(e2b_daemon: E2BDaemon) -> None:
    """The async SDK leaves the deadline to the server: its end must be a timeout error
    (``deadline_exceeded``), not an exit code."""
    asyncio.run(timed_out_commands())


async def streamed_watch(front: E2BDaemon) -> list[FilesystemEvent]:
    sbx = await AsyncSandbox.create(timeout=60)
    seen: list[FilesystemEvent] = []
    arrived = asyncio.Event()

    def on_event(event: FilesystemEvent) -> None:
        seen.append(event)
        if event.name.startswith("sub/late"):
            arrived.set()

    try:
        await sbx.files.make_dir("watched")
        watch = await sbx.files.watch_dir("watched", on_event, recursive=True)
        await sbx.files.write("watched/new.txt", "1")
        await asyncio.to_thread(native_upload, front, sbx.sandbox_id, "watched/put.txt", b"2")
        await sbx.files.make_dir("watched/sub")
        for n in range(200):  # until the new directory is watched (see test_polling_watch)
            await sbx.commands.run(f"touch watched/sub/late{n}")
            if arrived.is_set():
                break
            await asyncio.sleep(0.05)
        await watch.stop()
    finally:
        await sbx.kill()
    return seen


def test_async_watch_dir_streams_events(e2b_daemon: E2BDaemon) -> None:
    seen = asyncio.run(streamed_watch(e2b_daemon))
    kinds = {(e.name, e.type) for e in seen}
    assert ("new.txt", FilesystemEventType.CREATE) in kinds
    assert ("put.txt", FilesystemEventType.CREATE) in kinds
    assert not any(".sandboxd-upload-" in e.name for e in seen)
    assert ("sub", FilesystemEventType.CREATE) in kinds
    assert any(n.startswith("sub/late") and k == FilesystemEventType.CREATE for n, k in kinds)


def test_malformed_stream_body_is_invalid_argument(e2b_daemon: E2BDaemon) -> None:
    from e2b import Sandbox

    sbx = Sandbox.create(timeout=60)
    try:
        headers = {
            "Content-Type": "application/connect+json",
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "X-Access-Token": sbx._envd_access_token or "",
        }
        for body in (b"\x00\x00\x00\x00\x09not json!", b"\x00\x00\x00", b"\x01\x00\x00\x00\x02{}"):
            request = urllib.request.Request(
                e2b_daemon.url + "/process.Process/Start", data=body, headers=headers
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                # A stream's error: HTTP 200, one end-of-stream envelope holding it.
                assert response.status == 200
                assert response.headers["Content-Type"] == "application/connect+json"
                answer = response.read()
            assert answer[0] == 0x02 and int.from_bytes(answer[1:5], "big") == len(answer) - 5
            assert json.loads(answer[5:])["error"]["code"] == "invalid_argument"
        assert sbx.commands.list() == []  # nothing was started
    finally:
        sbx.kill()


async def watch_of_a_killed_sandbox() -> Exception | None:
    sbx = await AsyncSandbox.create(timeout=60)
    ended: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def on_exit(error: Exception | None) -> None:
        if not ended.done():
            ended.set_result(error)

    await sbx.files.watch_dir("/home/user", lambda event: None, on_exit=on_exit, timeout=0)
    await sbx.kill()
    return await asyncio.wait_for(ended, 60)


def test_a_killed_sandbox_ends_its_watch(e2b_daemon: E2BDaemon) -> None:
    from e2b import SandboxNotRunningException

    ended = asyncio.run(watch_of_a_killed_sandbox())
    assert isinstance(ended, SandboxNotRunningException)
    assert "end of life while the request" in str(ended)
