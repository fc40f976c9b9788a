"""``POST /sandboxes/{rid}/exec``: real commands, in-memory HTTP, timers on a ``Clock``.

Commands really run (the real reactor's ``spawnProcess``), but the deadline, silence and
keepalive timers only move when a test advances the harness clock, so nothing here depends on
how fast the machine is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet.defer import fail

from sandboxd.core.exec.run import ExecRun
from tests.http.http_harness import ExecStream, Harness, b64, unb64

SHA = "ab" * 32


@pytest.fixture
def rid(harness: Harness) -> str:
    return harness.create()


def the_run(harness: Harness, rid: str) -> ExecRun:
    (run,) = harness.manager.sandboxes[rid].running
    return run


async def started(harness: Harness, rid: str, stream: ExecStream) -> ExecRun:
    """Wait until the command has been spawned (a spawn server has answered its pid); its run."""
    running = harness.manager.sandboxes[rid].running
    await stream.until(lambda: bool(running) and the_run(harness, rid).pid is not None)
    run = the_run(harness, rid)
    assert run.pid is not None
    return run


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def run_to_end(harness: Harness, rid: str, body: dict[str, object]) -> dict[str, object]:
    return await harness.exec(rid, body).finished()


@pytest_twisted.ensureDeferred
async def test_output_streams_and_the_final_frame_keeps_stdout_and_stderr_apart(
    harness: Harness, rid: str
) -> None:
    stream = harness.exec(rid, {"cmd": ["sh", "-c", "echo out1; echo err1 >&2; echo out2; exit 3"]})
    last = await stream.finished()
    assert set(last) == {"exit", "out", "err"}
    assert last["exit"] == 3
    assert unb64(last["out"]) == b"out1\nout2\n"
    assert unb64(last["err"]) == b"err1\n"
    assert sorted(stream.live.splitlines()) == [b"err1", b"out1", b"out2"]
    assert len(stream.frames) >= 2
    # Bookkeeping: one exec counted, nothing left running.
    assert harness.manager.sandboxes[rid].execs == 1
    assert harness.manager.sandboxes[rid].running == set()


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("split", [True, False], ids=["split", "interleaved"])
async def test_split_sends_live_stderr_in_e_frames(harness: Harness, rid: str, split: bool) -> None:
    script = "echo out1; echo err1 >&2; echo out2"
    stream = harness.exec(rid, {"cmd": ["sh", "-c", script], "split": split})
    last = await stream.finished()
    stderr = b"".join(unb64(f["e"]) for f in stream.frames if "e" in f)
    if split:
        assert (stream.live, stderr) == (b"out1\nout2\n", b"err1\n")
    else:  # the old stream, byte for byte: no e frame
        assert (sorted(stream.live.splitlines()), stderr) == ([b"err1", b"out1", b"out2"], b"")
    assert unb64(last["err"]) == b"err1\n"


def test_split_must_be_a_boolean(harness: Harness, rid: str) -> None:
    reply = harness.call(
        "POST", f"/sandboxes/{rid}/exec", json_body={"cmd": ["true"], "split": "yes"}
    )
    assert reply.status == 400
    assert "split" in reply.json()["detail"]


@pytest.mark.parametrize(
    ("cmd", "code"),
    [
        (["true"], 0),
        (["no-such-command-anywhere"], 127),
        (["sh", "-c", "kill -TERM $$"], 128 + 15),
        (["sh", "-c", "kill -KILL $$"], 128 + 9),
        (["sh", "-c", "exit 42"], 42),
    ],
)
@pytest_twisted.ensureDeferred
async def test_exit_codes_follow_the_shell(
    harness: Harness, rid: str, cmd: list[str], code: int
) -> None:
    last = await run_to_end(harness, rid, {"cmd": cmd})
    assert last["exit"] == code


@pytest_twisted.ensureDeferred
async def test_not_executable_is_126(harness: Harness, rid: str) -> None:
    script = Path(harness.workspace(rid)) / "script"
    script.write_text("#!/bin/sh\necho never\n")
    script.chmod(0o644)
    last = await run_to_end(harness, rid, {"cmd": ["./script"]})
    assert last["exit"] == 126
    assert unb64(last["out"]) == b""


@pytest_twisted.ensureDeferred
async def test_timeout_field_gives_124_and_kills_the_process(harness: Harness, rid: str) -> None:
    stream = harness.exec(rid, {"cmd": ["sleep", "300"], "timeout": 0.5})
    run = await started(harness, rid, stream)
    harness.clock.advance(0.4)
    assert not run.ended
    harness.clock.advance(0.1)
    last = await stream.finished()
    assert last["exit"] == 124
    assert gone(run.pid)  # type: ignore[arg-type]


class TestHostLimits:
    @pytest.fixture
    def settings(self, settings: dict[str, str]) -> dict[str, str]:
        return {**settings, "exec-timeout": "2s", "log-timeout": "1.5s", "keepalive": "0.5s"}

    @pytest_twisted.ensureDeferred
    async def test_the_host_limit_caps_a_longer_timeout(self, harness: Harness, rid: str) -> None:
        stream = harness.exec(rid, {"cmd": ["sh", "-c", "while :; do echo x; sleep 0.2; done"]})
        run = await started(harness, rid, stream)
        # Output keeps arriving, so only the deadline can end it.
        await stream.until(lambda: stream.live.count(b"x") >= 2)
        harness.clock.advance(1)
        await stream.until(lambda: stream.live.count(b"x") >= 4)
        assert not run.ended
        harness.clock.advance(1)
        last = await stream.finished()
        assert last["exit"] == 124
        assert gone(run.pid)  # type: ignore[arg-type]

    @pytest_twisted.ensureDeferred
    async def test_silence_gives_124(self, harness: Harness, rid: str) -> None:
        stream = harness.exec(
            rid, {"cmd": ["sh", "-c", "echo start; exec sleep 300"], "timeout": 100}
        )
        run = await started(harness, rid, stream)
        await stream.until(lambda: b"start" in stream.live)
        harness.clock.advance(1.5)
        last = await stream.finished()
        assert last["exit"] == 124
        assert unb64(last["out"]) == b"start\n"
        assert gone(run.pid)  # type: ignore[arg-type]

    @pytest_twisted.ensureDeferred
    async def test_keepalive_frames_while_quiet(self, harness: Harness, rid: str) -> None:
        stream = harness.exec(rid, {"cmd": ["sh", "-c", "echo start; exec sleep 300"]})
        await started(harness, rid, stream)
        await stream.until(lambda: b"start" in stream.live)
        before = len(stream.frames)
        harness.clock.advance(0.5)
        await stream.until(lambda: len(stream.frames) == before + 1)
        harness.clock.advance(0.5)
        await stream.until(lambda: len(stream.frames) == before + 2)
        assert stream.frames[before:] == [{"o": ""}, {"o": ""}]
        harness.clock.advance(1.5)
        last = await stream.finished()
        assert last["exit"] == 124


class TestOutputCap:
    @pytest.fixture
    def settings(self, settings: dict[str, str]) -> dict[str, str]:
        return {**settings, "max-output": "8"}

    @pytest_twisted.ensureDeferred
    async def test_buffers_are_capped_the_live_stream_is_not(
        self, harness: Harness, rid: str
    ) -> None:
        cmd = "printf 0123456789abcdef; printf ABCDEFGHIJ >&2"
        stream = harness.exec(rid, {"cmd": ["sh", "-c", cmd]})
        last = await stream.finished()
        assert last["truncated"] is True
        assert unb64(last["out"]) == b"01234567"
        assert unb64(last["err"]) == b"ABCDEFGH"
        assert sorted(stream.live) == sorted(b"0123456789abcdefABCDEFGHIJ")

    @pytest_twisted.ensureDeferred
    async def test_output_at_the_cap_is_not_truncated(self, harness: Harness, rid: str) -> None:
        last = await run_to_end(harness, rid, {"cmd": ["printf", "12345678"]})
        assert "truncated" not in last
        assert unb64(last["out"]) == b"12345678"


def environment(last: dict[str, object]) -> dict[str, str]:
    out = unb64(str(last["out"])).decode()
    return dict(line.split("=", 1) for line in out.splitlines())


@pytest_twisted.ensureDeferred
async def test_environment_is_built_from_scratch(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOXD_TEST_CANARY", "leaked")
    reply = harness.call("POST", "/sandboxes", json_body={"env": {"FROM_CREATE": "c"}})
    rid = reply.json()["remote_id"]
    env = environment(await run_to_end(harness, rid, {"cmd": ["env"]}))
    layout = harness.manager.layout
    assert env["TERM"] == "dumb"
    assert env["HOME"] == layout.home(rid)
    assert env["TMPDIR"] == layout.tmp(rid)
    assert env["LANG"] == "C.UTF-8"
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert env["FROM_CREATE"] == "c"
    assert "SANDBOXD_TEST_CANARY" not in env
    expected = {"TERM", "HOME", "TMPDIR", "LANG", "PATH", "FROM_CREATE"}
    assert expected <= set(env) <= expected | {"PWD", "SHLVL", "_"}


@pytest_twisted.ensureDeferred
async def test_exec_env_is_applied_last(harness: Harness) -> None:
    create = {"env": {"SHARED": "create", "ONLY_CREATE": "c", "TERM": "vt100"}}
    rid = harness.call("POST", "/sandboxes", json_body=create).json()["remote_id"]
    exec_env = {"SHARED": "exec", "PATH": "/opt/x:/usr/bin:/bin", "HOME": "/elsewhere", "E": "="}
    env = environment(await run_to_end(harness, rid, {"cmd": ["env"], "env": exec_env}))
    assert env["SHARED"] == "exec"
    assert env["ONLY_CREATE"] == "c"
    assert env["TERM"] == "vt100"
    assert env["PATH"] == "/opt/x:/usr/bin:/bin"
    assert env["HOME"] == "/elsewhere"
    assert env["E"] == "="
    # Absent and {} mean the same.
    empty = environment(await run_to_end(harness, rid, {"cmd": ["env"], "env": {}}))
    absent = environment(await run_to_end(harness, rid, {"cmd": ["env"]}))
    assert empty == absent


@pytest_twisted.ensureDeferred
async def test_stdin_is_dev_null_unless_given(harness: Harness, rid: str) -> None:
    last = await run_to_end(harness, rid, {"cmd": ["readlink", "/proc/self/fd/0"]})
    assert unb64(last["out"]) == b"/dev/null\n"
    last = await run_to_end(harness, rid, {"cmd": ["cat"]})
    assert (last["exit"], unb64(last["out"])) == (0, b"")
    data = bytes(range(256)) * 10
    last = await run_to_end(harness, rid, {"cmd": ["cat"], "stdin": b64(data)})
    assert unb64(last["out"]) == data
    last = await run_to_end(harness, rid, {"cmd": ["wc", "-c"], "stdin": ""})
    assert unb64(last["out"]).strip() == b"0"


@pytest_twisted.ensureDeferred
async def test_cwd_is_workspace_relative(harness: Harness, rid: str) -> None:
    ws = harness.workspace(rid)
    os.makedirs(os.path.join(ws, "sub", "dir"))
    last = await run_to_end(harness, rid, {"cmd": ["pwd"]})
    assert unb64(last["out"]).decode().strip() == ws
    for cwd in ["sub/dir", "/sub/dir", "sub/./dir/", "sub/x/../dir"]:
        last = await run_to_end(harness, rid, {"cmd": ["pwd"], "cwd": cwd})
        assert unb64(last["out"]).decode().strip() == os.path.join(ws, "sub", "dir"), cwd
    last = await run_to_end(harness, rid, {"cmd": ["pwd"], "cwd": "missing"})
    assert last["exit"] != 0
    assert unb64(last["out"]) == b""


@pytest_twisted.ensureDeferred
async def test_tools_put_their_bin_on_path(harness: Harness, rid: str) -> None:
    bindir = Path(harness.config.tools_dir) / SHA / "bin"
    bindir.mkdir(parents=True)
    tool = bindir / "hello-tool"
    tool.write_text("#!/bin/sh\necho hello from the tool\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    last = await run_to_end(harness, rid, {"cmd": ["hello-tool"], "tools": [SHA]})
    assert unb64(last["out"]) == b"hello from the tool\n"
    env = environment(await run_to_end(harness, rid, {"cmd": ["env"], "tools": [SHA]}))
    assert env["PATH"] == f"{bindir}:/usr/local/bin:/usr/bin:/bin"


def test_unknown_tool_is_400(harness: Harness, rid: str) -> None:
    reply = harness.call(
        "POST", f"/sandboxes/{rid}/exec", json_body={"cmd": ["true"], "tools": [SHA]}
    )
    assert reply.error() == (400, "BadRequest")
    assert harness.manager.sandboxes[rid].running == set()
    assert harness.manager.sandboxes[rid].execs == 0


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"cmd": []},
        {"cmd": "ls"},
        {"cmd": [1]},
        {"cmd": ["ls", None]},
        {"cmd": ["a\u0000b"]},
        {"cmd": ["true"], "env": ["A=1"]},
        {"cmd": ["true"], "env": {"A=B": "1"}},
        {"cmd": ["true"], "env": {"A\u0000": "1"}},
        {"cmd": ["true"], "env": {"": "1"}},
        {"cmd": ["true"], "env": {"A": 1}},
        {"cmd": ["true"], "env": {"A": "1\u0000"}},
        {"cmd": ["true"], "timeout": "1"},
        {"cmd": ["true"], "timeout": True},
        {"cmd": ["true"], "timeout": 0},
        {"cmd": ["true"], "timeout": -1},
        {"cmd": ["true"], "stdin": 5},
        {"cmd": ["true"], "stdin": "not base64!"},
        {"cmd": ["true"], "tools": SHA},
        {"cmd": ["true"], "tools": ["abc"]},
        {"cmd": ["true"], "tools": [1]},
        {"cmd": ["true"], "cwd": 5},
        {"cmd": ["true"], "cwd": 0},
        {"cmd": ["true"], "cwd": False},
        {"cmd": ["true"], "cwd": ".."},
        {"cmd": ["true"], "cwd": "a/../../x"},
        {"cmd": ["true"], "cwd": "a\u0000"},
    ],
)
def test_bad_exec_bodies_are_400_and_run_nothing(
    harness: Harness, rid: str, body: dict[str, object]
) -> None:
    reply = harness.call("POST", f"/sandboxes/{rid}/exec", json_body=body)
    assert reply.error() == (400, "BadRequest")
    assert harness.manager.sandboxes[rid].execs == 0


@pytest_twisted.ensureDeferred
async def test_a_disconnecting_client_kills_the_command(harness: Harness, rid: str) -> None:
    stream = harness.exec(rid, {"cmd": ["sh", "-c", "echo started; exec sleep 300"]})
    run = await started(harness, rid, stream)
    await stream.until(lambda: b"started" in stream.live)
    stream.disconnect()
    await stream.until(lambda: run.ended)
    assert gone(run.pid)  # type: ignore[arg-type]
    assert harness.manager.sandboxes[rid].running == set()
    # The sandbox itself lives on.
    last = await run_to_end(harness, rid, {"cmd": ["true"]})
    assert last["exit"] == 0


@pytest_twisted.ensureDeferred
async def test_killing_the_sandbox_ends_its_exec(harness: Harness, rid: str) -> None:
    stream = harness.exec(rid, {"cmd": ["sh", "-c", "echo started; exec sleep 300"]})
    run = await started(harness, rid, stream)
    await stream.until(lambda: b"started" in stream.live)
    assert harness.call("DELETE", f"/sandboxes/{rid}").status == 204
    last = await stream.finished()
    assert last["exit"] == 128 + 9
    assert gone(run.pid)  # type: ignore[arg-type]


@pytest_twisted.ensureDeferred
async def test_a_host_failure_travels_in_band(
    harness: Harness, rid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ExecRun, "when_finished", lambda self: fail(RuntimeError("host broke")))
    stream = harness.exec(rid, {"cmd": ["sleep", "300"]})
    last = await stream.finished()
    assert last == {"error": "RuntimeError", "detail": "host broke"}
    run = the_run(harness, rid) if harness.manager.sandboxes[rid].running else None
    if run is not None:
        await stream.until(lambda: run.ended)
        assert gone(run.pid)  # type: ignore[arg-type]


@pytest_twisted.ensureDeferred
async def test_exec_counts_as_activity(harness: Harness, rid: str) -> None:
    harness.clock.advance(50)
    await run_to_end(harness, rid, {"cmd": ["echo", "hi"]})
    (entry,) = harness.call("GET", "/sandboxes").json()["sandboxes"]
    assert entry["execs"] == 1
    assert entry["last_active"] == 50.0


@pytest_twisted.ensureDeferred
async def test_binary_output_survives(harness: Harness, rid: str) -> None:
    data = bytes(range(256))
    Path(harness.workspace(rid), "bin").write_bytes(data)
    last = await run_to_end(harness, rid, {"cmd": ["cat", "bin"]})
    assert unb64(last["out"]) == data


@pytest_twisted.ensureDeferred
async def test_the_daemon_waits_for_open_streams_to_write_their_last_frame(
    harness: Harness, rid: str
) -> None:
    assert harness.api.streams_written().called  # none open
    stream = harness.exec(rid, {"cmd": ["sh", "-c", "echo started; exec sleep 300"]})
    await started(harness, rid, stream)
    written = harness.api.streams_written()
    assert not written.called
    assert harness.call("DELETE", f"/sandboxes/{rid}").status == 204
    last = await stream.finished()
    assert last["exit"] == 128 + 9
    await written
