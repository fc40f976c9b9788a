"""``POST /sandboxes/{rid}/exec`` with the spawn server on (``SANDBOXD_SPAWNER=server``): every
test of ``test_http_exec`` again, each command started by a real ``sandboxd-exec spawn-server``
(its child runs the helper's ``session`` path: no root here)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import attrs
import pytest
import pytest_twisted

from sandboxd._twisted import ServedProcess
from sandboxd.isolation.exec.helper import HELPER
from sandboxd.isolation.exec.spawn_server import SpawnServer
from tests.http.http_harness import Harness, unb64
from tests.http.test_http_exec import *  # noqa: F403 (the same tests, the server on)
from tests.http.test_http_exec import started

pytestmark = pytest.mark.skipif(not os.path.exists(HELPER), reason="the helper is not built")


@pytest.fixture
def harness(harness: Harness) -> Iterator[Harness]:
    manager = harness.manager
    server = SpawnServer(HELPER)
    manager.isolation = attrs.evolve(manager.isolation, spawn_server=server)
    yield harness
    server.close()


@pytest_twisted.ensureDeferred
async def test_an_exec_is_the_daemons_child_from_the_server_with_fds_0_1_2_only(
    harness: Harness, rid: str
) -> None:
    listing = "echo $PPID; ls /proc/self/fd; echo end; exec sleep 300"
    stream = harness.exec(rid, {"cmd": ["sh", "-c", listing]})
    run = await started(harness, rid, stream)
    assert isinstance(run.transport, ServedProcess)
    await stream.until(lambda: b"end" in stream.live)
    parent, *fds, _ = stream.live.decode().split()
    assert int(parent) == os.getpid()
    assert fds == ["0", "1", "2", "3"]  # 3: the listing's own descriptor
    run.abort()
    assert (await stream.finished())["exit"] == 128 + 9


@pytest_twisted.ensureDeferred
async def test_the_drain_ends_the_server(harness: Harness, rid: str) -> None:
    server = harness.manager.isolation.spawn_server
    assert server is not None
    assert (await harness.exec(rid, {"cmd": ["true"]}).finished())["exit"] == 0
    assert server.pid is not None
    assert harness.call("DELETE", f"/sandboxes/{rid}").status == 204
    await harness.manager.drain()  # nothing left to wait for
    assert server.pid is None


@pytest_twisted.ensureDeferred
async def test_a_background_process_starts_through_the_server_and_answers_its_pid(
    harness: Harness, rid: str
) -> None:
    """The answer waits for the server's: its pid is the server's child, the daemon's own."""
    server = harness.manager.isolation.spawn_server
    assert server is not None
    body = {"cmd": ["sh", "-c", "echo $PPID; read line; echo got $line"], "stdin": True}
    reply = await harness.acall("POST", f"/sandboxes/{rid}/processes", json_body=body)
    assert reply.status == 200, reply
    started = reply.json()
    (process,) = harness.manager.sandboxes[rid].processes.all()
    assert isinstance(process.run.transport, ServedProcess) and server.pid is not None
    assert started["pid"] == process.pid and process.pid is not None
    process.run.write_stdin(b"in\n")
    process.run.close_stdin()
    assert (await process.run.when_finished()).code == 0
    output = harness.call("GET", f"/sandboxes/{rid}/processes/{started['id']}/output")
    frames = [json.loads(line) for line in output.body.splitlines()]
    assert (
        b"".join(unb64(f["o"]) for f in frames if "o" in f) == f"{os.getpid()}\ngot in\n".encode()
    )
    assert frames[-1] == {"exit": 0}
