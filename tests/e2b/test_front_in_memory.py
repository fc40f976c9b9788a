"""The E2B front over ``StubTreq`` with no header gate (``SANDBOXD_AUTH_GATE=off``): its own
checks of keys and tokens, its error mapping, and the Connect calls the SDK does not make the
way a test needs (tags, malformed headers, processes it did not start)."""

from __future__ import annotations

import base64
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.logger import ILogObserver, globalLogPublisher
from zope.interface import provider

from sandboxd.core.exec.spec import ExecSpec
from sandboxd.core.files import entries
from sandboxd.core.watch.watch import WatchEvent
from sandboxd.e2b import files, process, wire
from sandboxd.e2b.paths import place_of
from sandboxd.e2b.registry import E2BSandbox
from sandboxd.isolation.none import session_wrapper
from tests.e2b.memory import Memory, Stream, memory_front, read_frames
from tests.http.http_harness import pump, result_of


@pytest.fixture
def settings() -> dict[str, str]:
    """Daemon options beyond the harness's (a test parametrises it to change them)."""
    return {}


@pytest.fixture
def memory(tmp_path: Path, settings: dict[str, str]) -> Iterator[Memory]:
    yield from memory_front(str(tmp_path), **settings)


def connect_error(reply: Any) -> tuple[int, str]:
    body = reply.json()
    assert set(body) == {"code", "message"} and isinstance(body["message"], str), body
    return reply.status, body["code"]


def rest_error(reply: Any) -> tuple[int, str]:
    body = reply.json()
    assert set(body) == {"code", "message"} and body["code"] == reply.status, body
    return reply.status, body["message"]


# Keys and tokens, without the gate


def test_the_control_plane_refuses_a_wrong_key_itself(memory: Memory) -> None:
    status, message = rest_error(memory.control("GET", "/v2/sandboxes", key="nope"))
    assert status == 401 and "X-API-Key" in message
    assert memory.control("GET", "/v2/sandboxes").status == 200


def test_envd_refuses_another_sandboxs_token_itself(memory: Memory) -> None:
    mine, other = memory.create(), memory.create()
    stolen = {"X-Access-Token": other.token}
    reply = memory.rpc(mine, "filesystem.Filesystem/Stat", {"path": "/home/user"}, stolen)
    assert connect_error(reply) == (401, "unauthenticated")
    download = memory.call("GET", "/files?path=x", headers=memory.envd_headers(mine, **stolen))
    assert rest_error(download) == (401, "the access token is not this sandbox's")
    assert memory.rpc(mine, "filesystem.Filesystem/Stat", {"path": "/home/user"}).status == 200


def test_envd_answers_a_sandbox_it_does_not_hold_itself(memory: Memory) -> None:
    """What the gate answers at the headers (tests/unit/test_unit_e2b_admit.py), the routes
    answer themselves where no gate judged (``SANDBOXD_AUTH_GATE=off``) or the sandbox went
    between the headers and the route."""
    gone = {"E2b-Sandbox-Id": "nosuch", "X-Access-Token": "x"}
    assert rest_error(memory.call("GET", "/health", headers=gone)) == (
        502,
        "The sandbox nosuch was not found",
    )
    unnamed = memory.call("GET", "/health", headers={})
    assert rest_error(unnamed) == (400, "the E2b-Sandbox-Id header is required")
    signed = "/files?path=x&signature=v1_x"
    assert rest_error(memory.call("GET", signed, headers={"E2b-Sandbox-Id": "nosuch"}))[0] == 502


# Control plane


def test_connect_extends_a_sandboxs_life_and_never_shortens_it(memory: Memory) -> None:
    entry = memory.create(timeout=100)
    memory.clock.advance(40)
    reply = memory.control("POST", f"/sandboxes/{entry.id}/connect", {})
    assert reply.status == 200 and reply.json()["sandboxID"] == entry.id
    assert entry.end_at == 100
    memory.control("POST", f"/sandboxes/{entry.id}/connect", {"timeout": 30})
    assert entry.end_at == 100, "E2B's connect only extends"
    memory.control("POST", f"/sandboxes/{entry.id}/connect", {"timeout": 90})
    assert entry.end_at == 130
    memory.clock.advance(89)
    assert entry.id in memory.manager.sandboxes
    memory.clock.advance(1)
    memory.stub.flush()
    assert entry.id not in memory.manager.sandboxes


