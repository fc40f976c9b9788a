"""``commands`` through the unmodified SDK: foreground with live callbacks, exit codes,
timeouts, background processes (list, kill, stdin, reconnect), and the refused root user."""

import http.client
import json
import time

import pytest
from e2b import (
    CommandExitException,
    InvalidArgumentException,
    NotFoundException,
    RateLimitException,
    Sandbox,
    SandboxException,
    TimeoutException,
)

from sandboxd.e2b import wire
from tests.e2b.conftest import E2BDaemon


def test_foreground_streams_live_and_separately(any_sandbox: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    result = any_sandbox.commands.run(
        "echo one; echo two >&2; echo three",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert result.exit_code == 0
    assert result.stdout == "one\nthree\n" and "".join(out) == result.stdout
    assert result.stderr == "two\n" and "".join(err) == "two\n"


def test_cwd_env_and_default_workspace(sandbox: Sandbox) -> None:
    sandbox.files.write("sub/marker", "x")
    assert sandbox.commands.run("cat marker", cwd="/home/user/sub").stdout == "x"
    assert sandbox.commands.run("ls", cwd="sub").stdout == "marker\n"
    assert sandbox.commands.run("cat sub/marker").stdout == "x"
    assert sandbox.commands.run("echo $A-$B", envs={"A": "1", "B": "2"}).stdout == "1-2\n"
    with pytest.raises(InvalidArgumentException, match="outside the sandbox"):
        sandbox.commands.run("true", cwd="/etc")


def test_exit_code_raises_command_exit(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run("echo partial; echo bad >&2; exit 3")
    assert caught.value.exit_code == 3
    assert caught.value.stdout == "partial\n" and caught.value.stderr == "bad\n"


def test_timeout(sandbox: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 20", timeout=1)


def test_background_list_kill(any_sandbox: Sandbox) -> None:
    sandbox = any_sandbox
    handle = sandbox.commands.run("sleep 60", background=True)
    listed = sandbox.commands.list()
    assert handle.pid in [p.pid for p in listed]
    info = next(p for p in listed if p.pid == handle.pid)
    assert info.cmd == "/bin/bash" and info.args[-1] == "sleep 60"
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        handle.wait()
    assert handle.pid not in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(handle.pid) is False
    assert sandbox.commands.kill(999999) is False


def test_stdin(any_sandbox: Sandbox) -> None:
    sandbox = any_sandbox
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "hello ")
    handle.send_stdin("world")
    sandbox.commands.close_stdin(handle.pid)
    result = handle.wait()
    assert result.stdout == "hello world"
    with pytest.raises(NotFoundException):
        sandbox.commands.send_stdin(handle.pid, "late")


def test_stdin_without_pipe_is_refused(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True)
    try:
        with pytest.raises(SandboxException, match="without stdin"):
            sandbox.commands.send_stdin(handle.pid, "x")
    finally:
        handle.kill()


def test_disconnect_and_reconnect(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run(
        "read line; echo got $line; echo done", background=True, stdin=True
    )
    handle.disconnect()
    again = sandbox.commands.connect(handle.pid)
    sandbox.commands.send_stdin(handle.pid, "it\n")
    seen: list[str] = []
    result = again.wait(on_stdout=seen.append)
    assert result.stdout == "got it\ndone\n" and "".join(seen) == result.stdout
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(4_000_000)


def test_a_timed_out_command_ends_as_killed_on_a_later_connect(sandbox: Sandbox) -> None:
    """Only the stream whose Connect-Timeout-Ms was the command's timeout ends in a timeout
    error; a stream connected afterwards sees the kill, as envd tells it."""
    handle = sandbox.commands.run("sleep 20", timeout=2, background=True)
    handle.disconnect()
    again = sandbox.commands.connect(handle.pid, timeout=0)
    with pytest.raises(CommandExitException) as caught:
        again.wait()
    assert caught.value.exit_code == -1


def test_root_user_is_refused(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match="no root in a sandbox"):
        sandbox.commands.run("id", user="root")
    assert sandbox.commands.run("echo ok", user="user").stdout == "ok\n"


def test_a_killed_sandbox_ends_its_streams(sandbox: Sandbox) -> None:
    """A stream in flight is cut as E2B cuts it (the SDK asks /health, then tells the end of
    life); a call made afterwards finds no sandbox."""
    from e2b import SandboxNotRunningException

    handle = sandbox.commands.run("sleep 60", background=True)
    Sandbox.kill(sandbox.sandbox_id)
    with pytest.raises(SandboxNotRunningException, match="end of life while the request"):
        handle.wait()
    with pytest.raises(SandboxNotRunningException, match="was not found"):
        sandbox.commands.run("true")


def test_a_killed_sandbox_drops_the_connection_of_its_stream(
    e2b_daemon: E2BDaemon, sandbox: Sandbox
) -> None:
    """On the wire: the start event, then the connection dropped with no end of stream (an
    ``unavailable`` end is no dropped connection for e2b 2.45: its generic timeout error)."""
    host, port = e2b_daemon.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    message = {"process": {"cmd": "/bin/sleep", "args": ["60"]}}
    headers = {
        "Content-Type": "application/connect+json",
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-Access-Token": sandbox._envd_access_token or "",
    }
    connection.request("POST", "/process.Process/Start", wire.envelope(message), headers)
    response = connection.getresponse()
    assert response.status == 200
    header = response.read(5)
    first = json.loads(response.read(int.from_bytes(header[1:], "big")))
    assert header[0] == 0 and "start" in first["event"]
    Sandbox.kill(sandbox.sandbox_id)
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        while response.read(1):  # keepalives may come first; never an end of stream
            pass
    connection.close()


def test_more_commands_than_records(sandbox: Sandbox) -> None:
    """Ended commands are pushed out of the sandbox's records (SANDBOXD_PROCESSES_MAX, 16)
    as new ones start; the running ones stay listed."""
    handle = sandbox.commands.run("sleep 60", background=True)
    try:
        for n in range(20):
            assert sandbox.commands.run(f"echo {n}").stdout == f"{n}\n"
        assert [p.pid for p in sandbox.commands.list()] == [handle.pid]
    finally:
        handle.kill()


def test_one_command_too_many_is_the_sdks_rate_limit(sandbox: Sandbox) -> None:
    """The 17th running command (SANDBOXD_PROCESSES_MAX, 16) is refused at its start as a
    rate limit, and the sandbox lives on."""
    running = [sandbox.commands.run("sleep 120", background=True) for _ in range(16)]
    try:
        with pytest.raises(RateLimitException, match="processes are running"):
            sandbox.commands.run("echo one too many")
    finally:
        for handle in running:
            handle.kill()
    # A kill is sent, not yet seen: each killed command counts until its end is read.
    deadline = time.monotonic() + 60
    while sandbox.commands.list():
        assert time.monotonic() < deadline, sandbox.commands.list()
        time.sleep(0.05)
    assert sandbox.commands.run("echo still here").stdout == "still here\n"
