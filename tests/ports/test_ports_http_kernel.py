"""Ports through the native front under real isolation (docs/extensions.rst, "Ports"): a
server inside a sandbox's own network namespace, reached only through the daemon."""

import json
import threading
from http.server import HTTPServer, SimpleHTTPRequestHandler

import pytest

from tests.ports.conftest import Live

pytestmark = pytest.mark.kernel


def test_a_file_is_fetched_from_http_server_inside_the_sandbox(live: Live) -> None:
    capabilities = live.api("GET", "/healthz").json()["capabilities"]
    assert {"isolation.net", "ports"} <= set(capabilities)
    rid = live.sandbox_with_server()
    assert live.api("PUT", f"/sandboxes/{rid}/file?path=hello.txt", raw=b"hello\n").status == 204
    status, headers, body = live.get(f"/sandboxes/{rid}/ports/8000/hello.txt")
    assert (status, body) == (200, b"hello\n")
    assert headers["Content-Length"] == "6"
    status, _, listing = live.get(f"/sandboxes/{rid}/ports/8000/")
    assert status == 200 and b"hello.txt" in listing


def test_the_daemons_token_never_reaches_the_sandbox(live: Live) -> None:
    rid = live.sandbox_with_server()
    seen = live.json_of(f"/sandboxes/{rid}/ports/8000/headers")
    assert "authorization" not in seen
    assert live.token not in json.dumps(seen)


def test_hop_by_hop_headers_are_not_passed_on(live: Live) -> None:
    rid = live.sandbox_with_server()
    status, _, body = live.get(
        f"/sandboxes/{rid}/ports/8000/headers",
        headers={"Connection": "keep-alive, X-Secret", "X-Secret": "s", "X-Kept": "k"},
    )
    seen = json.loads(body)
    assert status == 200 and seen["x-kept"] == "k"
    assert "x-secret" not in seen and seen.get("connection", "close") == "close"


def test_without_the_token_a_port_is_refused_until_made_public(live: Live) -> None:
    rid = live.sandbox_with_server()
    path = f"/sandboxes/{rid}/ports/8000/headers"
    assert live.get(path, token=False)[0] == 401
    made = live.api("POST", f"/sandboxes/{rid}/ports/8000", {"public": True})
    assert made.status == 200, made
    assert made.json()["public"] is True
    assert made.json()["url"].endswith(f"/sandboxes/{rid}/ports/8000/")
    status, _, body = live.get(path, token=False, headers={"Authorization": "Basic dTpw"})
    assert status == 200 and json.loads(body)["authorization"] == "Basic dTpw"
    assert live.get(f"/sandboxes/{rid}/ports/8001/", token=False)[0] == 401  # that port only
    assert live.api("POST", f"/sandboxes/{rid}/ports/8000", {"public": False}).json() == {
        "url": made.json()["url"],
        "public": False,
    }
    assert live.get(path, token=False)[0] == 401


def test_a_port_with_nothing_listening_is_a_502(live: Live) -> None:
    rid = live.sandbox_with_server()
    status, _, body = live.get(f"/sandboxes/{rid}/ports/8001/")
    assert status == 502
    assert json.loads(body) == {
        "error": "PortClosed",
        "detail": "nothing listens on port 8001 inside the sandbox",
    }


def test_another_sandboxs_server_is_out_of_reach(live: Live) -> None:
    """The proxy connects inside the named sandbox's namespace only: the same port of another
    sandbox (where nothing listens) is a 502, though the first one's server listens on it."""
    live.sandbox_with_server()
    other = live.api("POST", "/sandboxes", {}).json()["remote_id"]
    assert live.get(f"/sandboxes/{other}/ports/8000/headers")[0] == 502
    assert live.get("/sandboxes/0123456789abcdef/ports/8000/headers")[0] == 404


def test_a_server_on_the_hosts_loopback_is_out_of_reach(live: Live) -> None:
    """A port the host listens on (127.0.0.1, in the daemon's own namespace) is not reached:
    the proxy connects inside the sandbox's namespace, where nothing listens on it."""
    host_server = HTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    serving = threading.Thread(target=host_server.serve_forever, daemon=True)
    serving.start()
    try:
        rid = live.api("POST", "/sandboxes", {}).json()["remote_id"]
        port = host_server.server_address[1]
        status, _, body = live.get(f"/sandboxes/{rid}/ports/{port}/")
        assert status == 502, body
    finally:
        host_server.shutdown()
        host_server.server_close()


def test_a_request_with_both_length_and_chunking_is_refused(live: Live) -> None:
    rid = live.sandbox_with_server()
    conn = live.connection()
    conn.putrequest("POST", f"/sandboxes/{rid}/ports/8000/headers")
    conn.putheader("Authorization", f"Bearer {live.token}")
    conn.putheader("Content-Length", "5")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders(b"0\r\n\r\nGET /headers HTTP/1.1\r\nHost: x\r\n\r\n")
    assert conn.getresponse().status == 400
    conn.close()
