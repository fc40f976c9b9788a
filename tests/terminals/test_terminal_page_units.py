"""The terminal page's pieces without a browser (docs/extensions.rst, "The terminal page"):
the page assembled from its vendored files or the 503 naming them, the paths served without
the token, and the bearer token a terminal socket's subprotocol carries, taken there only."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from twisted.web.http_headers import Headers

from sandboxd.http.auth import BearerAuthoriser
from sandboxd.http.socket_bearer import BEARER_PREFIX, socket_authorization
from sandboxd.terminal_page import HERE, VENDORED, TerminalPage, is_page_path
from sandboxd.web.guard import Admission

TOKEN = b"t0k+/en="
SOCKET = b"/sandboxes/abc/terminals/def"


def subprotocols(*offered: bytes, upgrade: bytes = b"websocket") -> Headers:
    return Headers({b"upgrade": [upgrade], b"sec-websocket-protocol": list(offered)})


def bearer(token: bytes) -> bytes:
    return BEARER_PREFIX + base64.urlsafe_b64encode(token).rstrip(b"=")


def test_a_terminal_socket_takes_the_token_from_its_subprotocol() -> None:
    offered = subprotocols(b"sandboxd.terminal, " + bearer(TOKEN))
    assert socket_authorization(SOCKET, offered) == b"Bearer " + TOKEN
    assert socket_authorization(SOCKET + b"?offset=0", offered) == b"Bearer " + TOKEN
    # In a header of its own, and with the upgrade in capitals
    offered = subprotocols(b"sandboxd.terminal", bearer(TOKEN), upgrade=b"WebSocket")
    assert socket_authorization(SOCKET, offered) == b"Bearer " + TOKEN


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        # a proxied port's handshake goes to the sandbox's server as it is: never taken there
        (b"/sandboxes/abc/ports/8000/ws", subprotocols(bearer(TOKEN))),
        (b"/sandboxes/abc/terminals", subprotocols(bearer(TOKEN))),
        (b"/sandboxes/abc/terminals/def/resize", subprotocols(bearer(TOKEN))),
        (SOCKET, subprotocols(bearer(TOKEN), upgrade=b"h2c")),
        (SOCKET, Headers({b"sec-websocket-protocol": [bearer(TOKEN)]})),
        (SOCKET, subprotocols(b"sandboxd.terminal")),
        (SOCKET, Headers({b"upgrade": [b"websocket"]})),
        (SOCKET, subprotocols(BEARER_PREFIX + b"not base64!")),
    ],
)
def test_nothing_else_carries_the_token(path: bytes, headers: Headers) -> None:
    assert socket_authorization(path, headers) is None


def test_the_authoriser_trusts_a_socket_with_the_token_and_opens_only_the_page() -> None:
    authoriser = BearerAuthoriser(TOKEN)
    assert authoriser.admit(SOCKET, None, subprotocols(bearer(TOKEN))) is Admission.TRUSTED
    assert authoriser.admit(SOCKET, None, subprotocols(bearer(b"wrong"))) is Admission.REFUSED
    assert authoriser.admit(SOCKET, None, None) is Admission.REFUSED
    ports = b"/sandboxes/abc/ports/8000/"
    assert authoriser.admit(ports, None, subprotocols(bearer(TOKEN))) is Admission.REFUSED
    assert authoriser.admit(b"/sandboxes/abc/terminal", None) is Admission.OPEN
    assert authoriser.admit(b"/sandboxes/abc/terminal?x=1", None) is Admission.OPEN
    assert authoriser.admit(b"/sandboxes/abc/terminals", None) is Admission.REFUSED


@pytest.mark.parametrize(
    ("path", "page"),
    [
        (b"/sandboxes/abc/terminal", True),
        (b"/sandboxes/abc/terminals", False),
        (b"/sandboxes/abc/terminal/x", False),
        (b"/sandboxes//terminal", False),
        (b"/x/sandboxes/abc/terminal", False),
    ],
)
def test_the_page_path(path: bytes, page: bool) -> None:
    assert is_page_path(path) is page


def test_without_its_files_the_page_is_a_503_naming_them_and_the_command(tmp_path: Path) -> None:
    page = TerminalPage(vendor=tmp_path / "vendor")
    answer = page.answer()
    assert answer.status == 503 and answer.content_type.startswith(b"text/plain")
    text = answer.body.decode()
    assert f"npm ci --prefix {HERE}" in text
    assert all(name in text for name in VENDORED)
    # One file short is still missing
    (tmp_path / "vendor").mkdir()
    for name in VENDORED[1:]:
        (tmp_path / "vendor" / name).write_text(name)
    assert page.missing() == [VENDORED[0]]
    assert page.answer().status == 503


def test_the_page_inlines_its_files_under_a_fresh_nonce(tmp_path: Path) -> None:
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    for name in VENDORED:
        (vendor / name).write_text(f"/* the {name} */")
    page = TerminalPage(vendor=vendor)
    first, second = page.answer(), page.answer()
    assert first.status == 200 and first.content_type.startswith(b"text/html")
    for name in ("xterm.css", "xterm.js", "addon-fit.js"):
        assert f"/* the {name} */".encode() in first.body
    assert (HERE / "terminal.js").read_bytes() in first.body
    assert b"{{" not in first.body
    policy = first.headers[b"content-security-policy"].decode()
    nonce = policy.split("'nonce-", 1)[1].split("'", 1)[0]
    assert first.body.count(f'<script nonce="{nonce}">'.encode()) == 3
    assert nonce not in second.headers[b"content-security-policy"].decode()
    assert first.headers[b"cache-control"] == b"no-store"
    # Read once: the files may go (a new npm ci), the page stays whole
    for name in VENDORED:
        (vendor / name).unlink()
    assert page.answer().status == 200
