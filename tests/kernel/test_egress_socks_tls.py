"""TLS to a sandbox's own SOCKS5 proxy, as the unmodified E2B SDK asks for it
(``egress_proxy={"address": ..., "tls": {"ca_cert": PEM, "server_name": ...}}``), on a real
daemon as root: a real ``pproxy`` serving SOCKS5 over TLS in the test's own "internet", its
certificate signed by a CA the test makes (docs/isolation.rst, "A sandbox's own SOCKS5
proxy").

With the right CA the sandbox's TCP leaves through the proxy (the peer sees the proxy's
address), whether the certificate is verified for ``server_name`` or for the address (its IP
SAN); the listing shows ``server_name``, never the CA. With another CA's certificate it fails
closed: refused, nothing sent directly, the peer never reached.
"""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from attrs import define
from e2b import Sandbox
from e2b.sandbox.sandbox_api import SandboxEgressProxyOpts, SandboxEgressProxyTLSOpts

from tests.e2b.conftest import E2BDaemon, point_sdk_at, running_front
from tests.isolation.test_isolation_egress_socks_tls import (
    SERVER_NAME,
    Authority,
    certificate,
    leaf_pem,
    pem,
    proxy_leaf,
)
from tests.kernel.netns_helpers import EGRESS_MARKS
from tests.kernel.test_egress_socks import (
    A4,
    B4,
    PASSWORD,
    SOCKS4,
    SOCKS_PORT,
    USER,
    Socks,
)
from tests.kernel.test_egress_socks_own import Internet, internet_of, reach

pytestmark = EGRESS_MARKS


def make_leaf(ca: Authority, work: Path) -> str:
    """The proxy's certificate (for ``SERVER_NAME`` and ``SOCKS4``) with its key, as
    pproxy's ``--ssl`` takes it."""
    path = work / "proxy.pem"
    path.write_bytes(leaf_pem(proxy_leaf(ca, SOCKS4)))
    return str(path)


@define
class TLSSocks(Socks):
    """``pproxy`` serving SOCKS5 over TLS with the certificate ``ssl`` names."""

    ssl: str = ""

    def start(self, password: str = PASSWORD) -> None:
        uri = f"socks5+ssl://{SOCKS4}:{SOCKS_PORT}/@in#{USER}:{password}"
        command = [sys.executable, "-m", "pproxy", "-l", uri, "--ssl", self.ssl, "-v"]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                ["nsenter", f"--net={self.netns}", *command],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.wait_listening()


@define
class TLSInternet(Internet):
    ca: str


@pytest.fixture(scope="module")
def internet() -> Iterator[TLSInternet]:
    """The "internet": the peer server on A4 and B4, the SOCKS5 server over TLS."""
    ca = certificate("sandboxd test proxy CA", None, [])

    def make_socks(inet: str, work: Path) -> Socks:
        return TLSSocks(inet, work / "pproxy.log", ssl=make_leaf(ca, work))

    with internet_of("egress-socks-tls-", make_socks) as (inet, socks, peers):
        yield TLSInternet(inet, socks, peers, pem(ca[1]))


@pytest.fixture
def front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[E2BDaemon]:
    base = 494000 + os.getpid() % 1000 * 20
    args = ("--network-allow=egress", f"--uid-min={base}", f"--uid-max={base + 3}")
    with running_front(tmp_path, *args) as started:
        yield point_sdk_at(monkeypatch, started)


def proxy(tls: SandboxEgressProxyTLSOpts) -> SandboxEgressProxyOpts:
    return {"address": f"{SOCKS4}:{SOCKS_PORT}", "username": USER, "password": PASSWORD, "tls": tls}


def test_its_tcp_leaves_through_its_proxy_over_tls(front: E2BDaemon, internet: TLSInternet) -> None:
    direct_seen = internet.direct_packets()
    named: SandboxEgressProxyTLSOpts = {"ca_cert": internet.ca, "server_name": SERVER_NAME}
    sbx = Sandbox.create(timeout=120, network={"egress_proxy": proxy(named)})
    by_address = Sandbox.create(
        timeout=120, network={"egress_proxy": proxy({"ca_cert": internet.ca})}
    )
    try:
        assert reach(sbx, A4) == f"ok peer {SOCKS4}"
        assert reach(by_address, A4) == f"ok peer {SOCKS4}"  # verified for its IP SAN
        assert internet.direct_packets() == direct_seen
        network = sbx.get_info().network or {}
        assert network["egress_proxy"] == {
            "address": f"{SOCKS4}:{SOCKS_PORT}",
            "username": USER,
            "tls": {"server_name": SERVER_NAME},
        }
        assert "BEGIN CERTIFICATE" not in str(network) and PASSWORD not in str(network)
    finally:
        sbx.kill()
        by_address.kill()


def test_another_ca_fails_closed(front: E2BDaemon, internet: TLSInternet) -> None:
    direct_seen, peers_seen = internet.direct_packets(), len(internet.peers.peers)
    other = pem(certificate("someone else's CA", None, [])[1])
    sbx = Sandbox.create(timeout=120, network={"egress_proxy": proxy({"ca_cert": other})})
    try:
        assert reach(sbx, A4).startswith("refused")
        assert reach(sbx, B4).startswith("refused")
        assert internet.direct_packets() == direct_seen
        assert len(internet.peers.peers) == peers_seen
    finally:
        sbx.kill()
