"""A client that detaches while its terminal prints leaves the terminal running (issue 32;
docs/extensions.rst, "Terminals": closing the socket leaves the terminal running), against a
real daemon: output that arrives between the client's close frame and the connection's end
is not sent, and never reaches the pty's reader as an error (which hung the terminal up:
its shell ended by SIGHUP, exit 129).
"""

from __future__ import annotations

import json
import struct
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.client.real_daemon import Daemon, running_daemon
from tests.support.ws_client import CLOSE, WebSocket

TOKEN = "detach-token"
DETACHES = 20
PRINTER = ["sh", "-c", "while :; do echo tick-tick-tick-tick; done"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("daemon"), TOKEN) as running:
        yield running


def call(daemon: Daemon, method: str, path: str, body: object = None) -> Any:
    request = urllib.request.Request(
        daemon.url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def test_detaching_from_a_printing_terminal_leaves_it_running(daemon: Daemon) -> None:
    rid = call(daemon, "POST", "/sandboxes", {})["remote_id"]
    terminal = call(daemon, "POST", f"/sandboxes/{rid}/terminals", {"cmd": PRINTER})["id"]
    port = int(daemon.url.rsplit(":", 1)[1])
    path = f"/sandboxes/{rid}/terminals/{terminal}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for _ in range(DETACHES):
        ws = WebSocket(port, path, auth)
        ws.read_until(b"tick")
        # The close frame, then output still coming: read on until the daemon's close
        ws.send(struct.pack("!H", 1000), CLOSE)
        deadline = time.monotonic() + 30
        opcode = 0
        while opcode != CLOSE:
            assert time.monotonic() < deadline
            opcode, _ = ws.receive()
        ws.sock.close()
    time.sleep(0.5)
    listing = call(daemon, "GET", path)
    assert listing["running"] is True, listing
    assert "Disconnected" not in daemon.log.read_text()
    call(daemon, "DELETE", path)
