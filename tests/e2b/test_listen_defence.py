"""The E2B front's listener holds like the native API's (docs/operating.rst, "Connections"): it is
claimed in both address families (a sandbox in host network mode cannot take the other one), only
once the predecessor's sandboxes are reclaimed, and its connections are under the same gate (a
header trickle is cut, a body without the key is refused at its headers and never stored). Each
protection is also turned off by name, and the attack then works."""

import json
import os
import socket
from pathlib import Path

import pytest

from tests.e2b.conftest import E2BDaemon, running_front
from tests.security.live_daemon import trickle_headers
from tests.security.test_self_defence import (
    ATTACK_BYTES,
    STORED_BOUND,
    answer_of,
    send_unfinished,
    stored_whole,
    tmpfs,
    used_bytes,
)

QUERY = b"GET /v2/sandboxes HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"


def answered(host: str, port: int) -> bool:
    """Whether an HTTP server answers on ``host``:``port``."""
    try:
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(QUERY)
            return s.recv(64).startswith(b"HTTP/1.1 ")
    except OSError:
        return False


def port_of(front: E2BDaemon) -> int:
    return int(front.url.rsplit(":", 1)[1])


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="this host has no IPv6 loopback")
@pytest.mark.parametrize("dual_stack", ["on", "off"])
def test_the_front_claims_both_loopbacks(tmp_path: Path, dual_stack: str) -> None:
    with running_front(tmp_path, "--isolation=none", f"--dual-stack={dual_stack}") as front:
        port = port_of(front)
        assert answered("127.0.0.1", port)
        if dual_stack == "on":
            assert answered("::1", port)
            with socket.socket(socket.AF_INET6) as squatter, pytest.raises(OSError):
                squatter.bind(("::1", port))
        else:  # as before: the other family's port is anybody's
            assert not answered("::1", port)
            with socket.socket(socket.AF_INET6) as squatter:
                squatter.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                squatter.bind(("::1", port))
        log = front.daemon.log.read_text()
        assert log.index("recovery done") < log.index("also listening on")


@pytest.mark.parametrize("timeout", ["2s", "off"])
def test_a_header_trickle_on_the_front_is_cut(tmp_path: Path, timeout: str) -> None:
    with running_front(tmp_path, "--isolation=none", f"--header-timeout={timeout}") as front:
        s, cut = trickle_headers(port_of(front), b"GET /v2/sandboxes HTTP/1.1", timeout == "off")
        s.close()
        assert cut is (timeout != "off")
        if cut:
            assert "header timeout: closed a connection" in front.daemon.log.read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs as the state root")
@pytest.mark.parametrize("gate", ["headers", "off"])
def test_a_keyless_body_on_the_front_is_never_stored(tmp_path: Path, gate: str) -> None:
    with (
        tmpfs(tmp_path / "root") as root,
        running_front(tmp_path, "--isolation=none", f"--auth-gate={gate}") as front,
    ):
        before = used_bytes(root)
        attack, sent = send_unfinished(
            port_of(front),
            b"POST /v2/sandboxes HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n",
        )
        stored = used_bytes(root) - before  # the body is unfinished: what was stored stays
        if gate == "off":
            stored_whole(attack, sent, stored)
            return
        answer = answer_of(attack)
        assert answer.startswith(b"HTTP/1.1 401 Unauthorized\r\n"), answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["code"] == 401
        assert stored < STORED_BOUND and sent < ATTACK_BYTES, (stored, sent)


UNKNOWN_SANDBOX = (
    b"POST /files?path=/home/user/x HTTP/1.1\r\nhost: x\r\ne2b-sandbox-id: nosuch\r\n"
    b"x-access-token: guessed\r\ntransfer-encoding: chunked\r\n\r\n"
)
FORGED_SIGNATURE = (
    b"POST /files?path=/home/user/x&username=user&signature=v1_forged HTTP/1.1\r\n"
    b"host: x\r\ntransfer-encoding: chunked\r\n\r\n"
)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs as the state root")
@pytest.mark.parametrize("gate", ["headers", "off"])
@pytest.mark.parametrize(
    ("head", "status", "message"),
    [
        (UNKNOWN_SANDBOX, b"502 Bad Gateway", "The sandbox nosuch was not found"),
        (FORGED_SIGNATURE, b"401 Unauthorized", "invalid signature"),
    ],
    ids=["unknown-sandbox", "forged-signature"],
)
def test_an_upload_to_no_sandbox_is_never_stored(
    tmp_path: Path, gate: str, head: bytes, status: bytes, message: str
) -> None:
    """An envd upload naming a sandbox the front does not hold, or signed by none, is answered
    at its headers as the route would answer it; with the gate off its body is stored first."""
    with (
        tmpfs(tmp_path / "root") as root,
        running_front(tmp_path, "--isolation=none", f"--auth-gate={gate}") as front,
    ):
        before = used_bytes(root)
        attack, sent = send_unfinished(port_of(front), head)
        stored = used_bytes(root) - before  # the body is unfinished: what was stored stays
        if gate == "off":
            stored_whole(attack, sent, stored)
            return
        answer = answer_of(attack)
        assert answer.startswith(b"HTTP/1.1 " + status + b"\r\n"), answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["message"] == message
        assert stored < STORED_BOUND and sent < ATTACK_BYTES, (stored, sent)
