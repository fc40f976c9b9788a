"""Egress offered by default: a real ``twistd sandboxd`` as root with no network setting, and
E2B's default create (``allow_internet_access`` absent) through its E2B front.

The test's own "internet" is a namespace behind a veth holding a public-looking address
(198.51.100.1) and a private one (``10.231.N.1``, a /24 the test makes): nothing else is ever
addressed. Nothing changes on the host until the first egress create, and the host is as found
again once the last egress sandbox is gone; the private address is out of reach by default
but for DNS to a resolver the daemon's ``resolv.conf`` names, and reachable with
``SANDBOXD_EGRESS_DENY`` empty; an operator who leaves egress out gets a 400 naming the
setting.
"""

import fcntl
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from sandboxd.isolation.network.egress_host import Egress
from tests.kernel.netns_helpers import Scene, in_netns, scene
from tests.kernel.test_egress_daemon import (
    INET4,
    exec_out,
    pytestmark,  # noqa: F401  (root and nft, as there)
    reach,
    sysctls,
    table_exists,
    veths,
)
from tests.support.daemon import Daemon, free_port, start_daemon, stop_daemon

PRIVATE = f"10.231.{os.getpid() % 250}"
RESOLVER = f"{PRIVATE}.1"
LOCK_FILE = str(attrs.fields(Egress).lock_file.default)

ASK_DNS = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.connect((sys.argv[1], 53))
s.send(b"query")
try:
    print("ok", s.recv(100).decode())
except OSError as e:
    print("refused", type(e).__name__)
"""


class Internet:
    """The test's internet: its namespace, a TCP server on each address, a resolver."""

    def __init__(self, s: Scene) -> None:
        self.netns = s.netns("inet")
        s.wire(
            "d",
            self.netns,
            ["198.51.100.254/24", f"{PRIVATE}.254/24"],
            [f"{INET4}/24", f"{RESOLVER}/24"],
        )
        self.public = s.serve(self.netns, INET4, "internet").port
        self.private = s.serve(self.netns, RESOLVER, "private").port
        self.dns = in_netns(self.netns, self._udp53)
        threading.Thread(target=self._answer, daemon=True).start()

    @staticmethod
    def _udp53() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((RESOLVER, 53))
        return sock

    def _answer(self) -> None:
        while True:
            try:
                data, peer = self.dns.recvfrom(100)
                self.dns.sendto(b"answer to " + data, peer)
            except OSError:
                return


@pytest.fixture
def internet() -> Iterator[Internet]:
    with scene() as s:
        net = Internet(s)
        try:
            yield net
        finally:
            net.dns.close()


def start(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[Daemon, str]:
    """A daemon with an E2B front, no network setting but ``args``; the front's URL."""
    base = 436000 + os.getpid() % 1000 * 20
    port = free_port()
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver 127.0.0.53\nnameserver {RESOLVER}\n")
    daemon = start_daemon(
        tmp_path,
        f"--uid-min={base}",
        f"--uid-max={base + 19}",
        f"--e2b-listen=tcp:{port}:interface=127.0.0.1",
        f"--resolv-conf={resolv}",
        *args,
        env=env,
    )
    return daemon, f"http://127.0.0.1:{port}"


def e2b_create(front: str, **body: object) -> tuple[int, dict[str, object]]:
    """``POST /v2/sandboxes`` as the E2B SDK sends it (no ``allow_internet_access``: E2B's
    default)."""
    data = json.dumps({"templateID": "base", **body}).encode()
    request = urllib.request.Request(
        f"{front}/v2/sandboxes", data=data, method="POST", headers={"X-API-Key": "any"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def capabilities(daemon: Daemon) -> list[str]:
    return list(json.loads(daemon.call("GET", "/healthz")[1])["capabilities"])


def test_e2b_gets_egress_by_default_and_the_host_changes_only_while_it_is_used(
    internet: Internet, tmp_path: Path
) -> None:
    found = sysctls()
    daemon, front = start(tmp_path)
    try:
        assert "network.egress" in capabilities(daemon)
        assert not table_exists() and sysctls() == found  # nothing at start-up
        native = daemon.create()  # the native default is unchanged: its loopback alone
        lines = exec_out(daemon, native, "cat", "/proc/net/dev").splitlines()[2:]
        assert [line.split(":")[0].strip() for line in lines] == ["lo"]
        assert not table_exists()
        with open(LOCK_FILE, "a") as held:  # another owner of the host's egress layer
            fcntl.flock(held, fcntl.LOCK_EX)
            status, refused = e2b_create(front)
        assert status == 503, refused
        assert "another sandboxd owns" in str(refused["message"])
        assert "SANDBOXD_NETWORK_ALLOW" in str(refused["message"])
        assert not table_exists() and sysctls() == found and not veths()  # it left nothing
        status, created = e2b_create(front)
        assert status == 201, created
        rid = str(created["sandboxID"])
        assert table_exists()
        assert reach(daemon, rid, INET4, internet.public) == "ok internet"
        assert reach(daemon, rid, RESOLVER, internet.private).startswith("refused")
        dns = exec_out(daemon, rid, "python3", "-c", ASK_DNS, RESOLVER).strip()
        assert dns == "ok answer to query"
        daemon.call("DELETE", f"/sandboxes/{rid}")
        assert not table_exists() and sysctls() == found  # the last egress sandbox is gone
    finally:
        stop_daemon(daemon)
    assert not table_exists() and not veths() and sysctls() == found


def test_e2b_is_refused_naming_the_setting_where_egress_is_left_out(tmp_path: Path) -> None:
    daemon, front = start(tmp_path, "--network-allow=none,host")
    try:
        assert "network.egress" not in capabilities(daemon)
        status, refused = e2b_create(front)
        assert status == 400, refused
        assert "SANDBOXD_NETWORK_ALLOW=none,host leaves it out" in str(refused["message"])
        status, created = e2b_create(front, allow_internet_access=False)
        assert status == 201, created
    finally:
        stop_daemon(daemon)
    assert not table_exists()


def test_private_ranges_are_reachable_once_the_operator_empties_the_deny_list(
    internet: Internet, tmp_path: Path
) -> None:
    daemon, front = start(tmp_path, env={"SANDBOXD_EGRESS_DENY": ""})
    try:
        status, created = e2b_create(front)
        assert status == 201, created
        rid = str(created["sandboxID"])
        assert reach(daemon, rid, RESOLVER, internet.private) == "ok private"
    finally:
        stop_daemon(daemon)
    for _ in range(100):  # its veth goes with its namespace, asynchronously
        if not veths():
            break
        time.sleep(0.02)
    assert not table_exists() and not veths()


def test_a_sigkilled_daemons_layer_is_removed_when_the_next_starts(tmp_path: Path) -> None:
    """Offered by default, the next daemon changes nothing on the host at start-up but give
    back what a crashed predecessor left (its table, the forwarding it turned on)."""
    found = sysctls()
    first, front = start(tmp_path)
    try:
        status, created = e2b_create(front)
        assert status == 201, created
        first.process.kill()
        first.process.wait()
        assert table_exists()
        second, _ = start(tmp_path)
        try:
            assert not table_exists() and sysctls() == found
            for _ in range(250):  # the predecessor's sandbox goes with its pins, its veth too
                if not veths():
                    break
                time.sleep(0.02)
            assert not veths()
        finally:
            stop_daemon(second)
    finally:
        stop_daemon(first)
    assert not table_exists()
