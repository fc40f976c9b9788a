"""The egress CA without a kernel: made once into the state root (its key root's alone) and
read again, its leaves accepted by a strict client for their name alone, kept per name up to
a bound and made anew past half their life."""

import contextlib
import os
import ssl
import stat
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from OpenSSL import SSL
from twisted.internet.task import Clock

from sandboxd.isolation.network.egress_ca import (
    CA_DIR,
    CERT_FILE,
    KEY_FILE,
    LEAF_SECONDS,
    EgressCA,
    load_or_make,
)


def handshake(ca: EgressCA, served: str, asked: str, trusted: bytes = b"") -> str:
    """A strict client (Python's default context, trusting the CA alone, or ``trusted``)
    against the leaf served for ``served``, asking for ``asked``: the protocol it chose, or
    ``ssl`` raises."""
    client = ssl.create_default_context(cadata=(trusted or ca.pem).decode())
    client.set_alpn_protocols(["h2", "http/1.1"])
    theirs, ours = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client.wrap_bio(ours, theirs, server_hostname=asked)
    server = SSL.Connection(ca.options_for(served).getContext(), None)
    server.set_accept_state()
    server.set_app_data(SimpleNamespace(factory=SimpleNamespace(wrappedFactory=None)))
    for _ in range(10):
        try:
            tls.do_handshake()
            return str(tls.selected_alpn_protocol())
        except ssl.SSLWantReadError:
            pass
        server.bio_write(theirs.read())
        with contextlib.suppress(SSL.WantReadError):
            server.do_handshake()
        ours.write(server.bio_read(65536))
    raise AssertionError("no handshake")  # pragma: no cover - a hung handshake


def test_the_ca_is_made_once_root_only_and_read_again(tmp_path: Path) -> None:
    clock = Clock()
    clock.advance(time.time())  # (a client checks leaves on its own clock)
    ca = EgressCA.of_root(str(tmp_path), clock)
    directory = tmp_path / CA_DIR
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / KEY_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE((directory / CERT_FILE).stat().st_mode) == 0o644
    assert b"PRIVATE" not in ca.pem and (directory / CERT_FILE).read_bytes() == ca.pem
    assert EgressCA.of_root(str(tmp_path), clock).pem == ca.pem
    (directory / CERT_FILE).unlink()  # (a start that stopped half-way): made anew
    assert EgressCA.of_root(str(tmp_path), clock).pem != ca.pem
    other = rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    (directory / KEY_FILE).write_bytes(other)
    with pytest.raises(ValueError, match="not the EC key"):
        load_or_make(str(tmp_path), 0.0)
    assert not [name for name in os.listdir(directory) if name.endswith(".new")]


def test_a_leaf_is_trusted_for_its_name_alone_and_offers_http_1_1(tmp_path: Path) -> None:
    clock = Clock()
    clock.advance(time.time())  # (a client checks leaves on its own clock)
    ca = EgressCA.of_root(str(tmp_path), clock)
    assert handshake(ca, "api.example.com", "api.example.com") == "http/1.1"
    with pytest.raises(ssl.SSLCertVerificationError, match="match"):
        handshake(ca, "api.example.com", "other.example.com")
    stranger = EgressCA.of_root(str(tmp_path / "elsewhere"), clock)
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        handshake(ca, "api.example.com", "api.example.com", trusted=stranger.pem)


def test_leaves_are_kept_per_name_up_to_a_bound_and_renewed(tmp_path: Path) -> None:
    clock = Clock()
    clock.advance(time.time())  # (a client checks leaves on its own clock)
    key, cert = load_or_make(str(tmp_path), clock.seconds())
    ca = EgressCA(key, cert, clock, leaves_max=2)
    first = ca.options_for("a.example")
    assert ca.options_for("a.example") is first
    ca.options_for("b.example")
    ca.options_for("a.example")  # (now the latest used: b goes first)
    ca.options_for("c.example")
    assert list(ca.leaves) == ["a.example", "c.example"]
    clock.advance(LEAF_SECONDS / 2)
    assert ca.options_for("a.example") is not first
    until = ca.leaf("a.example", clock.seconds()).not_valid_after_utc.timestamp()
    assert until == int(clock.seconds() + LEAF_SECONDS)
