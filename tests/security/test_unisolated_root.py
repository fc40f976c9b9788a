"""``--isolation=none`` started as root never runs a command as root.

The development mode has no cgroup, namespace or filter; started with ``sudo`` (one habit away
from a host takeover) it used to run every command as uid 0: ``cat /etc/shadow`` worked. Now each
sandbox has a uid of the pool, its commands and file calls run as it, and its processes are
killed with it. With the previous behaviour every assertion about the uid below fails.
"""

import base64
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel.kernel_http import processes_of, uid_block, wait_for
from tests.support.daemon import Daemon, start_daemon, stop_daemon

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the danger exists only as root")


@pytest.fixture
def unisolated(tmp_path: Path) -> Iterator[tuple[Daemon, range]]:
    low, high = uid_block()
    daemon = start_daemon(tmp_path, "--isolation=none", f"--uid-min={low}", f"--uid-max={high}")
    try:
        yield daemon, range(low, high + 1)
    finally:
        stop_daemon(daemon)
    assert wait_for(lambda: not processes_of(range(low, high + 1)), 10)


def run(daemon: Daemon, rid: str, script: str) -> dict[str, object]:
    status, body = daemon.call("POST", f"/sandboxes/{rid}/exec", {"cmd": ["sh", "-c", script]})
    assert status == 200, body
    return dict(json.loads(body.splitlines()[-1]))


def text(frame: dict[str, object], key: str = "out") -> str:
    return base64.b64decode(str(frame[key])).decode()


def test_commands_run_as_a_pool_uid_and_cannot_read_the_shadow_file(
    unisolated: tuple[Daemon, range],
) -> None:
    daemon, uids = unisolated
    capabilities = daemon.json("GET", "/healthz")["capabilities"]
    assert "isolation.none" in capabilities and "isolation.uid" in capabilities
    rid = daemon.create()
    frame = run(daemon, rid, "id -u; id -g")
    assert frame["exit"] == 0
    uid, gid = (int(n) for n in text(frame).split())
    assert uid in uids and gid == uid
    frame = run(daemon, rid, "cat /etc/shadow")
    assert frame["exit"] == 1 and "Permission denied" in text(frame, "err"), frame
    frame = run(daemon, rid, "echo owned > /etc/sandboxd-unisolated-probe")
    assert frame["exit"] != 0 and not Path("/etc/sandboxd-unisolated-probe").exists()

    # The file API works as the same uid: what it writes, the command reads and owns.
    status, _ = daemon.call("PUT", f"/sandboxes/{rid}/file?path=a/b.txt", raw=b"uploaded")
    assert status == 204
    frame = run(daemon, rid, "cat a/b.txt; echo; stat -c %u a/b.txt; echo made > c.txt")
    assert text(frame).split() == ["uploaded", str(uid)]
    assert (daemon.root / rid / "workspace" / "c.txt").stat().st_uid == uid


def test_a_killed_sandbox_leaves_no_process_of_its_uid(unisolated: tuple[Daemon, range]) -> None:
    daemon, _ = unisolated
    rid = daemon.create()
    frame = run(daemon, rid, "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!; id -u")
    pid, uid = (int(n) for n in text(frame).split())
    deadline = time.monotonic() + 10
    while not processes_of([uid]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid in processes_of([uid])  # outlived its exec, in a session of its own
    assert daemon.call("DELETE", f"/sandboxes/{rid}")[0] == 204
    assert processes_of([uid]) == []
