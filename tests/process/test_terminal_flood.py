"""A terminal that prints without end leaves the daemon's memory flat (issue 32;
docs/extensions.rst, "Terminals"): its output goes into the bounded scrollback, and a client
attached to its WebSocket that reads slowly is paused, holding nothing."""

import json
import time

from tests.support.daemon import Daemon
from tests.support.ws_client import WebSocket

FLOOD_MIB = 1024


def test_a_flooding_terminal_with_a_slow_client_keeps_the_daemon_flat(daemon: Daemon) -> None:
    rid = daemon.create()
    baseline = daemon.rss_kib("VmHWM")
    flood = f"head -c {FLOOD_MIB << 20} /dev/zero | tr '\\0' x; echo; echo flood-done"
    status, made = daemon.call("POST", f"/sandboxes/{rid}/terminals", {"cmd": ["sh", "-c", flood]})
    assert status == 200, made
    terminal = json.loads(made)
    ws = WebSocket(daemon.port, f"/sandboxes/{rid}/terminals/{terminal['id']}")
    try:
        ws.receive()  # attached, then reads nothing for a while: the daemon must not buffer
        deadline = time.monotonic() + 240
        while True:
            status, body = daemon.call("GET", f"/sandboxes/{rid}/terminals/{terminal['id']}")
            if not json.loads(body)["running"]:
                break
            assert time.monotonic() < deadline, "the flood did not end"
            time.sleep(0.5)
        assert json.loads(body)["exit"] == 0
        growth_mib = (daemon.rss_kib("VmHWM") - baseline) / 1024
        # the 1 MiB scrollback, the socket's buffers, allocator slack: far below the flood
        assert growth_mib < 64, growth_mib
        seen = ws.read_until(b"flood-done")  # the slow client reads on: the end is there
        assert len(seen) < 8 << 20, len(seen)  # what fell out of the scrollback was skipped
    finally:
        ws.close()
