"""Ports on the E2B front under real isolation (docs/e2b.rst, "Ports"): the unmodified SDK's
``get_host(port)`` names the host, the sandbox's ``traffic_access_token`` opens it."""

import base64
import http.client
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2b.conftest import E2BDaemon, point_sdk_at, running_front
from tests.ports.conftest import UPSTREAM

pytestmark = pytest.mark.kernel

DOMAIN = "ports.test"


@pytest.fixture
def front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[E2BDaemon]:
    if os.geteuid() != 0:
        pytest.skip("real isolation needs root")
    with running_front(tmp_path, f"--e2b-domain={DOMAIN}") as running:
        yield point_sdk_at(monkeypatch, running)


def serving(sandbox: Any) -> Any:
    """``sandbox`` with the server of :mod:`tests.ports.upstream` listening on 8000."""
    sandbox.files.write("/home/user/upstream.py", UPSTREAM.read_text())
    sandbox.commands.run("python3 /home/user/upstream.py 8000", background=True, cwd="/home/user")
    sandbox.commands.run(
        "python3 -c 'import socket,time\n"
        "for _ in range(300):\n"
        '  try: socket.create_connection(("127.0.0.1", 8000)); break\n'
        "  except OSError: time.sleep(0.1)'"
    )
    return sandbox


def get(
    front: E2BDaemon, host: str, path: str = "/headers", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    port = int(front.url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": host, **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def traffic(sandbox: Any) -> dict[str, str]:
    return {"e2b-traffic-access-token": sandbox.traffic_access_token}


def test_get_host_reaches_http_server_with_the_traffic_token(front: E2BDaemon) -> None:
    from e2b import Sandbox

    with Sandbox.create(timeout=120) as sandbox:
        serving(sandbox)
        host = sandbox.get_host(8000)
        assert host == f"8000-{sandbox.sandbox_id}.{DOMAIN}"
        sandbox.files.write("/home/user/hello.txt", "hello\n")
        assert get(front, host, "/hello.txt", traffic(sandbox)) == (200, b"hello\n")
        status, body = get(front, host, headers={**traffic(sandbox), "X-Access-Token": "t"})
        seen = json.loads(body)
        assert status == 200 and seen["host"] == host
        assert "e2b-traffic-access-token" not in seen and "x-access-token" not in seen
        status, body = get(front, host)
        assert status == 403 and b"e2b-traffic-access-token" in body
        assert get(front, sandbox.get_host(8001), "/", traffic(sandbox))[0] == 502


def test_another_sandboxs_token_and_a_spoofed_host_are_refused(front: E2BDaemon) -> None:
    from e2b import Sandbox

    with Sandbox.create(timeout=120) as victim, Sandbox.create(timeout=120) as attacker:
        serving(victim)
        serving(attacker)
        assert get(front, attacker.get_host(8000), headers=traffic(attacker))[0] == 200
        # the attacker's own token, the victim's host: refused
        assert get(front, victim.get_host(8000), headers=traffic(attacker))[0] == 403
        # the victim's envd access token is not its traffic token
        token = {"e2b-traffic-access-token": victim._envd_access_token or ""}
        assert get(front, victim.get_host(8000), headers=token)[0] == 403
        # a made-up sandbox, and two Host headers: never another sandbox's port
        assert get(front, f"8000-0123456789abcdef.{DOMAIN}", headers=traffic(attacker))[0] == 502
        port = int(front.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                f"GET /headers HTTP/1.1\r\nHost: {attacker.get_host(8000)}\r\n"
                f"Host: {victim.get_host(8000)}\r\n"
                f"e2b-traffic-access-token: {attacker.traffic_access_token}\r\n\r\n".encode()
            )
            answer = sock.recv(65536)
        assert not answer.startswith(b"HTTP/1.1 200"), answer


def test_a_public_sandbox_needs_no_token_and_websockets_pass(front: E2BDaemon) -> None:
    from e2b import Sandbox

    with Sandbox.create(timeout=120, network={"allow_public_traffic": True}) as sandbox:
        serving(sandbox)
        assert get(front, sandbox.get_host(8000))[0] == 200
        port = int(front.url.rsplit(":", 1)[1])
        key = base64.b64encode(os.urandom(16)).decode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                f"GET /ws HTTP/1.1\r\nHost: {sandbox.get_host(8000)}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n".encode()
            )
            head = sock.recv(4096)
            assert b" 101 " in head.split(b"\r\n")[0], head
            mask = os.urandom(4)
            sock.sendall(
                bytes([0x81, 0x82]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(b"hi"))
            )
            assert sock.recv(4) == b"\x81\x02hi"
