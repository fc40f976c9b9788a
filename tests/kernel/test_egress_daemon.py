"""The egress mode through the daemon: a real ``twistd sandboxd`` as root, sandboxes created
with ``network: "egress"``, commands run as their uids trying to reach things.

The test's own "internet" is a namespace holding a server on 198.51.100.1 behind a veth. An
egress sandbox reaches it and neither the daemon's API (on the host's loopback) nor another
egress sandbox's server; a ``host`` sandbox (the same attack with the layer off by name)
reaches the API. Stopping the daemon leaves no table, no veth, and the forwarding sysctls as
they were found. (Egress offered by default, without naming it: ``test_egress_default.py``.)
"""

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.isolation.network.egress_host import FORWARDING_V4, FORWARDING_V6
from tests.kernel.netns_helpers import EGRESS_MARKS, Scene, scene
from tests.support.daemon import Daemon, start_daemon, stop_daemon

pytestmark = EGRESS_MARKS

INET4 = "198.51.100.1"
INET6 = "2001:db8:51::1"

CONNECT = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
s = socket.socket(family)
s.settimeout(5)
try:
    s.connect((host, port))
except OSError as e:
    print("refused", type(e).__name__)
    sys.exit()
try:
    s.sendall(b"GET /healthz HTTP/1.0\\r\\n\\r\\n")  # an HTTP server answers only then
    print("ok", s.recv(100).decode(errors="replace")[:20])
except OSError as e:
    print("ok", type(e).__name__)
"""

SERVE = """
import socket
s = socket.socket()
s.bind(("0.0.0.0", 0))
s.listen(4)
probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
probe.connect(("198.51.100.1", 9))  # no packet: only picks the source address
print(probe.getsockname()[0], s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"sandbox-b")
    c.close()
"""


def exec_out(daemon: Daemon, rid: str, *argv: str) -> str:
    status, body = daemon.call("POST", f"/sandboxes/{rid}/exec", {"cmd": list(argv)})
    assert status == 200, body
    final = json.loads(body.splitlines()[-1])
    assert final.get("exit") == 0, final
    return base64.b64decode(final["out"]).decode()


def reach(daemon: Daemon, rid: str, host: str, port: int) -> str:
    return exec_out(daemon, rid, "python3", "-c", CONNECT, host, str(port)).strip()


def create(daemon: Daemon, network: str) -> str:
    for _ in range(600):  # a restarted daemon answers 503 while it reclaims its predecessor's
        status, body = daemon.call("POST", "/sandboxes", {"network": network})
        if status != 503:
            break
        time.sleep(0.05)
    assert status == 200, body
    return str(json.loads(body)["remote_id"])


def veths() -> list[str]:
    return [name for name in os.listdir("/sys/class/net") if name.startswith("sbx")]


def table_exists() -> bool:
    listed = subprocess.run(["nft", "list", "table", "inet", "sandboxd"], capture_output=True)
    return listed.returncode == 0


def sysctls() -> dict[str, str]:
    return {path: Path(path).read_text().strip() for path in (FORWARDING_V4, FORWARDING_V6)}


@pytest.fixture
def internet() -> Iterator[tuple[Scene, int, int]]:
    with scene() as s:
        inet = s.netns("inet")
        s.wire(
            "i", inet, ["198.51.100.254/24", "2001:db8:51::fe/64"], [f"{INET4}/24", f"{INET6}/64"]
        )
        four = s.serve(inet, INET4, "internet")
        six = s.serve(inet, INET6, "internet6")
        yield s, four.port, six.port


def test_egress_sandboxes_reach_the_internet_and_nothing_of_the_host(
    internet: tuple[Scene, int, int], tmp_path: Path
) -> None:
    _, port4, port6 = internet
    found = sysctls()
    base = 430000 + os.getpid() % 1000 * 20
    daemon = start_daemon(
        tmp_path, f"--uid-min={base}", f"--uid-max={base + 19}", "--network-allow=none,egress,host"
    )
    try:
        health = json.loads(daemon.call("GET", "/healthz")[1])
        assert "network.egress" in health["capabilities"]
        a, b, host = create(daemon, "egress"), create(daemon, "egress"), create(daemon, "host")
        assert reach(daemon, a, INET4, port4) == "ok internet"
        assert reach(daemon, a, INET6, port6) == "ok internet6"
        assert reach(daemon, a, "127.0.0.1", daemon.port).startswith("refused")
        assert reach(daemon, host, "127.0.0.1", daemon.port).startswith("ok HTTP/1.0 200")
        line = exec_out(
            daemon,
            b,
            "sh",
            "-c",
            'python3 -u -c "$1" >"$HOME/addr" 2>&1 </dev/null &'
            ' until [ -s "$HOME/addr" ]; do sleep 0.05; done; cat "$HOME/addr"',
            "sh",
            SERVE,
        )
        address, port = line.split()
        assert address.startswith("10.200.")
        assert reach(daemon, b, address, int(port)) == "ok sandbox-b"  # its own: served
        assert reach(daemon, a, address, int(port)).startswith("refused")
        assert reach(daemon, a, "10.200.0.0", daemon.port).startswith("refused")  # the gateway
        daemon.call("DELETE", f"/sandboxes/{a}")
        for _ in range(500):  # the kernel deletes a's veth with its namespace, asynchronously
            if len(veths()) == 1:
                break
            time.sleep(0.01)
        assert len(veths()) == 1
    finally:
        stop_daemon(daemon)
    assert subprocess.run(
        ["nft", "list", "table", "inet", "sandboxd"], capture_output=True
    ).returncode
    assert not veths()
    assert sysctls() == found


def test_egress_is_offered_by_default_and_started_by_its_first_create(tmp_path: Path) -> None:
    base = 432000 + os.getpid() % 1000 * 20
    daemon = start_daemon(tmp_path, f"--uid-min={base}", f"--uid-max={base + 19}")
    try:
        health = json.loads(daemon.call("GET", "/healthz")[1])
        assert "network.egress" in health["capabilities"]
        assert not table_exists()
        create(daemon, "egress")
        assert table_exists()
    finally:
        stop_daemon(daemon)
    assert subprocess.run(
        ["nft", "list", "table", "inet", "sandboxd"], capture_output=True
    ).returncode


def test_a_sigkilled_daemons_egress_is_reclaimed_by_the_next(tmp_path: Path) -> None:
    found = sysctls()
    base = 434000 + os.getpid() % 1000 * 20
    args = (f"--uid-min={base}", f"--uid-max={base + 19}", "--network-allow=none,egress")
    first = start_daemon(tmp_path, *args)
    try:
        create(first, "egress")
        first.process.kill()
        first.process.wait()
        assert len(veths()) == 1  # its sandbox's namespace is still pinned, its veth with it
        assert table_exists()
        second = start_daemon(tmp_path, *args)
        try:
            assert not veths()  # reclaimed before its own first create
            rid = create(second, "egress")
            # ip asks the sandbox's own network namespace (/sys/class/net would show the one
            # that mounted /sys: the host's, which may have an eth0 of its own).
            link = exec_out(second, rid, "/bin/ip", "-o", "link", "show", "dev", "eth0")
            flags = link.split("<", 1)[1].split(">", 1)[0].split(",")
            assert {"UP", "LOWER_UP"} <= set(flags), link
        finally:
            stop_daemon(second)
    finally:
        stop_daemon(first)
    assert not table_exists()
    assert not veths()
    assert sysctls() == found
