"""A ``WatchDir`` stream whose client does not read holds a bounded buffer in the daemon (issue
29: "unread watch streams buffer without bound"), on the E2B front.

The unmodified SDK makes the sandbox and runs a command that changes files as fast as it can,
while a raw Connect ``WatchDir`` stream is left unread (a small receive buffer). The daemon's
RSS stays within a bound, and once the client reads again its stream ends with a
``data_loss`` error (what it missed is gone: it must watch again), as envd ends a watch whose
event queue overflowed.
"""

import http.client
import json
import socket
import struct
import time

from e2b import Sandbox

from tests.e2b.conftest import E2BDaemon
from tests.process.test_watch_unread import CHURN, CHURN_SECONDS, READ_DEADLINE, RSS_BOUND


def envelope(message: object) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(payload)) + payload


def read_envelopes(response: http.client.HTTPResponse) -> list[tuple[int, dict[str, object]]]:
    """Every envelope of the stream until its end-of-stream one. Keepalives come at least
    every few seconds, so the deadline ends the test if the end never does (a hang guard,
    not a timing)."""
    deadline = time.monotonic() + READ_DEADLINE
    found = []
    while True:
        flags, length = struct.unpack(">BI", response.read(5))
        found.append((flags, json.loads(response.read(length))))
        if flags & 0x02:
            return found
        assert time.monotonic() < deadline, "the stream did not end"


def test_an_unread_watch_dir_stream_holds_a_bounded_buffer(e2b_daemon: E2BDaemon) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.make_dir("/home/user/d")
        port = int(e2b_daemon.url.rsplit(":", 1)[1])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(60)
        sock.connect(("127.0.0.1", port))
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.sock = sock
        headers = {
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "X-Access-Token": sbx._envd_access_token or "",
            "Content-Type": "application/connect+json",
            "Keepalive-Ping-Interval": "1",  # a frame every second at least (read_envelopes)
        }
        body = envelope({"path": "/home/user/d", "recursive": False})
        connection.request("POST", "/filesystem.Filesystem/WatchDir", body, headers)
        response = connection.getresponse()
        assert response.status == 200
        flags, start = read_envelopes_until_start(response)
        assert flags == 0 and "start" in json.dumps(start), start
        before = e2b_daemon.daemon.rss_kib()
        churn = CHURN.format(seconds=CHURN_SECONDS)  # in the home directory, its cwd
        assert sbx.commands.run(f"python3 -c {shell_quote(churn)}", timeout=120).exit_code == 0
        grown = e2b_daemon.daemon.rss_kib() - before
        print(f"\nunread WatchDir: daemon RSS grew {grown} KiB in {CHURN_SECONDS} s of changes")
        assert grown < RSS_BOUND, grown
        last_flags, last = read_envelopes(response)[-1]
        assert last_flags & 0x02 and last["error"]["code"] == "data_loss", last  # type: ignore[index]
        sock.close()
    finally:
        sbx.kill()


def read_envelopes_until_start(response: http.client.HTTPResponse) -> tuple[int, object]:
    flags, length = struct.unpack(">BI", response.read(5))
    return flags, json.loads(response.read(length))


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
