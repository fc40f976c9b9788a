"""Egress by name through the daemon: a real ``twistd sandboxd`` as root, sandboxes whose
policy names hosts, commands run as their uids trying to reach the test's own "internet" of
names (:mod:`tests.kernel.names_internet`: a namespace behind a veth with HTTP and HTTPS
servers on two addresses, certificates of a CA made by the test, and a DNS server the
daemon's proxy resolves with, ``SANDBOXD_EGRESS_DNS``).

Allowed names are reached (TLS by SNI, HTTP by ``Host``, a wildcard); a denied name, an
unlisted one, a TLS SNI that does not match the address (what a sandbox's own ``/etc/hosts``
would make), a hard-coded address without a name or on another port, a name resolving to
loopback, to the metadata address or to the host itself are refused, each counted in the
metrics; a policy replaced at run time holds for the next connection.
"""

import base64
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from attrs import frozen

from tests.kernel.names_internet import NamesCA, NameServer, UdpEcho, WebServer
from tests.kernel.netns_helpers import EGRESS_MARKS, in_netns, scene
from tests.kernel.test_egress_daemon import exec_out
from tests.support.daemon import Daemon, start_daemon, stop_daemon

pytestmark = EGRESS_MARKS

A4, B4, DNS4 = "203.0.113.1", "203.0.113.2", "203.0.113.53"
HOST4 = "203.0.113.254"
A6 = "2001:db8:33::1"
ZONE = {
    "good.example": [A4, A6],
    "api.good.example": [B4],
    "bad.example": [B4],
    "other.example": [A4],
    "host.example": [HOST4],
    "loop.example": ["127.0.0.1"],
    "meta.example": ["169.254.169.254"],
}
POLICY = {
    "allow_out": [
        *("good.example", "*.good.example", "bad.example"),
        *("host.example", "loop.example", "meta.example"),
    ],
    "deny_out": ["bad.example"],
}

FETCH = """
import socket, ssl, sys
scheme, name, address, port, ca = sys.argv[1:6]
family = socket.AF_INET6 if ":" in address else socket.AF_INET
try:
    s = socket.socket(family)
    s.settimeout(5)
    s.connect((address, int(port)))
    if scheme == "https":
        s = ssl.create_default_context(cadata=ca).wrap_socket(s, server_hostname=name)
    head = f"Host: {name}\\r\\n" if name else ""
    path = "/slow" if scheme == "http-half" else "/"
    s.sendall(f"GET {path} HTTP/1.1\\r\\n{head}Connection: close\\r\\n\\r\\n".encode())
    if scheme == "http-half":  # all said: the answer, which comes later, must still come
        s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    print("ok " + data.split(b"\\r\\n\\r\\n", 1)[-1].decode() if data else "refused empty")
except (OSError, ssl.SSLError) as e:
    print("refused", type(e).__name__)
"""


DATAGRAM = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.connect((sys.argv[1], int(sys.argv[2])))
try:
    s.send(b"quic?")
    print("ok", s.recv(100).decode())
except OSError as e:
    print("refused", type(e).__name__)
"""


@frozen
class Internet:
    ca: NamesCA
    netns: str
    """The namespace its servers live in."""


@pytest.fixture
def internet() -> Iterator[Internet]:
    """The names' servers: ``a`` on A4 (and A6), ``b`` on B4, ``host`` on the host's own
    address of the veth, each on 80 (HTTP) and 443 (HTTPS), ``a`` on 8080 (HTTP) and a UDP
    echo on A4's 443 (where QUIC would be)."""
    ca = NamesCA(sorted(ZONE))
    servers: list[Any] = []
    try:
        with scene() as s:
            inet = s.netns("inet")
            inside = [f"{A4}/24", f"{B4}/24", f"{DNS4}/24", f"{A6}/64"]
            s.wire("n", inet, [f"{HOST4}/24", "2001:db8:33::fe/64"], inside)
            tls = ca.server_context()
            for netns, address, banner in (
                (inet, A4, "a"),
                (inet, B4, "b"),
                (inet, A6, "a6"),
                (None, HOST4, "host"),
            ):
                servers.append(WebServer(netns, address, 80, banner, None))
                servers.append(WebServer(netns, address, 443, banner, tls))
            servers.append(WebServer(inet, A4, 8080, "a8080", None))
            servers.append(NameServer(inet, DNS4, ZONE))
            servers.append(UdpEcho(inet, A4, 443))
            yield Internet(ca, inet)
    finally:
        for server in servers:
            server.close()
        ca.close()


def start(tmp_path: Path, uids: int, judge: str = "off") -> Daemon:
    base = 490000 + os.getpid() % 1000 * 20
    return start_daemon(
        tmp_path,
        f"--uid-min={base}",
        f"--uid-max={base + uids - 1}",
        "--network-allow=egress",
        env={"SANDBOXD_EGRESS_DNS": DNS4, "SANDBOXD_EGRESS_JUDGE": judge},
    )