def test_a_listing_refuses_a_malformed_query_and_takes_a_naive_time_as_utc(
    memory: Memory,
) -> None:
    memory.clock.advance(1000)
    entry = memory.create()
    listed = memory.control("GET", "/v2/sandboxes?startedAfter=1970-01-01T00:16:40")
    assert [s["sandboxID"] for s in listed.json()] == [entry.id]
    assert memory.control("GET", "/v2/sandboxes?startedAfter=1970-01-01T00:16:41").json() == []
    for query, named in [
        ("order=sideways", "order"),
        ("startedAfter=yesterday", "startedAfter"),
        ("nextToken=x", "nextToken"),
    ]:
        status, message = rest_error(memory.control("GET", f"/v2/sandboxes?{query}"))
        assert status == 400 and named in message


# Error mapping


def write(memory: Memory, entry: E2BSandbox, path: str, data: bytes) -> Any:
    headers = {**memory.envd_headers(entry), "Content-Type": "application/octet-stream"}
    return memory.call("POST", f"/files?path={path}", data=data, headers=headers)


def test_an_upload_onto_a_full_disk_is_507_for_the_sdk(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(source: object, target: object, length: int = 0) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    entry = memory.create()
    monkeypatch.setattr(shutil, "copyfileobj", full)  # the one the workspace copies with
    status, message = rest_error(write(memory, entry, "big", b"x" * 10))
    assert status == 507 and "space" in message  # the SDK's NotEnoughSpaceException


def test_a_core_error_on_a_rest_route_keeps_its_status(memory: Memory) -> None:
    entry = memory.create()
    assert memory.rpc(entry, "filesystem.Filesystem/MakeDir", {"path": "d"}).status == 200
    status, message = rest_error(write(memory, entry, "d", b"x"))
    assert status == 400 and "is a directory" in message  # BadRequest, as on Connect routes


@attrs.frozen
class Broken:
    """File work that fails in a way the core does not expect."""

    error: Exception

    def run(self, identity: Any, work: Any) -> Deferred[Any]:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("the file thread broke"),
        # An EPERM of the isolation layer: internal, never read as bad credentials (401).
        PermissionError(errno.EPERM, "Operation not permitted"),
    ],
)
def test_an_unexpected_error_is_internal_and_logged(memory: Memory, error: Exception) -> None:
    entry = memory.create()
    memory.manager.isolation = attrs.evolve(memory.manager.isolation, fs=Broken(error))
    logged: list[dict[str, Any]] = []

    @provider(ILogObserver)
    def observer(event: dict[str, Any]) -> None:
        logged.append(event)

    globalLogPublisher.addObserver(observer)
    try:
        rpc = memory.rpc(entry, "filesystem.Filesystem/Stat", {"path": "x"})
        rest = memory.call("GET", "/files?path=x", headers=memory.envd_headers(entry))
    finally:
        globalLogPublisher.removeObserver(observer)
    assert connect_error(rpc) == (500, "internal")
    assert rpc.json()["message"] == str(error)
    assert rest_error(rest) == (500, str(error))
    failures = [e for e in logged if "log_failure" in e]
    assert [e["uri"] for e in failures] == [
        b"/filesystem.Filesystem/Stat",
        b"/files?path=x",
    ]
    assert all(e["log_failure"].check(type(error)) for e in failures)


# Files


