"""A watch stream whose client does not read holds a bounded buffer in the daemon (issue 29:
"unread watch streams buffer without bound").

A real daemon and a real sandbox command that changes files as fast as it can, while the
client of a watch stream reads nothing (a small receive buffer). The daemon's RSS stays within
a bound, and once the client reads again it is told ``overflow`` for what it missed, then
every change after it, as inotify reports its own full queue.
"""

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, start_daemon, stop_daemon

MIB = 1024
"""KiB in a MiB (RSS is read in KiB)."""

CHURN_SECONDS = 8
"""How long the sandbox's command changes files: the attack's size, not an assertion."""

RSS_BOUND = 48 * MIB
"""What the daemon's RSS may grow by while the stream is unread."""

READ_DEADLINE = 120
"""Seconds the stream is read for what the test waits for (a hang guard, not a timing)."""

CHURN = (
    "import os, time\n"
    "end = time.monotonic() + {seconds}\n"
    "name = 'd/' + 'x' * 200\n"
    "while time.monotonic() < end:\n"
    "    for i in range(1000):\n"
    "        with open(f'{{name}}{{i % 10}}', 'w') as f:\n"
    "            f.write('x')\n"
    "        os.unlink(f'{{name}}{{i % 10}}')\n"
)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = start_daemon(tmp_path, "--isolation=none", "--keepalive=1s")
    try:
        yield running
    finally:
        stop_daemon(running)


def unread_watch(daemon: Daemon, path: str) -> tuple[socket.socket, http.client.HTTPResponse]:
    """A watch stream on a connection whose receive buffer is small, its headers and first
    keepalive read (the watches are in place); nothing more is read from it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(60)
    sock.connect(("127.0.0.1", daemon.port))
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    connection.sock = sock
    connection.request("GET", path)
    response = connection.getresponse()
    assert response.status == 200
    assert json.loads(response.readline()) == {}
    return sock, response


def wait_for_exit(daemon: Daemon, rid: str, pid: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        (record,) = daemon.json("GET", f"/sandboxes/{rid}/processes")["processes"]
        if record.get("exit") is not None:
            assert record["exit"] == 0, record
            return
        time.sleep(0.5)
    raise AssertionError("the churn did not end")


def test_an_unread_watch_stream_holds_a_bounded_buffer(daemon: Daemon) -> None:
    rid = daemon.create()
    assert daemon.call("POST", f"/sandboxes/{rid}/mkdir", {"path": "d"})[0] in (200, 204)
    sock, stream = unread_watch(daemon, f"/sandboxes/{rid}/watch?root=/d")
    before = daemon.rss_kib()
    churn = CHURN.format(seconds=CHURN_SECONDS)
    started = daemon.json("POST", f"/sandboxes/{rid}/processes", {"cmd": ["python3", "-c", churn]})
    wait_for_exit(daemon, rid, str(started["id"]))
    grown = daemon.rss_kib() - before
    print(f"\nunread watch: daemon RSS grew {grown} KiB while {CHURN_SECONDS} s of changes came")
    assert grown < RSS_BOUND, grown
    # Read again: what was missed is told as an overflow. Once the stream has caught up (a
    # keepalive: a second with nothing to write), a change is told as it comes. Keepalives
    # come every second, so the deadline ends the test if a frame never does.
    deadline = time.monotonic() + READ_DEADLINE
    frames = (json.loads(line) for line in stream)
    overflow = False
    for frame in frames:
        overflow = overflow or frame.get("event") == "overflow"
        if overflow and frame == {}:
            break
        assert time.monotonic() < deadline, "no overflow, then keepalive, was told"
    assert daemon.call("POST", f"/sandboxes/{rid}/exec", {"cmd": ["touch", "d/after"]})[0] == 200
    for frame in frames:
        if frame.get("path") == "/d/after":
            break
        assert time.monotonic() < deadline, "the change after the overflow was not told"
    stream.close()
    sock.close()
