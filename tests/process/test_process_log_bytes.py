"""A background process that writes its output a byte at a time costs the daemon about its
log's byte bound (issue 29: "process logs written a byte at a time cost ~80 bytes of daemon
memory per byte kept").

A real daemon and real sandbox commands that write one byte per ``write(2)`` as fast as they
can, several at once: some on stdout only, some alternating stdout and stderr with each byte
(a run of the log per byte, which only the log's charge per run bounds). Each log is full
(its bound in bytes is kept, the rest answered as ``dropped``), and the daemon's RSS grows by
about the logs' bounds, not by an object per write (docs/extensions.rst, "Background
processes").
"""

import base64
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, start_daemon, stop_daemon

KIB = 1
MIB = 1024 * KIB
"""RSS is read in KiB."""

LOG_MAX = 64 * KIB
"""Each process's log bound (``--process-log-max``), in KiB: small enough that a writer fills
it well within :data:`WRITE_SECONDS`."""

WRITER_FDS = ((1,), (1, 2), (1,), (1, 2))
"""What each writer writes on: stdout only, or stdout and stderr in turn."""

WRITERS = len(WRITER_FDS)
"""Processes writing at once: the attack's size, not an assertion."""

WRITE_SECONDS = 10

RSS_BOUND = WRITERS * LOG_MAX + 2 * MIB
"""What the daemon's RSS may grow by: the logs' bounds and a margin for the daemon itself."""


def byte_at_a_time(fds: tuple[int, ...]) -> str:
    """One byte per ``write(2)``, on each of ``fds`` in turn, as fast as the daemon reads
    them: each read of the daemon finds a few bytes (``sleep(0)`` yields the processor to
    it). Old logs kept an object per read, ~100 bytes per byte kept; a log that coalesces
    the writes of one stream still keeps a run per byte when the streams alternate."""
    return (
        "import os, time\n"
        f"end = time.monotonic() + {WRITE_SECONDS}\n"
        f"fds = {fds!r}\n"
        "while time.monotonic() < end:\n"
        "    for i in range(100):\n"
        "        os.write(fds[i % len(fds)], b'x')\n"
        "        time.sleep(0)\n"
    )


@pytest.fixture(params=["isolation-none", "isolation-real"])
def daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """With and without the real isolation (the writers run as the sandbox's uid, under
    its seccomp filter and cgroup)."""
    if request.param == "isolation-real" and os.geteuid() != 0:
        pytest.skip("the real isolation needs root")
    isolation = ["--isolation=none"] if request.param == "isolation-none" else []
    running = start_daemon(tmp_path, *isolation, "--keepalive=1s", f"--process-log-max={LOG_MAX}K")
    try:
        yield running
    finally:
        stop_daemon(running)


def wait_for_exits(daemon: Daemon, rid: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        records = daemon.json("GET", f"/sandboxes/{rid}/processes")["processes"]
        if all(record.get("exit") is not None for record in records):
            assert all(record["exit"] == 0 for record in records), records
            return
        time.sleep(0)
    raise AssertionError("the writers did not end")


def kept_of(daemon: Daemon, rid: str, pid: str) -> tuple[int, int]:
    """What a read from offset 0 of the log is told: bytes dropped, bytes kept."""
    status, body = daemon.call("GET", f"/sandboxes/{rid}/processes/{pid}/output?follow=false")
    assert status == 200
    dropped = kept = 0
    for line in body.splitlines():
        frame = json.loads(line)
        dropped += frame.get("dropped", 0)
        kept += len(base64.b64decode(frame.get("o", "") or frame.get("e", "")))
    return dropped, kept


def test_output_written_a_byte_at_a_time_costs_about_the_log_bound(daemon: Daemon) -> None:
    rid = daemon.create()
    before = daemon.rss_kib()
    started = [
        daemon.json(
            "POST", f"/sandboxes/{rid}/processes", {"cmd": ["python3", "-c", byte_at_a_time(fds)]}
        )
        for fds in WRITER_FDS
    ]
    wait_for_exits(daemon, rid)
    grown = daemon.rss_kib() - before
    kept = [kept_of(daemon, rid, str(record["id"])) for record in started]
    print(f"\nbyte-at-a-time logs: daemon RSS grew {grown} KiB; (dropped, kept) {kept}")
    assert grown < RSS_BOUND, grown
    assert all(0 < bytes_kept <= LOG_MAX * 1024 for _, bytes_kept in kept), kept
    assert all(dropped > 0 for dropped, _ in kept), kept  # each log was full