def test_a_link_is_stated_by_where_it_leads_in_the_sandbox(memory: Memory) -> None:
    entry = memory.create()
    workspace = memory.manager.layout.workspace(entry.id)
    tmp = memory.manager.layout.tmp(entry.id)
    os.makedirs(os.path.join(workspace, "d"))
    with open(os.path.join(workspace, "d", "f"), "w") as f:
        f.write("data")
    os.chmod(os.path.join(workspace, "d", "f"), 0o4640)  # setuid: not in envd's mode
    open(os.path.join(tmp, "t"), "w").close()
    links = {
        "to-file": "d/f",
        "to-dir": "d",
        "chained": "to-file",
        "by-host-path": os.path.join(workspace, "d", "f"),
        "to-tmp": "/tmp/t",
        "dangling": "d/missing",
        "outside": "/etc/passwd",
        "looping": "looping",
        "climbing": "../../etc",
        "through-a-link": "to-dir/f",
    }
    for name, text in links.items():
        os.symlink(text, os.path.join(workspace, name))

    def stated(path: str) -> dict[str, Any]:
        reply = memory.rpc(entry, "filesystem.Filesystem/Stat", {"path": path})
        found: dict[str, Any] = reply.json()["entry"]
        return found

    to_file = stated("to-file")
    assert (to_file["type"], to_file["mode"]) == ("FILE_TYPE_FILE", 0o640)
    assert to_file["symlinkTarget"] == "/home/user/d/f" and "isSymlink" not in to_file
    assert to_file["permissions"] == "Lrwxrwxrwx" and to_file["path"] == "/home/user/to-file"
    assert to_file["size"] == len("d/f")  # the link's own, as envd's Lstat
    for name, kind, target in [
        ("to-dir", "FILE_TYPE_DIRECTORY", "/home/user/d"),
        ("chained", "FILE_TYPE_FILE", "/home/user/d/f"),
        ("by-host-path", "FILE_TYPE_FILE", "/home/user/d/f"),
        ("to-tmp", "FILE_TYPE_FILE", "/tmp/t"),
    ]:
        assert (stated(name)["type"], stated(name)["symlinkTarget"]) == (kind, target), name
    for nowhere in ("dangling", "outside", "looping", "climbing", "through-a-link"):
        found = stated(nowhere)
        assert found["type"] == "FILE_TYPE_UNSPECIFIED" and found["mode"] == 0, nowhere
        assert found["symlinkTarget"] == f"/home/user/{nowhere}", nowhere
    directory = stated("d")
    assert (directory["mode"], directory["permissions"]) == (0o755, "drwxr-xr-x")
    assert "symlinkTarget" not in directory
    listed = memory.rpc(entry, "filesystem.Filesystem/ListDir", {"path": "/home/user"})
    types = {e["name"]: e["type"] for e in listed.json()["entries"]}
    assert types["to-dir"] == "FILE_TYPE_DIRECTORY" and types["dangling"] == "FILE_TYPE_UNSPECIFIED"


def test_an_upload_replaces_a_link_and_refuses_what_is_not_a_file(memory: Memory) -> None:
    entry = memory.create()
    workspace = memory.manager.layout.workspace(entry.id)
    with open(os.path.join(workspace, "target"), "w") as f:
        f.write("untouched")
    os.symlink("target", os.path.join(workspace, "link"))
    os.mkfifo(os.path.join(workspace, "fifo"))
    assert write(memory, entry, "link", b"replaced").status == 200
    assert not os.path.islink(os.path.join(workspace, "link"))
    with open(os.path.join(workspace, "link")) as f:
        assert f.read() == "replaced"
    with open(os.path.join(workspace, "target")) as f:
        assert f.read() == "untouched"
    assert rest_error(write(memory, entry, "fifo", b"x")) == (400, "/fifo: is not a regular file")
    assert rest_error(write(memory, entry, "/home/user", b"x")) == (400, "/: is a directory")


def test_an_event_without_a_name_is_not_told() -> None:
    root = place_of("/home/user/d")
    assert files.watch_event(root, WatchEvent("overflow")) is None
    assert files.watch_event(root, WatchEvent("chmod", None)) is None
    told = files.watch_event(root, WatchEvent("create", "/d/e/f"))
    assert told == {"name": "e/f", "type": "EVENT_TYPE_CREATE"}


def test_a_killed_sandbox_takes_its_polling_watchers(memory: Memory) -> None:
    entry = memory.create()
    made = memory.rpc(entry, "filesystem.Filesystem/CreateWatcher", {"path": "/home/user"})
    watcher = entry.watchers[made.json()["watcherId"]]
    assert memory.control("DELETE", f"/sandboxes/{entry.id}").status == 204
    assert entry.watchers == {} and watcher.watch.closed


