"""A sandbox's own SOCKS5 proxy through the client, on a real ``twistd sandboxd`` as root
with its egress layer (docs/isolation.rst, "A sandbox's own SOCKS5 proxy"): created with
``SandboxSpec.socks5``, the sandbox lists its proxy back (address and user name, never the
password) in ``list_sandboxes`` and ``network``; ``set_network`` replaces it and, without one,
stops the tunneling; a ``Socks5TLS`` server name and CA reach the host, which lists the name
and never the CA. The tunnel itself (a real SOCKS5 server, nothing leaving directly) is
``tests/kernel/test_egress_socks_own.py``'s; nothing here connects to the proxy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted

from sandboxd_client import HttpSandbox, NetworkInfo, SandboxSpec, Socks5, Socks5TLS, decode_handle
from tests.isolation.test_isolation_egress_socks_tls import certificate, pem
from tests.kernel.netns_helpers import EGRESS_MARKS
from tests.support.daemon import Daemon, start_daemon, stop_daemon
from tests.support.uids import uid_block

pytestmark = EGRESS_MARKS

PASSWORD = "pw33-" + str(os.getpid())
PROXY = Socks5("203.0.113.80:1080", "me", PASSWORD)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    low, high = uid_block()
    started = start_daemon(
        tmp_path, f"--uid-min={low}", f"--uid-max={high}", "--network-allow=egress"
    )
    try:
        yield started
    finally:
        stop_daemon(started)


@pytest.fixture
def client(daemon: Daemon) -> Iterator[HttpSandbox]:
    from twisted.internet import reactor

    c = HttpSandbox(daemon.url, reactor=reactor)
    yield c
    pytest_twisted.blockon(c.close())


@pytest_twisted.ensureDeferred
async def test_a_proxy_given_at_create_is_listed_without_its_password(
    client: HttpSandbox, daemon: Daemon
) -> None:
    handle = await client.create(SandboxSpec(deny_out=["192.0.2.0/24"], socks5=PROXY))
    shown = NetworkInfo("egress", None, ("192.0.2.0/24",), socks5=Socks5("203.0.113.80:1080", "me"))
    assert await client.network(handle) == shown
    rid = decode_handle(handle).remote_id
    (listed,) = [s for s in await client.list_sandboxes() if s.remote_id == rid]
    assert listed.network == shown
    raw = daemon.call("GET", "/sandboxes")[1] + daemon.call("GET", f"/sandboxes/{rid}/network")[1]
    assert PASSWORD.encode() not in raw and b"203.0.113.80:1080" in raw
    other = Socks5("203.0.113.81:1081", "you", PASSWORD, tls=True)
    changed = await client.set_network(handle, socks5=other)
    assert changed.socks5 == Socks5("203.0.113.81:1081", "you", tls=True)
    assert (await client.set_network(handle)).socks5 is None  # no proxy: no tunneling
    assert (await client.network(handle)).socks5 is None
    denied = r"SOCKS5 proxy's address 127\.0\.0\.1 is inside"  # the operator denies it
    with pytest.raises(ValueError, match=denied) as caught:
        await client.set_network(handle, socks5=Socks5("127.0.0.1:1080", "me", PASSWORD))
    assert PASSWORD not in str(caught.value)
    await client.kill(handle)


def ca_pem() -> str:
    """A CA certificate of the test's own, as PEM (the host only parses it here)."""
    return pem(certificate("sandboxd test proxy CA", None, [])[1])


@pytest_twisted.ensureDeferred
async def test_a_proxys_tls_server_name_and_ca_reach_the_host_which_lists_the_name_alone(
    client: HttpSandbox, daemon: Daemon
) -> None:
    ca = ca_pem()
    body = ca.splitlines()[1]  # a line of the CA's base64, to look for in what is shown
    tls = Socks5TLS("Proxy.Example", ca)
    handle = await client.create(
        SandboxSpec(socks5=Socks5("203.0.113.80:1080", "me", PASSWORD, tls))
    )
    shown = Socks5("203.0.113.80:1080", "me", tls=Socks5TLS("proxy.example"))  # its normal form
    assert (await client.network(handle)).socks5 == shown
    rid = decode_handle(handle).remote_id
    (listed,) = [s for s in await client.list_sandboxes() if s.remote_id == rid]
    assert listed.network is not None and listed.network.socks5 == shown
    raw = daemon.call("GET", "/sandboxes")[1] + daemon.call("GET", f"/sandboxes/{rid}/network")[1]
    wire = json.loads(daemon.call("GET", f"/sandboxes/{rid}/network")[1])["socks5"]
    assert wire["tls"] == {"enabled": True, "server_name": "proxy.example"}
    assert PASSWORD.encode() not in raw and body.encode() not in raw
    only_ca = await client.set_network(
        handle, socks5=Socks5("203.0.113.81:1081", tls=Socks5TLS(ca_cert=ca))
    )
    assert only_ca.socks5 == Socks5("203.0.113.81:1081", tls=True)  # on, the CA never shown
    bad = Socks5TLS(ca_cert="-----BEGIN CERTIFICATE-----\nnot-base64\n-----END CERTIFICATE-----\n")
    with pytest.raises(ValueError, match="ca_cert") as caught:
        await client.set_network(handle, socks5=Socks5("203.0.113.81:1081", "me", PASSWORD, bad))
    assert PASSWORD not in str(caught.value)
    await client.kill(handle)
