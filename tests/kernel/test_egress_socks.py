"""Egress through an operator's SOCKS5 proxy: a real ``twistd sandboxd`` as root with
``SANDBOXD_EGRESS_SOCKS5`` (and a user and password file), real sandboxes, and a real SOCKS5
server (``pproxy`` from PyPI) in the test's own "internet" (:mod:`tests.kernel.names_internet`:
a namespace behind a veth, web servers with a test CA, a DNS server).

The SOCKS5 server listens on an address of its own and connects out from it, so an upstream
sees who connected: the SOCKS5 server, never the host's address that a direct (masqueraded)
connection would come from. Each connection is checked in its log (``pproxy -v``: one line
per ``CONNECT``), the upstreams' peers, and an nftables counter in the "internet" of every
SYN from the host's address to the upstreams' ports (what a direct connection would
send first). Through the proxy: an allowed name (TLS by SNI), an address an open policy lets
through, a CIDR an address list allows; refused: an address that list leaves out, the host
itself, UDP. Fails closed: with the SOCKS5 server stopped, replaced by one answering garbage,
or refusing the password, a sandbox's connection is reset and counted, and nothing of it
reaches the "internet".
"""

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from attrs import define, field

from tests.kernel.names_internet import NamesCA, NameServer, UdpEcho, WebServer
from tests.kernel.netns_helpers import EGRESS_MARKS, in_netns, scene, sh
from tests.kernel.test_egress_daemon import exec_out
from tests.kernel.test_egress_names import DATAGRAM, created, fetch, refused_counts
from tests.support.daemon import Daemon, start_daemon, stop_daemon

pytestmark = EGRESS_MARKS

A4, B4, DNS4, SOCKS4 = "203.0.113.1", "203.0.113.2", "203.0.113.53", "203.0.113.80"
HOST4 = "203.0.113.254"
"""The host's address on the veth: where a direct connection would come from."""
SOCKS_PORT = 1080
PEER_PORT = 7000
USER, PASSWORD = "sandboxd", "s3cret-socks"
ZONE = {"good.example": [A4], "other.example": [A4]}

CONNECT = """
import socket, sys
address, port = sys.argv[1], int(sys.argv[2])
try:
    s = socket.create_connection((address, port), timeout=5)
    data = b""
    while chunk := s.recv(100):
        data += chunk
    print("ok", data.decode() if data else "(closed)")
except OSError as e:
    print("refused", type(e).__name__)
"""


class PeerServer:
    """A TCP server in ``netns`` that answers each connection with ``peer <address>`` (the
    address it came from, first: the server speaks first) and closes it; :attr:`peers`
    keeps them."""

    def __init__(self, netns: str, address: str, port: int) -> None:
        def make() -> socket.socket:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
            s.listen(16)
            return s

        self.sock = in_netns(netns, make)
        self.peers: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.peers.append(peer[0])
            with conn, suppress(OSError):
                conn.sendall(f"peer {peer[0]}".encode())

    def close(self) -> None:
        with suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class Garbage:
    """A TCP server in ``netns`` that answers anything with an HTTP error: no SOCKS5."""

    def __init__(self, netns: str, address: str, port: int) -> None:
        def make() -> socket.socket:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
            s.listen(16)
            return s

        self.sock = in_netns(netns, make)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, suppress(OSError):
                conn.recv(100)
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

    def close(self) -> None:
        with suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@define