class HeldFiles:
    """File work that waits until the test lets it run."""

    def __init__(self) -> None:
        self.held: list[tuple[Deferred[Any], Any]] = []

    def run(self, identity: Any, work: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.held.append((d, work))
        return d

    def release(self) -> None:
        for d, work in self.held:
            d.callback(work())
        self.held.clear()


def test_a_sandbox_killed_while_its_watch_starts_ends_the_watch_as_not_running(
    memory: Memory,
) -> None:
    entry = memory.create()
    held = HeldFiles()
    memory.manager.isolation = attrs.evolve(memory.manager.isolation, fs=held)
    stream = memory.stream(entry, "filesystem.Filesystem/WatchDir", {"path": "/home/user"})
    assert len(held.held) == 1, "the watch's walk runs in a file thread"
    killed = Deferred.fromCoroutine(memory.manager.kill(entry.id))
    held.release()  # the walk ends after the kill: the watch is already closed
    memory.stub.flush()
    assert result_of(killed) is None
    assert stream.done, "the watch does not wait for a sandbox that is gone"
    assert stream.response.code == 200
    [(flags, answer)] = stream.frames  # the SDK's SandboxNotRunningException
    assert (flags, answer["error"]) == (wire.FLAG_END, wire.error_json(wire.not_running(entry.id)))


# Processes


def start(memory: Memory, entry: E2BSandbox, script: str, **extra: Any) -> Stream:
    headers = extra.pop("headers", None)
    message = {"process": {"cmd": "/bin/sh", "args": ["-c", script]}, **extra}
    return memory.stream(entry, "process.Process/Start", message, headers)


def events(stream: Stream) -> list[dict[str, Any]]:
    return [message["event"] for flags, message in stream.frames if not flags]


@pytest_twisted.ensureDeferred
async def test_a_process_is_found_by_its_tag_and_listed_with_it(memory: Memory) -> None:
    entry = memory.create()
    stream = start(memory, entry, "exec sleep 60", tag="server")
    await stream.until(lambda: len(stream.frames) >= 1)
    native = ExecSpec(("sleep", "60"), {}, (), None, None, ())
    memory.manager.start_process(entry.sandbox, native)  # not the E2B front's: not listed
    listed = memory.rpc(entry, "process.Process/List", {}).json()["processes"]
    assert [(p["tag"], p["config"]["cmd"]) for p in listed] == [("server", "/bin/sh")]
    by_tag = {"process": {"tag": "server"}, "signal": "SIGNAL_SIGKILL"}
    assert memory.rpc(entry, "process.Process/SendSignal", by_tag).status == 200
    frames = await stream.finished()
    assert events(stream)[-1]["end"]["status"] == "signal: killed"
    assert frames[-1] == (wire.FLAG_END, {})
    missing = {"process": {"tag": "nobody"}, "signal": "SIGNAL_SIGKILL"}
    reply = memory.rpc(entry, "process.Process/SendSignal", missing)
    assert connect_error(reply) == (404, "not_found")


@pytest_twisted.ensureDeferred
async def test_malformed_inputs_of_a_running_process_are_refused(memory: Memory) -> None:
    entry = memory.create()
    stream = start(memory, entry, "exec sleep 60", stdin=True)
    await stream.until(lambda: len(stream.frames) >= 1)
    pid = events(stream)[0]["start"]["pid"]
    hup = {"process": {"pid": pid}, "signal": "SIGNAL_SIGHUP"}
    reply = memory.rpc(entry, "process.Process/SendSignal", hup)
    assert connect_error(reply) == (400, "invalid_argument")
    pty = {"process": {"pid": pid}, "input": {"pty": "eA=="}}
    reply = memory.rpc(entry, "process.Process/SendInput", pty)
    assert connect_error(reply) == (400, "failed_precondition")  # no terminal
    resize = {"process": {"pid": pid}, "pty": {"size": {"rows": 5, "cols": 5}}}
    reply = memory.rpc(entry, "process.Process/Update", resize)
    assert connect_error(reply) == (400, "failed_precondition")
    assert memory.rpc(entry, "process.Process/Update", {"process": {"pid": pid}}).status == 200
    kill = {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
    assert memory.rpc(entry, "process.Process/SendSignal", kill).status == 200
    await stream.finished()


def test_a_malformed_command_timeout_or_cwd_is_refused(memory: Memory) -> None:
    entry = memory.create()
    for headers, cwd in (({"Connect-Timeout-Ms": "soon"}, None), (None, "/tmp")):
        message = {"process": {"cmd": "true", **({"cwd": cwd} if cwd else {})}}
        stream = memory.stream(entry, "process.Process/Start", message, headers)
        memory.stub.flush()
        assert stream.done and stream.response.code == 200
        [(flags, answer)] = stream.frames
        assert (flags, answer["error"]["code"]) == (wire.FLAG_END, "invalid_argument")
    assert memory.rpc(entry, "process.Process/List", {}).json() == {"processes": []}


@pytest_twisted.ensureDeferred
async def test_a_malformed_keepalive_interval_is_the_default(memory: Memory) -> None:
    entry = memory.create()
    stream = start(memory, entry, "exec sleep 600", headers={"Keepalive-Ping-Interval": "x"})
    await stream.until(lambda: len(stream.frames) >= 1)
    memory.clock.advance(process.KEEPALIVE_DEFAULT - 1)
    memory.stub.flush()
    assert events(stream) == [{"start": {"pid": events(stream)[0]["start"]["pid"]}}]
    memory.clock.advance(1)
    memory.stub.flush()
    assert events(stream)[-1] == {"keepalive": {}}
    pid = events(stream)[0]["start"]["pid"]
    kill = {"process": {"pid": pid}, "signal": 9}
    assert memory.rpc(entry, "process.Process/SendSignal", kill).status == 200
    await stream.finished()


@pytest_twisted.ensureDeferred
async def test_a_command_that_cannot_start_ends_as_failed_to_start(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    entry = memory.create()
    monkeypatch.setattr(memory.manager.reactor, "spawnProcess", refuse)
    stream = start(memory, entry, "true")
    await stream.finished()
    end = events(stream)[-1]["end"]
    assert (end["exitCode"], end["exited"], end["status"]) == (-1, False, "failed to start")
    assert end["error"] != "failed to start"  # the reason, as the core gives it


class SlowClient:
    """The part of a request :func:`process.follow` writes to, for a client that stops
    reading: it pauses the stream's producer as twisted.web does when the socket is full."""

    channel = object()

    def __init__(self) -> None:
        self.written = bytearray()
        self.producer: Any = None

    def getHeader(self, name: bytes) -> bytes | None:
        return None

    def setResponseCode(self, code: int) -> None:
        assert code == 200

    def setHeader(self, name: bytes, value: bytes) -> None:
        pass

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self.producer = producer

    def unregisterProducer(self) -> None:
        self.producer = None

    def write(self, data: bytes) -> None:
        self.written.extend(data)


@pytest.mark.parametrize("settings", [{"process-log-max": "4k"}])
@pytest_twisted.ensureDeferred
async def test_a_reader_paused_past_the_log_loses_the_oldest_output_and_still_ends(
    memory: Memory,
) -> None:
    entry = memory.create()
    script = "for i in $(seq 1000); do echo line-$i; done"  # 8.9 kB: over the log
    spec = ExecSpec(("/bin/sh", "-c", script), {}, (), None, None, (), as_home=True)
    running = memory.manager.start_process(entry.sandbox, spec)
    client = SlowClient()
    followed = Deferred.fromCoroutine(
        process.follow(memory.manager, entry, client, running, 0)  # type: ignore[arg-type]
    )
    client.producer.pauseProducing()  # before the first byte comes out
    await pump(memory.stub, lambda: running.end is not None)
    assert len(client.written) == len(wire.start_event(running.pid or 0))
    client.producer.resumeProducing()
    await followed
    frames = read_frames(bytes(client.written))
    out = b"".join(base64.b64decode(m["event"]["data"]["stdout"]) for _, m in frames[1:-2])
    assert out.endswith(b"line-999\nline-1000\n") and 0 < len(out) <= 4096
    assert not out.startswith(b"line-1\n"), "the oldest output fell out of the log"
    assert frames[-2][1]["event"]["end"]["exitCode"] == 0
    assert frames[-1] == (wire.FLAG_END, {})


def test_a_listing_past_its_caps_is_invalid_argument_naming_them(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = memory.create()
    os.makedirs(os.path.join(memory.manager.layout.workspace(entry.id), "a", "b"))
    listing = "filesystem.Filesystem/ListDir"
    too_deep = memory.rpc(entry, listing, {"path": "/home/user", "depth": 101})
    assert connect_error(too_deep) == (400, "invalid_argument")
    assert too_deep.json()["message"] == "depth: at most 100"
    assert (
        len(memory.rpc(entry, listing, {"path": "/home/user", "depth": 100}).json()["entries"]) == 2
    )
    monkeypatch.setattr(entries, "LISTING_BYTES_MAX", entries.ENTRY_BYTES)
    too_large = memory.rpc(entry, listing, {"path": "/home/user", "depth": 2})
    assert connect_error(too_large) == (400, "invalid_argument")
    assert too_large.json()["message"].startswith("/home/user: the listing passes 256 bytes")


def test_a_pty_without_the_exec_helper_is_unimplemented(memory: Memory) -> None:
    # The shell chain's setsid forks away from the terminal: no terminals without the helper.
    object.__setattr__(
        memory.manager,
        "isolation",
        attrs.evolve(memory.manager.isolation, wrap=session_wrapper("/usr/bin/setsid")),
    )
    entry = memory.create()
    message = {"process": {"cmd": "/bin/sh"}, "pty": {"size": {"rows": 24, "cols": 80}}}
    stream = memory.stream(entry, "process.Process/Start", message)
    memory.stub.flush()
    [(flags, answer)] = stream.frames
    assert (flags, answer["error"]["code"]) == (wire.FLAG_END, "unimplemented")
    assert "exec helper" in answer["error"]["message"]
