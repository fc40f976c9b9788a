"""Background processes and workspace watch under real isolation, as root (issue 17).

A background server is reached by a later exec of the same sandbox (they share the sandbox's
network, whatever namespaces it gets); a process runs as the sandbox's uid and dies with its
sandbox; a watch sees only what the sandbox may read: a root-only directory inside the
workspace is not watched, which the same walk without the sandbox's credentials would watch.
"""

import http.client
import json
import os
import signal

import pytest

from sandboxd.core.watch import watch as core_watch
from sandboxd.core.watch.inotify import Inotify
from tests.kernel.kernel_http import (
    SLOW,
    KernelDaemon,
    alive,
    command_pid,
    isolation_problem,
    proc_uids,
    processes_of,
    wait_for,
    zygotes_of,
)
from tests.support.daemon import free_port

WHY_NOT = isolation_problem()
pytestmark = [pytest.mark.kernel, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]


def frames(kd: KernelDaemon, path: str) -> "http.client.HTTPResponse":
    connection = http.client.HTTPConnection("127.0.0.1", kd.daemon.port, timeout=60)
    connection.request("GET", path)
    return connection.getresponse()


def sandbox_uid(pid: int) -> int:
    """The uid ``pid`` (the command behind it: a relay's child with a PID namespace) runs as
    once the wrapper dropped privilege (it starts as root)."""
    assert wait_for(lambda: (proc_uids(command_pid(pid)) or (0,))[0] != 0, 10 * SLOW), pid
    uids = proc_uids(command_pid(pid))
    assert uids is not None and 0 not in uids, uids
    return uids[0]


def next_frame(response: "http.client.HTTPResponse") -> dict[str, object]:
    while True:
        line = response.readline()
        assert line, "the stream ended"
        frame = json.loads(line)
        if frame:
            return dict(frame)


def test_a_background_server_is_reached_by_an_exec_and_dies_with_its_sandbox(
    roomy: KernelDaemon,
) -> None:
    box = roomy.create()
    port = free_port()
    server = (
        "import http.server as h; "
        "h.HTTPServer(('127.0.0.1', %d), h.SimpleHTTPRequestHandler).serve_forever()"
    )
    started = roomy.call(
        "POST", box.url("processes"), {"cmd": ["python3", "-c", server % port]}
    ).json()
    pid = int(started["pid"])
    assert sandbox_uid(pid) >= roomy.uid_min
    box.run("echo isolated > index.txt")
    fetch = (
        "import time, urllib.request\n"
        "for _ in range(600):\n"
        "    try:\n"
        f"        print(urllib.request.urlopen('http://127.0.0.1:{port}/index.txt').read().decode())\n"
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(0.05)\n"
    )
    result = box.exec(["python3", "-c", fetch])
    assert (result.exit, result.out) == (0, b"isolated\n\n"), result
    reader = frames(roomy, box.url(f"processes/{started['id']}/output", follow="true"))
    assert roomy.call("DELETE", f"/sandboxes/{box.rid}").status == 204
    last = next_frame(reader)
    while "e" in last or "o" in last:  # the server's request log, then the end
        last = next_frame(reader)
    assert last["error"] == "SandboxNotFound", last
    assert wait_for(lambda: not alive(pid), 10 * SLOW)


def test_a_watch_sees_only_what_the_sandbox_may_read(roomy: KernelDaemon) -> None:
    box = roomy.create()
    box.run("mkdir -p open")
    secret = box.workspace / "secret"
    secret.mkdir(mode=0o700)  # root's, inside the workspace: the sandbox cannot open it
    os.chown(secret, 0, 0)
    try:
        # Without the sandbox's credentials (root, as the daemon is) the walk would watch it:
        ino = Inotify()
        fd = ino.open()
        try:
            added = core_watch.add_tree(ino, fd, str(box.workspace), (), True, 100)
        finally:
            os.close(fd)
        assert ("secret",) in [w.parts for w in added]

        stream = frames(roomy, box.url("watch", root="/", recursive="true"))
        assert stream.status == 200
        assert json.loads(stream.readline()) == {}  # watches in place
        (secret / "hidden.txt").write_bytes(b"root's")
        box.run("echo seen > open/visible.txt")
        seen = next_frame(stream)
        while seen.get("path") != "/open/visible.txt":
            assert "secret" not in str(seen.get("path")), seen
            seen = next_frame(stream)
        assert seen["event"] == "create"
        stream.close()
    finally:
        for entry in secret.iterdir():
            entry.unlink()
        secret.rmdir()


def test_signals_reach_the_whole_process_group(roomy: KernelDaemon) -> None:
    box = roomy.create()
    started = roomy.call(
        "POST", box.url("processes"), {"cmd": ["sh", "-c", "sleep 300 & sleep 300 & wait"]}
    ).json()
    uid = sandbox_uid(int(started["pid"]))
    assert wait_for(lambda: len(processes_of([uid])) >= 3, 10 * SLOW)
    base = box.url(f"processes/{started['id']}")
    assert roomy.call("POST", base + "/signal", {"signal": "KILL"}).status == 204
    answer = roomy.call("GET", box.url(f"processes/{started['id']}/output", follow="true"))
    assert answer.body.splitlines()[-1] == b'{"exit":%d}' % (128 + signal.SIGKILL)
    # Nothing of the group is left (the sandbox's zygote, where one runs its commands, stays).
    assert wait_for(lambda: processes_of([uid]) == zygotes_of(uid), 10 * SLOW), processes_of([uid])
