"""A sandbox's own SOCKS5 proxy, as the unmodified E2B SDK asks for it
(``Sandbox.create(network={"egress_proxy": {...}})``), on a real daemon as root with no
operator SOCKS5 proxy: real sandboxes, nftables, and a real SOCKS5 server (``pproxy``) in the
test's own "internet" (``test_egress_socks``'s pieces: docs/isolation.rst, "A sandbox's own
SOCKS5 proxy").

A sandbox with a proxy reaches the "internet" only through it (the peer server sees the
SOCKS5 server's address, never the host's, and the "internet" counts no packet from the
host's address to the upstreams' ports); its ``deny_out`` still holds before any ``CONNECT``;
a sandbox without a proxy, beside it, goes out directly. With a wrong password it fails
closed: refused and counted, nothing sent directly. The detail shows the proxy without its
password; an address the operator denies, or a CA that is no PEM, is a 400 naming it (TLS to
the proxy: ``test_egress_socks_tls``).
"""

import contextlib
import os
import shlex
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from attrs import define
from e2b import Sandbox
from e2b.sandbox.sandbox_api import SandboxEgressProxyOpts

from tests.e2b.conftest import E2BDaemon, point_sdk_at, running_front
from tests.kernel.netns_helpers import EGRESS_MARKS, scene, sh
from tests.kernel.test_egress_socks import (
    A4,
    B4,
    CONNECT,
    HOST4,
    PASSWORD,
    PEER_PORT,
    SOCKS4,
    SOCKS_PORT,
    USER,
    WATCH,
    PeerServer,
    Socks,
    direct_packets,
)

pytestmark = EGRESS_MARKS

PROXY: SandboxEgressProxyOpts = {
    "address": f"{SOCKS4}:{SOCKS_PORT}",
    "username": USER,
    "password": PASSWORD,
}


@define
class Internet:
    netns: str
    socks: Socks
    peers: PeerServer

    def direct_packets(self) -> int:
        """:func:`~tests.kernel.test_egress_socks.direct_packets` of the "internet"."""
        return direct_packets(self.netns)


@contextlib.contextmanager
def internet_of(
    prefix: str, make_socks: Callable[[str, Path], Socks]
) -> Iterator[tuple[str, Socks, PeerServer]]:
    """The "internet" namespace with the peer server on A4 and B4 and the SOCKS5 server
    ``make_socks(netns, work directory)`` on SOCKS4, started; all of it removed after."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    socks: Socks | None = None
    peers: PeerServer | None = None
    try:
        with scene() as s:
            inet = s.netns("inet")
            s.wire("o", inet, [f"{HOST4}/24"], [f"{a}/24" for a in (A4, B4, SOCKS4)])
            sh("nsenter", f"--net={inet}", "nft", "-f", "-", stdin=WATCH)
            peers = PeerServer(inet, "0.0.0.0", PEER_PORT)
            socks = make_socks(inet, work)
            socks.start()
            yield inet, socks, peers
    finally:
        if socks is not None:
            socks.stop()
        if peers is not None:
            peers.close()
        subprocess.run(["rm", "-rf", str(work)], check=False)


@pytest.fixture(scope="module")
def internet() -> Iterator[Internet]:
    """The "internet": the peer server on A4 and B4, and the SOCKS5 server asking a password."""
    plain = internet_of("egress-socks-own-", lambda inet, work: Socks(inet, work / "pproxy.log"))
    with plain as (inet, socks, peers):
        yield Internet(inet, socks, peers)


@pytest.fixture
def front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[E2BDaemon]:
    base = 493000 + os.getpid() % 1000 * 20
    args = ("--network-allow=egress", f"--uid-min={base}", f"--uid-max={base + 3}")
    with running_front(tmp_path, *args) as started:
        yield point_sdk_at(monkeypatch, started)


def reach(sbx: Sandbox, address: str) -> str:
    run = sbx.commands.run(f"python3 -c {shlex.quote(CONNECT)} {address} {PEER_PORT}")
    return str(run.stdout).strip()


def test_its_tcp_leaves_through_its_own_proxy_alone(front: E2BDaemon, internet: Internet) -> None:
    with socket.create_connection((A4, PEER_PORT), timeout=5) as direct:  # the counter sees it
        assert direct.recv(100) == f"peer {HOST4}".encode()
    direct_seen = internet.direct_packets()
    assert direct_seen > 0
    tunneled = Sandbox.create(timeout=120, network={"egress_proxy": PROXY, "deny_out": [B4]})
    plain: Any = None
    try:
        before = len(internet.socks.connects())
        assert reach(tunneled, A4) == f"ok peer {SOCKS4}"  # not HOST4: not direct
        assert reach(tunneled, B4).startswith("refused")  # its deny_out first
        assert internet.socks.connects()[before:] == [f"{A4}:{PEER_PORT}"]
        assert internet.direct_packets() == direct_seen
        network = tunneled.get_info().network or {}
        assert network["egress_proxy"] == {"address": PROXY["address"], "username": USER}
        assert PASSWORD not in str(network)
        plain = Sandbox.create(timeout=120, network={"deny_out": [B4]})  # beside it: direct
        assert reach(plain, A4) == f"ok peer {HOST4}"
    finally:
        tunneled.kill()
        if plain is not None:
            plain.kill()


def test_a_wrong_password_fails_closed(front: E2BDaemon, internet: Internet) -> None:
    direct_seen, peers_seen = internet.direct_packets(), len(internet.peers.peers)
    sbx = Sandbox.create(timeout=120, network={"egress_proxy": {**PROXY, "password": "wrong"}})
    try:
        assert reach(sbx, A4).startswith("refused")
        assert internet.direct_packets() == direct_seen
        assert len(internet.peers.peers) == peers_seen
    finally:
        sbx.kill()


def test_what_cannot_be_honoured_is_refused_by_name(front: E2BDaemon) -> None:
    cases: list[tuple[SandboxEgressProxyOpts, str]] = [
        ({"address": "127.0.0.1:1080"}, r"127\.0\.0\.1 is inside 127\.0\.0\.0/8"),
        ({"address": "169.254.169.254:1080"}, r"inside 169\.254\.0\.0/16"),
        ({"address": "10.0.0.5:1080"}, r"inside 10\.0\.0\.0/8"),
        ({**PROXY, "tls": {"ca_cert": "x"}}, "tls.caCert: holds no PEM certificate"),
        ({"address": "proxy.example:1080"}, "a host name is not supported"),
    ]
    for proxy, named in cases:
        with pytest.raises(Exception, match=named):
            Sandbox.create(timeout=120, network={"egress_proxy": proxy})