@pytest.fixture(params=["off", "on"], ids=["proxied", "judged"])
def judge(request: pytest.FixtureRequest) -> str:
    """``SANDBOXD_EGRESS_JUDGE``: the names read by the proxy, or by the kernel's judge."""
    return str(request.param)


def judged_veths() -> list[str]:
    """The veths of the daemon's ``judged`` set."""
    listed = subprocess.run(
        ["nft", "-j", "list", "set", "inet", "sandboxd", "judged"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = json.loads(listed)["nftables"][1]["set"].get("elem", [])
    return [str(name) for name in found]


def created(daemon: Daemon, network: Any) -> str:
    for _ in range(600):  # a restarted daemon answers 503 while it reclaims its predecessor's
        status, body = daemon.call("POST", "/sandboxes", {"network": network})
        if status != 503:
            break
        time.sleep(0.05)
    assert status == 200, body
    return str(json.loads(body)["remote_id"])


def fetch(
    daemon: Daemon, rid: str, ca: NamesCA, scheme: str, name: str, address: str, port: int = 0
) -> str:
    """What a sandbox's request for ``name`` at ``address`` gets: ``ok <banner> <name the
    server saw>`` or ``refused <why>``."""
    port = port or (443 if scheme == "https" else 80)  # (http-half: HTTP, then SHUT_WR)
    argv = ("python3", "-c", FETCH, scheme, name, address, str(port), ca.pem)
    return exec_out(daemon, rid, *argv).strip()


CURL = (
    'printf %s "$1" >"$HOME/ca.pem"; curl -sS -m 5 --cacert "$HOME/ca.pem" --resolve "$2" "$3" 2>&1'
)


def curl(daemon: Daemon, rid: str, ca: NamesCA, resolve: str, url: str) -> str:
    """What ``curl`` in the sandbox gets for ``url``, its name resolved as ``resolve`` says
    (``NAME:PORT:ADDRESS``, what a line of the sandbox's own ``/etc/hosts`` would do)."""
    status, body = daemon.call(
        "POST", f"/sandboxes/{rid}/exec", {"cmd": ["sh", "-c", CURL, "sh", ca.pem, resolve, url]}
    )
    assert status == 200, body
    final = json.loads(body.splitlines()[-1])
    return base64.b64decode(final["out"]).decode().strip()


def proxy_port() -> int:
    """The proxy's port, as the redirect of the daemon's table names it."""
    listed = subprocess.run(
        ["nft", "list", "chain", "inet", "sandboxd", "proxy_redirect"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(listed.split("redirect to :")[1].split()[0])


def accepted(netns: str | None, address: str, port: int) -> bool:
    """Whether a connection from ``netns`` to ``address:port`` is accepted at all."""

    def attempt() -> bool:
        with socket.socket() as s:
            s.settimeout(3)
            try:
                s.connect((address, port))
            except OSError:
                return False
            return True

    return in_netns(netns, attempt)


def refused_counts(daemon: Daemon, rid: str) -> dict[str, float]:
    status, body = daemon.call("GET", "/metrics")
    assert status == 200
    counts = {}
    for line in body.decode().splitlines():
        if line.startswith("sandboxd_egress_refused_total{") and f'sandbox="{rid}"' in line:
            reason = line.split('reason="')[1].split('"')[0]
            counts[reason] = float(line.rsplit(" ", 1)[1])
    return counts


def test_allowed_names_are_reached_and_the_rest_refused(
    internet: Internet, tmp_path: Path, judge: str
) -> None:
    ca = internet.ca
    daemon = start(tmp_path, 2, judge)
    try:
        rid = created(daemon, {"mode": "egress", **POLICY})
        if judge == "on":  # (the kernel refuses the operator's ranges before a judge sees them)
            assert len(judged_veths()) == 1
        else:
            port = proxy_port()  # the proxy's listener: for sandbox veths alone
            assert not accepted(None, "127.0.0.1", port) and not accepted(None, HOST4, port)
            assert not accepted(internet.netns, HOST4, port)
        listed = daemon.json("GET", f"/sandboxes/{rid}/network")
        assert listed["allow_out"] == POLICY["allow_out"] and listed["deny_out"] == ["bad.example"]
        # allowed: TLS by SNI, HTTP by Host, a wildcard's name, IPv6
        assert fetch(daemon, rid, ca, "https", "good.example", A4) == "ok a good.example"
        assert fetch(daemon, rid, ca, "http", "good.example", A4) == "ok a good.example"
        assert fetch(daemon, rid, ca, "http-half", "good.example", A4) == "ok a good.example"
        assert fetch(daemon, rid, ca, "https", "api.good.example", B4) == "ok b api.good.example"
        assert fetch(daemon, rid, ca, "https", "good.example", A6) == "ok a6 good.example"
        # denied (deny wins over allow) and unlisted names
        assert fetch(daemon, rid, ca, "https", "bad.example", B4).startswith("refused")
        assert fetch(daemon, rid, ca, "http", "other.example", A4).startswith("refused")
        # an SNI or Host that is not the address's name (a forged /etc/hosts, a hard-coded
        # address under an allowed name)
        assert fetch(daemon, rid, ca, "https", "good.example", B4).startswith("refused")
        assert fetch(daemon, rid, ca, "http", "api.good.example", A4).startswith("refused")
        # curl, its name resolved by the sandbox to the right address, then to another one
        url = "https://good.example/"
        assert curl(daemon, rid, ca, f"good.example:443:{A4}", url) == "a good.example"
        assert "curl: (35)" in curl(daemon, rid, ca, f"good.example:443:{B4}", url)
        # a hard-coded address: without a name, on another port
        assert fetch(daemon, rid, ca, "http", "", A4).startswith("refused")
        assert fetch(daemon, rid, ca, "http", "good.example", A4, 8080).startswith("refused")
        # names resolving to the host, loopback, the metadata address (DNS rebinding)
        assert fetch(daemon, rid, ca, "http", "host.example", HOST4).startswith("refused")
        assert fetch(daemon, rid, ca, "https", "loop.example", A4).startswith("refused")
        assert fetch(daemon, rid, ca, "http", "meta.example", "169.254.169.254").startswith(
            "refused"
        )
        counts = refused_counts(daemon, rid)
        expected = {"denied": 1, "not_allowed": 1, "mismatch": 4, "no_name": 1}
        if judge == "off":
            expected["operator_denied"] = 2
        assert counts == expected, counts
        assert daemon.call("DELETE", f"/sandboxes/{rid}")[0] == 204
        assert refused_counts(daemon, rid) == {}  # a sandbox's counts go with it
    finally:
        stop_daemon(daemon)


def test_a_policy_by_name_replaced_at_run_time_holds_for_the_next_connection(
    internet: Internet, tmp_path: Path, judge: str
) -> None:
    ca = internet.ca
    daemon = start(tmp_path, 2, judge)
    try:
        rid = created(daemon, {"mode": "egress", "allow_out": ["good.example"]})
        assert fetch(daemon, rid, ca, "https", "good.example", A4) == "ok a good.example"
        assert fetch(daemon, rid, ca, "https", "other.example", A4).startswith("refused")
        status, body = daemon.call(
            "PUT", f"/sandboxes/{rid}/network", {"allow_out": ["other.example"]}
        )
        assert status == 200, body
        assert fetch(daemon, rid, ca, "https", "other.example", A4) == "ok a other.example"
        assert fetch(daemon, rid, ca, "https", "good.example", A4).startswith("refused")
        # a deny list of names alone: every address stays allowed but UDP (QUIC has no name)
        udp = ("python3", "-c", DATAGRAM, A4, "443")
        only_bad = {"deny_out": ["bad.example"]}
        assert daemon.call("PUT", f"/sandboxes/{rid}/network", only_bad)[0] == 200
        assert fetch(daemon, rid, ca, "https", "good.example", A4) == "ok a good.example"
        assert fetch(daemon, rid, ca, "https", "bad.example", B4).startswith("refused")
        assert exec_out(daemon, rid, *udp).startswith("refused")
        assert daemon.call("PUT", f"/sandboxes/{rid}/network", {})[0] == 200  # nothing by name
        assert fetch(daemon, rid, ca, "https", "good.example", B4) == "ok b good.example"
        assert exec_out(daemon, rid, *udp).strip() == "ok quic?"
    finally:
        stop_daemon(daemon)


def judge_pids(daemon: Daemon) -> list[int]:
    """The daemon's ``sandboxd-judge`` children (none while it is restarting one)."""
    found = []
    for task in Path(f"/proc/{daemon.process.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                if Path(f"/proc/{child}/comm").read_text().strip() == "sandboxd-judge":
                    found.append(int(child))
            except OSError:  # (gone meanwhile)
                continue
    return found


def test_a_judge_killed_is_replaced_with_the_sandboxes_policies(
    internet: Internet, tmp_path: Path
) -> None:
    """SIGKILL the daemon's judge: within seconds a new one runs with the sandbox's policy,
    and names are judged as before (what the kernel does meanwhile, no judge listening:
    ``tests/kernel/test_egress_judge.py``, nothing leaves)."""
    ca = internet.ca
    daemon = start(tmp_path, 2, "on")
    try:
        rid = created(daemon, {"mode": "egress", "allow_out": ["good.example"]})
        assert fetch(daemon, rid, ca, "http", "good.example", A4) == "ok a good.example"
        (first,) = judge_pids(daemon)
        os.kill(first, 9)
        deadline = time.monotonic() + 10
        while judge_pids(daemon) in ([], [first]) and time.monotonic() < deadline:
            time.sleep(0.05)
        (second,) = judge_pids(daemon)
        assert second != first
        assert fetch(daemon, rid, ca, "https", "good.example", A4) == "ok a good.example"
        assert fetch(daemon, rid, ca, "https", "other.example", A4).startswith("refused")
        assert refused_counts(daemon, rid) == {"not_allowed": 1}
    finally:
        stop_daemon(daemon)
    assert judge_pids_gone(second)


def judge_pids_gone(pid: int) -> bool:
    """Whether the judge ``pid`` ended with its daemon (within 5 s)."""
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not Path(f"/proc/{pid}").exists()
