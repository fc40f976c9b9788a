"""Background processes and workspace watch over a real port (docs/extensions.rst, issue 17).

Real ``twistd sandboxd`` daemons, real commands; no timed assertions: every wait is for an
event (a frame, an exit), bounded by an outer deadline only so that a broken daemon fails the
test instead of hanging it.
"""

import base64
import contextlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd_client._handles import encode_handle
from tests.support.daemon import REPO, Daemon, free_port, start_daemon, stop_daemon


@pytest.fixture
def small_log(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon whose process logs keep 4 KiB and whose tables keep 3 records."""
    running = start_daemon(
        tmp_path,
        "--isolation=none",
        "--keepalive=1s",
        "--process-log-max=4K",
        "--processes-max=3",
        "--watch-max=2",
    )
    try:
        yield running
    finally:
        stop_daemon(running)


def start(daemon: Daemon, rid: str, cmd: list[str], **fields: Any) -> str:
    reply = daemon.json("POST", f"/sandboxes/{rid}/processes", {"cmd": cmd, **fields})
    assert isinstance(reply["pid"], int)
    return str(reply["id"])


class Lines:
    """A streaming GET whose NDJSON frames are read one at a time."""

    def __init__(self, daemon: Daemon, path: str) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
        self.connection.request("GET", path)
        self.response = self.connection.getresponse()
        self.status = self.response.status

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            line = self.response.readline()
            if not line:
                return
            yield json.loads(line)

    def close(self) -> None:
        self.connection.close()


def output(daemon: Daemon, rid: str, pid: str, offset: int = 0, follow: bool = True) -> list[Any]:
    stream = Lines(
        daemon,
        f"/sandboxes/{rid}/processes/{pid}/output?offset={offset}&follow={str(follow).lower()}",
    )
    try:
        assert stream.status == 200
        return [frame for frame in stream if frame]
    finally:
        stream.close()


def data_of(frames: list[dict[str, Any]], keys: str = "oe") -> bytes:
    return b"".join(base64.b64decode(f[k]) for f in frames for k in keys if k in f)


def test_a_background_server_is_reached_by_a_later_exec(daemon: Daemon) -> None:
    rid = daemon.create()
    port = free_port()
    server = start(daemon, rid, ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"])
    daemon.call("PUT", f"/sandboxes/{rid}/file?path=hello.txt", raw=b"served from the sandbox")
    fetch = (
        "import time, urllib.request\n"
        "for _ in range(600):\n"
        "    try:\n"
        f"        print(urllib.request.urlopen('http://127.0.0.1:{port}/hello.txt').read().decode())\n"
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(0.05)\n"
    )
    _, body = daemon.call("POST", f"/sandboxes/{rid}/exec", {"cmd": ["python3", "-c", fetch]})
    final = json.loads(body.splitlines()[-1])
    assert final["exit"] == 0 and base64.b64decode(final["out"]) == b"served from the sandbox\n"
    listed = daemon.json("GET", f"/sandboxes/{rid}/processes")["processes"]
    assert [(p["id"], p["running"]) for p in listed] == [(server, True)]
    assert (
        daemon.call("POST", f"/sandboxes/{rid}/processes/{server}/signal", {"signal": "TERM"})[0]
        == 204
    )
    assert output(daemon, rid, server)[-1] == {"exit": 128 + 15}


def test_a_follower_that_reconnects_resumes_at_its_offset(daemon: Daemon) -> None:
    rid = daemon.create()
    script = (
        "for i in $(seq 1 300); do echo line $i;"
        " [ $((i % 50)) = 0 ] && echo err $i >&2; sleep 0.002; done"
    )
    pid = start(daemon, rid, ["sh", "-c", script])
    got = b""
    offset = 0
    end = None
    reconnects = 0
    while end is None:
        stream = Lines(
            daemon, f"/sandboxes/{rid}/processes/{pid}/output?offset={offset}&follow=true"
        )
        for index, frame in enumerate(stream):
            if "exit" in frame:
                end = frame["exit"]
                break
            if "at" in frame:
                assert frame["at"] == offset  # no gap, no overlap
                chunk = data_of([frame])
                got += chunk
                offset += len(chunk)
            if index == 3:
                reconnects += 1
                break  # the connection drops mid-stream
        stream.close()
    expected = subprocess.run(["sh", "-c", script], capture_output=True, check=True)
    assert end == 0 and reconnects >= 2
    lines = got.splitlines(keepends=True)
    assert b"".join(line for line in lines if line.startswith(b"line")) == expected.stdout
    assert b"".join(line for line in lines if line.startswith(b"err")) == expected.stderr
    assert len(got) == len(expected.stdout) + len(expected.stderr)


def test_signal_int_stops_a_python_loop_with_130(daemon: Daemon) -> None:
    rid = daemon.create()
    loop = "import sys, time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.05)\n"
    pid = start(daemon, rid, ["python3", "-c", loop])
    stream = Lines(daemon, f"/sandboxes/{rid}/processes/{pid}/output?follow=true")
    frames = iter(stream)
    first = next(f for f in frames if f)
    assert base64.b64decode(first["o"]) == b"ready\n"
    assert (
        daemon.call("POST", f"/sandboxes/{rid}/processes/{pid}/signal", {"signal": "INT"})[0] == 204
    )
    rest = [f for f in frames if f]
    stream.close()
    assert rest[-1] == {"exit": 130}
    assert b"KeyboardInterrupt" in data_of(rest, "e")
    (record,) = daemon.json("GET", f"/sandboxes/{rid}/processes")["processes"]
    assert record["running"] is False and record["exit"] == 130


def test_stdin_is_written_then_closed(daemon: Daemon) -> None:
    rid = daemon.create()
    pid = start(daemon, rid, ["sh", "-c", "cat; echo done"], stdin=True)
    base = f"/sandboxes/{rid}/processes/{pid}"
    assert daemon.call("POST", base + "/stdin", raw=b"one ")[0] == 204
    assert daemon.call("POST", base + "/stdin", raw=b"two\n")[0] == 204
    assert daemon.call("DELETE", base + "/stdin")[0] == 204
    status, body = daemon.call("POST", base + "/stdin", raw=b"late")
    assert status == 409 and json.loads(body)["error"] == "Conflict"
    frames = output(daemon, rid, pid)
    assert data_of(frames) == b"one two\ndone\n" and frames[-1] == {"exit": 0}


def test_writers_of_a_stdin_nobody_reads_hold_one_chunk_in_the_daemon(daemon: Daemon) -> None:
    """Twelve callers each send 16 MiB to the stdin of a command that never reads it: one
    chunk waits in the daemon for the pipe, the other bodies wait unread (without the turn
    every body was in the daemon's memory at once: 192 MiB)."""
    rid = daemon.create()
    pid = start(daemon, rid, ["sleep", "120"], stdin=True)
    base = f"/sandboxes/{rid}/processes/{pid}"
    chunk = b"x" * (16 << 20)
    before = daemon.rss_kib()
    answers: list[int] = []

    def send() -> None:
        answers.append(daemon.call("POST", base + "/stdin", raw=chunk)[0])

    senders = [threading.Thread(target=send) for _ in range(12)]
    for sender in senders:
        sender.start()
    time.sleep(3)  # every body sent: the daemon holds what it holds
    held = daemon.rss_kib() - before
    assert daemon.call("POST", base + "/signal", {"signal": "KILL"})[0] == 204
    for sender in senders:
        sender.join(60)
    print(f"\n12 x 16 MiB to an unread stdin: daemon RSS +{held} KiB")
    assert held < 64 * 1024, held
    assert len(answers) == 12 and set(answers) <= {204, 409}, answers  # 409: it had ended


def test_bad_input_answers(daemon: Daemon) -> None:
    rid = daemon.create()
    pid = start(daemon, rid, ["sleep", "30"])
    base = f"/sandboxes/{rid}/processes"
    status, body = daemon.call("POST", f"{base}/{pid}/stdin", raw=b"x")
    assert status == 409  # started without stdin: true
    status, body = daemon.call("POST", f"{base}/{pid}/signal", {"signal": "SEGV"})
    assert status == 400 and json.loads(body)["error"] == "BadRequest"
    for method, route in [("GET", "output"), ("POST", "signal"), ("DELETE", "stdin")]:
        status, body = daemon.call(method, f"{base}/nope/{route}", {"signal": "TERM"})
        assert (status, json.loads(body)["error"]) == (404, "ProcessNotFound")
    status, body = daemon.call("GET", f"{base}/{pid}/output?offset=99")
    assert status == 400
    status, body = daemon.call("POST", base, {"cmd": ["true"], "stdin": "yes"})
    assert status == 400
    status, body = daemon.call("GET", "/sandboxes/0123456789abcdef/processes")
    assert (status, json.loads(body)["error"]) == (404, "SandboxNotFound")
    daemon.call("POST", f"{base}/{pid}/signal", {"signal": "KILL"})
    assert output(daemon, rid, pid)[-1] == {"exit": 137}
    status, _ = daemon.call("POST", f"{base}/{pid}/signal", {"signal": "TERM"})
    assert status == 409  # ended: its pid may be another's


def test_a_timeout_ends_a_process_with_124(daemon: Daemon) -> None:
    rid = daemon.create()
    pid = start(daemon, rid, ["sleep", "60"], timeout=0.5)
    assert output(daemon, rid, pid) == [{"exit": 124}]


def test_a_reader_of_a_killed_sandbox_is_told_in_band(daemon: Daemon) -> None:
    rid = daemon.create()
    pid = start(daemon, rid, ["sh", "-c", "echo started; sleep 60"])
    stream = Lines(daemon, f"/sandboxes/{rid}/processes/{pid}/output?follow=true")
    frames = iter(stream)
    assert "o" in next(f for f in frames if f)
    assert daemon.call("DELETE", f"/sandboxes/{rid}")[0] == 204
    rest = [f for f in frames if f]
    stream.close()
    assert rest == [{"error": "SandboxNotFound", "detail": "the sandbox was killed"}]


def test_an_offset_that_fell_out_is_told_dropped(small_log: Daemon) -> None:
    rid = small_log.create()
    pid = start(small_log, rid, ["sh", "-c", "head -c 10000 /dev/zero | tr '\\0' a"])
    followed = output(small_log, rid, pid)  # from 0, live: it may keep up for a while
    assert followed[-1] == {"exit": 0}
    dropped = sum(f.get("dropped", 0) for f in followed)
    assert dropped + len(data_of(followed)) == 10000
    frames = output(small_log, rid, pid)  # from 0 once it ended: at most the last 4 KiB left
    kept = data_of(frames)
    assert frames[-1] == {"exit": 0} and 0 < len(kept) <= 4096  # chunks fall out whole
    assert frames[0] == {"dropped": 10000 - len(kept)} and frames[1]["at"] == 10000 - len(kept)
    assert output(small_log, rid, pid, offset=9990, follow=False) == [
        {"o": base64.b64encode(b"a" * 10).decode(), "at": 9990},
        {"exit": 0},
    ]


def test_records_are_pushed_out_oldest_ended_first(small_log: Daemon) -> None:
    rid = small_log.create()
    ended = [start(small_log, rid, ["true"]) for _ in range(2)]
    for pid in ended:
        assert output(small_log, rid, pid) == [{"exit": 0}]
    running = start(small_log, rid, ["sleep", "30"])
    newest = start(small_log, rid, ["true"])  # pushes out the oldest ended record
    ids = [p["id"] for p in small_log.json("GET", f"/sandboxes/{rid}/processes")["processes"]]
    assert ids == [ended[1], running, newest]
    status, body = small_log.call("GET", f"/sandboxes/{rid}/processes/{ended[0]}/output")
    assert (status, json.loads(body)["error"]) == (404, "ProcessNotFound")


def test_printing_a_gibibyte_keeps_daemon_memory_flat(daemon: Daemon) -> None:
    rid = daemon.create()
    before = daemon.rss_kib()
    cmd = ["timeout", "-s", "KILL", "300", "sh", "-c", "head -c 1G /dev/zero"]
    pid = start(daemon, rid, cmd)
    # A follower that reads one frame and then stalls (its socket buffers fill): the process
    # must run on, the daemon must not buffer for it.
    stalled = Lines(daemon, f"/sandboxes/{rid}/processes/{pid}/output?follow=true")
    assert stalled.response.readline()
    reader = Lines(daemon, f"/sandboxes/{rid}/processes/{pid}/output?offset=0&follow=true")
    last: dict[str, Any] = {}
    received = dropped = 0
    for frame in reader:
        last = frame
        received += len(base64.b64decode(frame.get("o", "")))
        dropped += frame.get("dropped", 0)
    reader.close()
    stalled.close()
    assert last == {"exit": 0} and received + dropped == 1 << 30
    peak = daemon.rss_kib("VmHWM")
    print(f"\n1 GiB printed: daemon RSS {before} KiB before, peak {peak} KiB")
    # The log keeps 16 MiB; a 1 GiB buffer anywhere would be seen here.
    assert peak - before < 160 * 1024, (before, peak)
    (record,) = daemon.json("GET", f"/sandboxes/{rid}/processes")["processes"]
    assert record["exit"] == 0


def test_watch_reports_an_edit_made_by_an_exec(small_log: Daemon) -> None:
    rid = small_log.create()
    small_log.call("POST", f"/sandboxes/{rid}/mkdir", {"path": "src/deep"})
    stream = Lines(small_log, f"/sandboxes/{rid}/watch?root=/src&recursive=true")
    assert stream.status == 200
    frames = iter(stream)
    assert next(frames) == {}  # the first keepalive: the watches are in place
    script = (
        "echo hi > src/deep/a.txt; chmod 600 src/deep/a.txt; mv src/deep/a.txt src/b.txt;"
        " rm src/b.txt; mkdir src/new; echo x > src/new/c"
    )
    status, _ = small_log.call("POST", f"/sandboxes/{rid}/exec", {"cmd": ["sh", "-c", script]})
    assert status == 200
    seen = []
    for frame in frames:
        if frame:
            seen.append(frame)
        if frame.get("path") == "/src/new/c" and frame["event"] == "create":
            break
    stream.close()
    events = [(f["event"], f["path"], f["dir"]) for f in seen]
    for wanted in [
        ("create", "/src/deep/a.txt", False),
        ("write", "/src/deep/a.txt", False),
        ("chmod", "/src/deep/a.txt", False),
        ("rename", "/src/deep/a.txt", False),
        ("create", "/src/b.txt", False),
        ("remove", "/src/b.txt", False),
        ("create", "/src/new", True),
        ("create", "/src/new/c", False),
    ]:
        assert wanted in events, (wanted, events)


def test_watch_bounds_and_end(small_log: Daemon) -> None:
    rid = small_log.create()
    status, body = small_log.call("GET", f"/sandboxes/{rid}/watch?root=/missing")
    assert (status, json.loads(body)["error"]) == (404, "FileNotFoundError")
    streams = [Lines(small_log, f"/sandboxes/{rid}/watch") for _ in range(2)]
    assert [s.status for s in streams] == [200, 200]
    for s in streams:
        assert next(iter(s)) == {}
    status, body = small_log.call("GET", f"/sandboxes/{rid}/watch")
    assert (status, json.loads(body)["error"]) == (429, "TooMany")
    assert small_log.inotify_instances() == 2
    assert small_log.call("DELETE", f"/sandboxes/{rid}")[0] == 204
    for s in streams:
        assert [f for f in s if f] == [
            {"error": "SandboxNotFound", "detail": "the sandbox was killed"}
        ]
        s.close()
    assert small_log.inotify_instances() == 0  # closed with the sandbox


def until(condition: Any, bound: float = 60, every: float = 0.05) -> bool:
    """Poll ``condition()`` until true, ``False`` past ``bound`` seconds (an outer bound)."""
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def test_watches_whose_readers_leave_hold_no_inotify_instance(daemon: Daemon) -> None:
    """More watches than a user may hold inotify instances (128 by default) come and go,
    their clients leaving at every moment (during the walk, after it): none is kept."""
    rid = daemon.create()
    for name in ("a", "a/b", "a/b/c"):
        daemon.call("POST", f"/sandboxes/{rid}/mkdir", {"path": name})
    for round in range(150):
        connection = socket.create_connection(("127.0.0.1", daemon.port), timeout=60)
        connection.sendall(f"GET /sandboxes/{rid}/watch HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert until(lambda: daemon.inotify_instances() > 0, every=0.001)  # made; its walk runs
        if round % 25 == 0:
            assert connection.recv(1)  # the first keepalive: the watch is running
        connection.close()
        assert until(lambda: daemon.inotify_instances() == 0), (round, daemon.inotify_instances())
    stream = Lines(daemon, f"/sandboxes/{rid}/watch")
    assert stream.status == 200 and next(iter(stream)) == {}
    assert daemon.inotify_instances() == 1
    stream.close()
    assert until(lambda: daemon.inotify_instances() == 0), daemon.inotify_instances()


def test_processes_and_watch_are_capabilities(daemon: Daemon) -> None:
    capabilities = daemon.json("GET", "/healthz")["capabilities"]
    assert "processes" in capabilities and "watch" in capabilities


def test_sandboxctl_run_d_logs_ps_signal(daemon: Daemon) -> None:
    env = {**os.environ, "SANDBOXD_URL": daemon.url, "PYTHONPATH": str(REPO)}

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sandboxd_client.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    handle = ctl("create").stdout.strip()
    started = ctl("run", "-d", handle, "--", "sh", "-c", "echo out; echo err >&2; exec sleep 600")
    assert started.returncode == 0, started.stderr
    pid = started.stdout.split()[0]
    listed = ctl("ps", handle)
    assert pid in listed.stdout and "running" in listed.stdout
    for _ in range(100):  # until the command has printed (each look is a whole sandboxctl run)
        partial = ctl("logs", handle, pid)
        if partial.stdout and partial.stderr:
            break
    assert partial.stdout == "out\n" and partial.stderr == "err\n"
    assert ctl("signal", handle, pid, "TERM").returncode == 0
    followed = ctl("logs", "-f", handle, pid)
    assert followed.returncode == 128 + 15 and followed.stdout == "out\n"


def test_the_reaper_spares_a_printing_process_and_reaps_a_silent_one(tmp_path: Path) -> None:
    """A background process's output is its sandbox's activity; a silent one is not: its
    sandbox is reaped while the printing one's lives on (both started at the same time)."""
    reaping = start_daemon(tmp_path, "--isolation=none", "--idle-ttl=3s")
    try:
        printing, silent = reaping.create(), reaping.create()
        loop = ["sh", "-c", "while :; do echo tick; sleep 0.1; done"]
        start(reaping, printing, loop)
        start(reaping, silent, ["sleep", "600"])

        def alive(rid: str) -> bool:  # the list: a call to the sandbox would be activity
            return rid in [s["remote_id"] for s in reaping.json("GET", "/sandboxes")["sandboxes"]]

        assert until(lambda: not alive(silent), 120)  # reaped after 3 s without activity
        assert alive(printing)
        assert "reaping sandbox " + silent in reaping.log.read_text()
        assert "reaping sandbox " + printing not in reaping.log.read_text()
    finally:
        stop_daemon(reaping)


class CuttingProxy:
    """A loopback TCP proxy to the daemon that drops each connection after ``cut`` bytes of
    the daemon's answer have passed (a connection lost mid-stream)."""

    def __init__(self, port: int, cut: int) -> None:
        self.target = port
        self.cut = cut
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for source, sink, cut in ((client, upstream, None), (upstream, client, self.cut)):
                threading.Thread(target=self._pipe, args=(source, sink, cut), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, cut: int | None) -> None:
        passed = 0
        try:
            while cut is None or passed < cut:
                data = source.recv(min(4096, cut - passed) if cut is not None else 4096)
                if not data:
                    break
                sink.sendall(data)
                passed += len(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def close(self) -> None:
        self.listener.close()


def test_sandboxctl_logs_f_resumes_at_its_offset_after_a_dropped_connection(
    daemon: Daemon,
) -> None:
    """``sandboxctl logs -f`` through a connection cut mid-stream says where to resume;
    ``logs -f --offset N`` from there gives the rest: together, exactly the process's
    output, nothing lost, nothing twice."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def ctl(url: str, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "sandboxd_client.cli", *args],
            capture_output=True,
            env={**env, "SANDBOXD_URL": url},
            timeout=120,
        )

    rid = daemon.create()
    script = "for i in $(seq 1 400); do echo line $i; sleep 0.005; done; sleep 1; echo last"
    pid = start(daemon, rid, ["sh", "-c", script])
    proxy = CuttingProxy(daemon.port, cut=3000)
    cut_url = f"http://127.0.0.1:{proxy.port}"
    try:
        first = ctl(cut_url, "logs", "-f", encode_handle(cut_url, rid).id, pid)
    finally:
        proxy.close()
    assert first.returncode != 0
    resume = re.search(rb"resume with --offset (\d+)", first.stderr)
    assert resume, first.stderr
    offset = int(resume.group(1))
    assert 0 < offset == len(first.stdout)
    handle = encode_handle(daemon.url, rid).id
    rest = ctl(daemon.url, "logs", "-f", "--offset", str(offset), handle, pid)
    assert rest.returncode == 0, rest.stderr
    expected = subprocess.run(["sh", "-c", script], capture_output=True, check=True).stdout
    assert first.stdout + rest.stdout == expected
