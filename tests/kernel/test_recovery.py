"""Restart recovery with real isolation: SIGKILL the daemon, start it again, nothing is left.

As root on a machine with cgroups (v1 here, v2 in the VM): the daemon runs with its real
isolation driver; a sandbox holds a ``setsid`` double-forked ``sleep 1000`` when the daemon is
killed with SIGKILL. The next daemon on the same root must kill it and remove every trace.
"""

import base64
import json
import os
import time
from pathlib import Path

import pytest

from tests.kernel.kernel_http import host_pid
from tests.support.daemon import Daemon, start_daemon, stop_daemon

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="real isolation needs root"),
]


def uid_range(tmp_path: Path) -> list[str]:
    """A uid range of its own for this test's daemons (other tests' daemons run alongside)."""
    base = 400000 + (abs(hash(str(tmp_path))) % 5000) * 20
    return [f"--uid-min={base}", f"--uid-max={base + 19}"]


def run(daemon: Daemon, rid: str, script: str) -> dict[str, object]:
    status, body = daemon.call("POST", f"/sandboxes/{rid}/exec", {"cmd": ["sh", "-c", script]})
    assert status == 200, body
    final = json.loads(body.splitlines()[-1])
    assert "exit" in final, final
    return final


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def cgroup_dirs_named(rid: str) -> list[str]:
    found = []
    for top, dirs, _ in os.walk("/sys/fs/cgroup"):
        if rid in dirs:
            found.append(os.path.join(top, rid))
    return found


def test_sigkilled_daemon_leaves_nothing_after_restart(tmp_path: Path) -> None:
    args = [*uid_range(tmp_path), "--memory-max=128M", "--pids-max=64"]
    first = start_daemon(tmp_path, *args)
    try:
        rid = first.create()
        final = run(first, rid, "setsid sh -c 'sleep 1000 & echo $!' </dev/null; id -u")
        out = base64.b64decode(str(final["out"])).split()
        assert len(out) == 2, final
        # The sandbox's number for it; the host's differs where it has a PID namespace.
        inner, uid = int(out[0]), int(out[1])
        sleeper = host_pid(inner, first.root / ".ns" / rid / "pid")
        assert sleeper is not None, inner
        assert uid != 0 and alive(sleeper)
        assert cgroup_dirs_named(rid), "the sandbox has a cgroup"
        first.process.kill()  # SIGKILL: no drain, no cleanup
        first.process.wait(30)
        assert alive(sleeper), "the sandbox's process outlived its daemon"
    except BaseException:
        stop_daemon(first)
        raise

    second = start_daemon(tmp_path, *args)
    try:
        deadline = time.monotonic() + 30
        while alive(sleeper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(sleeper)
        while second.call("GET", "/readyz")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.05)  # creates wait for the recovery too
        assert not (second.root / rid).exists()
        assert cgroup_dirs_named(rid) == []
        status, body = second.call("GET", f"/sandboxes/{rid}/ready")
        assert (status, json.loads(body)["error"]) == (404, "SandboxNotFound")
        assert "recovery done: 1 leftover" in second.log.read_text()
        # The uid is free again: a new sandbox may get it, and it works.
        assert run(second, second.create(), "true")["exit"] == 0
    finally:
        stop_daemon(second)
