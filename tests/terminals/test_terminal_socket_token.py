"""The bearer token in a WebSocket subprotocol (docs/extensions.rst, "The terminal page"),
against a real daemon: a terminal's socket takes it (and answers ``sandboxd.terminal``, never
the token); a proxied port's handshake does not (it would go on to the sandbox's server with
the token in it), nor does any other route; a wrong one is refused; the token reaches no log.
The page itself is served without the token and holds none.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from sandboxd.terminal_page import TerminalPage
from tests.client.real_daemon import Daemon, running_daemon
from tests.support.ws_client import TEXT, HandshakeRefused, WebSocket

TOKEN = "socket-token+/="


def offered(token: str) -> dict[str, str]:
    encoded = base64.urlsafe_b64encode(token.encode()).rstrip(b"=").decode()
    return {"Sec-WebSocket-Protocol": f"sandboxd.terminal, sandboxd.bearer.{encoded}"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("daemon"), TOKEN) as running:
        yield running


def call(daemon: Daemon, method: str, path: str, body: object = None) -> dict[str, Any]:
    request = urllib.request.Request(
        daemon.url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.load(response))


def port_of(daemon: Daemon) -> int:
    return int(daemon.url.rsplit(":", 1)[1])


def test_a_terminal_socket_takes_the_token_from_its_subprotocol(daemon: Daemon) -> None:
    rid = call(daemon, "POST", "/sandboxes", {})["remote_id"]
    terminal = call(daemon, "POST", f"/sandboxes/{rid}/terminals", {"cmd": ["sh"]})["id"]
    ws = WebSocket(port_of(daemon), f"/sandboxes/{rid}/terminals/{terminal}", offered(TOKEN))
    try:
        ws.send(b"echo sub-$((40+2))\n")
        ws.read_until(b"sub-42")
        ws.send(b"exit 2\n")
        opcode, payload = ws.receive()
        while opcode != TEXT:
            opcode, payload = ws.receive()
        assert json.loads(payload) == {"exit": 2}
    finally:
        ws.close()
    with pytest.raises(HandshakeRefused) as refused:
        WebSocket(port_of(daemon), f"/sandboxes/{rid}/terminals/{terminal}", offered("wrong"))
    assert " 401 " in str(refused.value).splitlines()[0]


def test_the_answered_subprotocol_is_never_the_token(daemon: Daemon) -> None:
    rid = call(daemon, "POST", "/sandboxes", {})["remote_id"]
    terminal = call(daemon, "POST", f"/sandboxes/{rid}/terminals", {"cmd": ["sh"]})["id"]
    ws = WebSocket(port_of(daemon), f"/sandboxes/{rid}/terminals/{terminal}", offered(TOKEN))
    try:
        ws.send(b"exit\n")
    finally:
        ws.close()
    # ws_client keeps no headers: ask again and read the answer's head ourselves
    import socket

    with socket.create_connection(("127.0.0.1", port_of(daemon)), timeout=30) as sock:
        headers = "".join(f"{k}: {v}\r\n" for k, v in offered(TOKEN).items())
        sock.sendall(
            (
                f"GET /sandboxes/{rid}/terminals/{terminal} HTTP/1.1\r\nHost: x\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                f"{headers}\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
    head = head.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 101")
    assert b"sec-websocket-protocol: sandboxd.terminal\r\n" in head + b"\r\n"
    assert b"bearer" not in head


@pytest.mark.parametrize(
    "route",
    [
        "ports/8000/",  # a proxied port's handshake: it would carry the token to the sandbox
        "terminals",
        "processes",
    ],
)
def test_no_other_route_takes_the_subprotocol(daemon: Daemon, route: str) -> None:
    rid = call(daemon, "POST", "/sandboxes", {})["remote_id"]
    with pytest.raises(HandshakeRefused) as refused:
        WebSocket(port_of(daemon), f"/sandboxes/{rid}/{route}", offered(TOKEN))
    assert " 401 " in str(refused.value).splitlines()[0], str(refused.value)[:300]


def test_the_token_reaches_no_log(daemon: Daemon) -> None:
    rid = call(daemon, "POST", "/sandboxes", {})["remote_id"]
    terminal = call(daemon, "POST", f"/sandboxes/{rid}/terminals", {"cmd": ["sh"]})["id"]
    WebSocket(port_of(daemon), f"/sandboxes/{rid}/terminals/{terminal}", offered(TOKEN)).close()
    with pytest.raises(HandshakeRefused):
        WebSocket(port_of(daemon), f"/sandboxes/{rid}/ports/8000/", offered(TOKEN))
    encoded = base64.urlsafe_b64encode(TOKEN.encode()).rstrip(b"=").decode()
    text = daemon.log.read_text()
    assert rid in text  # the log is the daemon's, written meanwhile
    assert TOKEN not in text and encoded not in text


@pytest.mark.skipif(
    bool(TerminalPage().missing()),
    reason="the page is not built: npm ci --prefix sandboxd/terminal_page",
)
def test_the_page_is_served_without_the_token_and_holds_no_secret(daemon: Daemon) -> None:
    page = f"{daemon.url}/sandboxes/anything/terminal"
    with urllib.request.urlopen(page, timeout=30) as response:
        body = response.read()
        policy = response.headers["content-security-policy"]
    assert b"xterm" in body and TOKEN.encode() not in body
    assert "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
    # Its neighbours still want the token.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(page + "s", timeout=30)
    assert refused.value.code == 401
