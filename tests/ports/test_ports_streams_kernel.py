"""Ports' long connections under real isolation: WebSocket tunnels, the per-sandbox cap, a
killed sandbox, and a huge answer to a slow client (docs/extensions.rst, "Ports")."""

import base64
import contextlib
import os
import socket
import time

import pytest

from tests.ports.conftest import Live

pytestmark = pytest.mark.kernel


def upgrade(live: Live, rid: str, token: bool = True) -> tuple[socket.socket, bytes]:
    """A connection upgraded to a WebSocket to ``/ws`` of port 8000 in ``rid``, and the head
    of the answer."""
    sock = socket.create_connection(("127.0.0.1", live.daemon.port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    auth = f"Authorization: Bearer {live.token}\r\n" if token else ""
    sock.sendall(
        f"GET /sandboxes/{rid}/ports/8000/ws HTTP/1.1\r\nHost: x\r\n{auth}"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        more = sock.recv(4096)
        if not more:
            break
        head += more
    return sock, head


def echo(sock: socket.socket, text: bytes) -> bytes:
    """Send ``text`` in one masked frame; the payload of the frame that comes back."""
    mask = os.urandom(4)
    sock.sendall(bytes([0x81, 0x80 | len(text)]) + mask + bytes(
        b ^ mask[i % 4] for i, b in enumerate(text)
    ))  # fmt: skip
    head = sock.recv(2)
    return sock.recv(head[1] & 0x7F)


def test_a_websocket_echo_server_inside_is_reached(live: Live) -> None:
    rid = live.sandbox_with_server()
    sock, head = upgrade(live, rid)
    with sock:
        assert head.startswith(b"HTTP/1.0 101") or head.startswith(b"HTTP/1.1 101"), head
        assert echo(sock, b"hello") == b"hello"
        assert echo(sock, b"again") == b"again"


def test_a_websocket_needs_the_token(live: Live) -> None:
    rid = live.sandbox_with_server()
    sock, head = upgrade(live, rid, token=False)
    with sock:
        assert head.startswith(b"HTTP/1.1 401"), head


def test_proxied_connections_are_capped_per_sandbox(live: Live) -> None:
    """The fixture's daemon allows 3 per sandbox: a 4th is refused, another sandbox's are
    counted apart, and a closed one frees its place."""
    rid = live.sandbox_with_server()
    other = live.sandbox_with_server()
    held = [upgrade(live, rid)[0] for _ in range(3)]
    try:
        assert all(echo(sock, b"x") == b"x" for sock in held)
        status, _, body = live.get(f"/sandboxes/{rid}/ports/8000/headers")
        assert status == 429 and b"SANDBOXD_PORT_CONNECTIONS_MAX=3" in body
        assert live.get(f"/sandboxes/{other}/ports/8000/headers")[0] == 200
        held.pop().close()
        deadline = time.monotonic() + 10
        while live.get(f"/sandboxes/{rid}/ports/8000/headers")[0] != 200:
            assert time.monotonic() < deadline, "the closed tunnel's place was never freed"
            time.sleep(0.05)
    finally:
        for sock in held:
            sock.close()


def test_a_killed_sandbox_closes_its_tunnels(live: Live) -> None:
    rid = live.sandbox_with_server()
    sock, _ = upgrade(live, rid)
    with sock:
        assert echo(sock, b"before") == b"before"
        assert live.api("DELETE", f"/sandboxes/{rid}").status == 204
        sock.settimeout(10)
        with contextlib.suppress(ConnectionResetError):  # closed, or reset: either way, gone
            assert sock.recv(100) == b""


def test_a_huge_answer_to_a_slow_client_leaves_the_daemon_flat(live: Live) -> None:
    """256 MiB offered by the sandbox while the client reads nothing for 3 s: the daemon
    holds at most socket buffers of it (flow control), and the client then gets it whole."""
    rid = live.sandbox_with_server()
    size = 256 << 20
    before = live.daemon.rss_kib()
    sock = socket.create_connection(("127.0.0.1", live.daemon.port), timeout=30)
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(
            f"GET /sandboxes/{rid}/ports/8000/big?n={size} HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {live.token}\r\n\r\n".encode()
        )
        time.sleep(3)
        grown = live.daemon.rss_kib() - before
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(65536)
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"content-length: %d" % size in head.lower()
        count = len(body)
        while count < size:
            data = sock.recv(1 << 20)
            assert data, f"the answer stopped after {count} bytes"
            count += len(data)
    assert grown < 48 * 1024, f"the daemon grew by {grown} KiB holding a slow client's answer"
    assert count == size


def raw(live: Live, request: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", live.daemon.port), timeout=10)
    sock.sendall(request)
    return sock


def read_all(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while more := sock.recv(65536):
            data += more
    return data


def test_bodies_chunked_and_cut_answers_pass_as_they_came(live: Live) -> None:
    rid = live.sandbox_with_server()
    posted = live.api("POST", f"/sandboxes/{rid}/ports/8000/headers", raw=b"a body")
    assert posted.status == 501  # http.server serves no POST: its answer comes back
    status, headers, body = live.get(f"/sandboxes/{rid}/ports/8000/chunked")
    assert (status, body) == (200, b"one two") and "Content-Length" not in headers
    auth = f"Authorization: Bearer {live.token}\r\n".encode()
    with raw(live, b"GET /sandboxes/%s/ports/8000/cut HTTP/1.1\r\nHost: x\r\n%s\r\n" % (
        rid.encode(), auth
    )) as sock:  # fmt: skip
        answer = read_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-length: 1000" in head.lower() and body == b"only ten b"


def test_a_client_gone_mid_answer_frees_its_place(live: Live) -> None:
    rid = live.sandbox_with_server()
    auth = f"Authorization: Bearer {live.token}\r\n".encode()
    for _ in range(4):  # one more than the cap
        sock = raw(live, b"GET /sandboxes/%s/ports/8000/big?n=%d HTTP/1.1\r\nHost: x\r\n%s\r\n" % (
            rid.encode(), 1 << 30, auth
        ))  # fmt: skip
        assert sock.recv(12) == b"HTTP/1.1 200"
        sock.close()
        time.sleep(0.2)
    deadline = time.monotonic() + 10
    while live.get(f"/sandboxes/{rid}/ports/8000/headers")[0] != 200:
        assert time.monotonic() < deadline, "the clients' places were never freed"
        time.sleep(0.05)


def test_upgrades_with_a_body_or_to_a_closed_port_are_refused(live: Live) -> None:
    rid = live.sandbox_with_server()
    auth = f"Authorization: Bearer {live.token}\r\n".encode()
    upgrade = b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
    with raw(live, b"GET /sandboxes/%s/ports/8000/ws HTTP/1.1\r\nHost: x\r\n%s%s"
             b"Content-Length: 2\r\n\r\nhi" % (rid.encode(), auth, upgrade)) as sock:  # fmt: skip
        assert sock.recv(12) == b"HTTP/1.1 400"
    with raw(live, b"GET /sandboxes/%s/ports/8001/ws HTTP/1.1\r\nHost: x\r\n%s%s\r\n" % (
        rid.encode(), auth, upgrade
    )) as sock:  # fmt: skip
        assert sock.recv(12) == b"HTTP/1.1 502"


def test_bytes_sent_with_the_upgrade_request_are_passed_on(live: Live) -> None:
    rid = live.sandbox_with_server()
    key = base64.b64encode(os.urandom(16))
    mask = os.urandom(4)
    frame = bytes([0x81, 0x83]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(b"one"))
    with raw(live, b"GET /sandboxes/%s/ports/8000/ws HTTP/1.1\r\nHost: x\r\n"
             b"Authorization: Bearer %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n%s" % (
                 rid.encode(), live.token.encode(), key, frame)) as sock:  # fmt: skip
        answer = b""
        while not answer.endswith(b"\x81\x03one"):
            more = sock.recv(4096)
            assert more, answer
            answer += more
        assert b" 101 " in answer.split(b"\r\n")[0]


def test_a_flooding_tunnel_to_a_slow_client_leaves_the_daemon_flat(live: Live) -> None:
    """256 MiB sent through a WebSocket tunnel while the client reads nothing for 3 s: each
    side of the tunnel pauses the other (flow control), and the client then gets it all."""
    rid = live.sandbox_with_server()
    size = 256 << 20
    before = live.daemon.rss_kib()
    key = base64.b64encode(os.urandom(16))
    sock = socket.create_connection(("127.0.0.1", live.daemon.port), timeout=30)
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(
            b"GET /sandboxes/%s/ports/8000/flood?n=%d HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
            % (rid.encode(), size, live.token.encode(), key)
        )
        time.sleep(3)
        grown = live.daemon.rss_kib() - before
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(65536)
        head, _, body = received.partition(b"\r\n\r\n")
        assert b" 101 " in head.split(b"\r\n")[0], head
        count = len(body)
        while count < size:
            data = sock.recv(1 << 20)
            assert data, f"the tunnel stopped after {count} bytes"
            count += len(data)
    assert grown < 48 * 1024, f"the daemon grew by {grown} KiB holding a slow client's bytes"
    assert count == size