class Socks:
    """``pproxy`` serving SOCKS5 on ``SOCKS4:SOCKS_PORT`` in the "internet", connecting out
    from that address (``@in``), asking ``user:password``; its log in ``log``."""

    netns: str
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, password: str = PASSWORD) -> None:
        uri = f"socks5://{SOCKS4}:{SOCKS_PORT}/@in#{USER}:{password}"
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                ["nsenter", f"--net={self.netns}", sys.executable, "-m", "pproxy", "-l", uri, "-v"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.wait_listening()

    def wait_listening(self) -> None:
        """Return once it listens."""
        for _ in range(200):
            with socket.socket() as s:
                s.settimeout(1)
                if s.connect_ex((SOCKS4, SOCKS_PORT)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("pproxy did not listen")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def connects(self) -> list[str]:
        """The ``CONNECT`` destinations the SOCKS5 server logged (``ADDRESS:PORT``)."""
        return [
            line.rsplit(" -> ", 1)[1]
            for line in self.log.read_text().splitlines()
            if line.startswith("socks5 ") and " -> " in line
        ]


@define
class World:
    daemon: Daemon
    socks: Socks
    ca: NamesCA
    netns: str
    peers: PeerServer
    servers: list[Any] = field(factory=list)
    direct_seen: int = 0
    """:meth:`direct_packets` after the fixture's own direct connection (which shows that
    the counter sees one)."""

    def direct_packets(self) -> int:
        """:func:`direct_packets` of the "internet"."""
        return direct_packets(self.netns)


def counted_packets(netns: str) -> int:
    """Connections the "internet" ``netns`` was asked for from the host's address to the
    upstreams' ports (:data:`PEER_PORT`, 443): their SYNs, counted by :data:`WATCH`'s chain.
    Only SYNs: a late retransmission of a closed connection's FIN or ACK (seen once, on a
    loaded machine) is not a new connection."""
    listed = sh("nsenter", f"--net={netns}", "nft", "list", "chain", "inet", "watch", "in")
    return sum(
        int(line.split("packets ")[1].split()[0])
        for line in listed.splitlines()
        if "packets " in line
    )


def direct_packets(netns: str) -> int:
    """What a connection that left directly would send: :func:`counted_packets`, once it
    stays the same for :data:`SETTLE` seconds (at most ten tries). The last packets of a
    connection just closed (its FIN, its ACK of the peer's) are counted by the receiving
    side, which may run after the sender's ``close`` has returned."""
    seen = counted_packets(netns)
    for _ in range(10):
        time.sleep(SETTLE)
        now, seen = seen, counted_packets(netns)
        if now == seen:
            break
    return seen


SETTLE = 0.3
"""Seconds the direct packets' count must stay the same to be read (:func:`direct_packets`)."""

WATCH = f"""table inet watch {{
  chain in {{
    type filter hook prerouting priority -500; policy accept;
    ip saddr {HOST4} tcp dport {{ {PEER_PORT}, 443 }} tcp flags & (syn | ack) == syn counter
  }}
}}
"""


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """The "internet" (web servers on A4 and B4, a peer server on both, DNS, the SOCKS5
    server) and one daemon sending egress through that SOCKS5 server with a password."""
    ca = NamesCA(sorted(ZONE))
    servers: list[Any] = []
    work = Path(tempfile.mkdtemp(prefix="egress-socks-"))
    socks: Socks | None = None
    try:
        with scene() as s:
            inet = s.netns("inet")
            inside = [f"{a}/24" for a in (A4, B4, DNS4, SOCKS4)]
            s.wire("s", inet, [f"{HOST4}/24"], inside)
            sh("nsenter", f"--net={inet}", "nft", "-f", "-", stdin=WATCH)
            tls = ca.server_context()
            servers += [WebServer(inet, A4, 443, "a", tls), WebServer(inet, B4, 443, "b", tls)]
            servers += [NameServer(inet, DNS4, ZONE), UdpEcho(inet, A4, 443)]
            peers = PeerServer(inet, "0.0.0.0", PEER_PORT)
            servers.append(peers)
            socks = Socks(inet, work / "pproxy.log")
            socks.start()
            password = work / "password"
            password.write_text(PASSWORD + "\n")
            password.chmod(0o600)
            base = 492000 + os.getpid() % 1000 * 20
            daemon = start_daemon(
                work,
                f"--uid-min={base}",
                f"--uid-max={base + 3}",
                "--network-allow=egress",
                env={
                    "SANDBOXD_EGRESS_DNS": DNS4,
                    "SANDBOXD_EGRESS_SOCKS5": f"{SOCKS4}:{SOCKS_PORT}",
                    "SANDBOXD_EGRESS_SOCKS5_USER": USER,
                    "SANDBOXD_EGRESS_SOCKS5_PASSWORD_FILE": str(password),
                },
            )
            try:
                world = World(daemon, socks, ca, inet, peers, servers)
                with socket.create_connection((A4, PEER_PORT), timeout=5) as direct:
                    assert direct.recv(100) == f"peer {HOST4}".encode()  # a direct one
                world.direct_seen = world.direct_packets()
                assert world.direct_seen > 0
                peers.peers.clear()
                yield world
            finally:
                stop_daemon(daemon)
    finally:
        if socks is not None:
            socks.stop()
        for server in servers:
            server.close()
        ca.close()
        subprocess.run(["rm", "-rf", str(work)], check=False)


def reach(world: World, rid: str, address: str, port: int = PEER_PORT) -> str:
    return exec_out(world.daemon, rid, "python3", "-c", CONNECT, address, str(port)).strip()


def test_every_connection_leaves_through_the_socks5_proxy(world: World) -> None:
    daemon, socks = world.daemon, world.socks
    open_rid = created(daemon, "egress")  # no policy: every address the operator permits
    assert reach(world, open_rid, A4) == f"ok peer {SOCKS4}"  # not HOST4: not direct
    by_name = created(daemon, {"mode": "egress", "allow_out": ["good.example", f"{B4}/32"]})
    assert fetch(daemon, by_name, world.ca, "https", "good.example", A4) == "ok a good.example"
    assert reach(world, by_name, B4) == f"ok peer {SOCKS4}"  # a CIDR allows it: by address
    assert socks.connects() == [f"{A4}:{PEER_PORT}", f"{A4}:443", f"{B4}:{PEER_PORT}"]
    assert world.peers.peers == [SOCKS4, SOCKS4]
    # refused before any SOCKS5 request: what the list leaves out, the host itself, UDP
    assert reach(world, by_name, A4).startswith("refused")
    assert fetch(daemon, by_name, world.ca, "https", "other.example", A4).startswith("refused")
    assert reach(world, open_rid, HOST4, 22).startswith("refused")
    udp = exec_out(daemon, open_rid, "python3", "-c", DATAGRAM, A4, "443").strip()
    assert udp.startswith("refused")
    assert refused_counts(daemon, by_name) == {"not_allowed": 2}
    assert refused_counts(daemon, open_rid) == {"operator_denied": 1}
    assert len(socks.connects()) == 3 and world.direct_packets() == world.direct_seen


def test_no_socks5_proxy_no_way_out(world: World) -> None:
    daemon, socks = world.daemon, world.socks
    rid = created(daemon, "egress")
    peers_before, connects_before = len(world.peers.peers), len(socks.connects())
    socks.stop()
    garbage = None
    try:
        assert reach(world, rid, A4).startswith("refused")  # stopped: nothing listens there
        assert fetch(daemon, rid, world.ca, "https", "good.example", A4).startswith("refused")
        garbage = Garbage(world.netns, SOCKS4, SOCKS_PORT)  # answers, but not SOCKS5
        assert reach(world, rid, A4).startswith("refused")
        garbage.close()
        garbage = None
        socks.start(password="not-the-daemons")  # refuses the daemon's password
        assert reach(world, rid, A4).startswith("refused")
        assert refused_counts(daemon, rid) == {
            "socks_unreachable": 2,
            "socks_protocol": 1,
            "socks_auth": 1,
        }
        assert (
            len(world.peers.peers) == peers_before and world.direct_packets() == world.direct_seen
        )
    finally:
        if garbage is not None:
            garbage.close()
        socks.stop()
        socks.start()
    assert reach(world, rid, A4) == f"ok peer {SOCKS4}"  # back: through it again
    assert (
        len(socks.connects()) == connects_before + 1 and world.direct_packets() == world.direct_seen
    )
