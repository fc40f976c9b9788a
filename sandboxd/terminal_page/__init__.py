"""The terminal page (docs/extensions.rst, "The terminal page"): ``GET /sandboxes/{rid}/terminal``
answers one HTML page with xterm.js, its fit addon, and :file:`terminal.js` inlined, which
starts a terminal in the sandbox and attaches to its WebSocket with the token of the page's
fragment (``#token=...``) or of a prompt.

xterm.js comes from npm, pinned by this directory's ``package.json`` and
``package-lock.json``: ``npm ci --prefix sandboxd/terminal_page`` (run by ``tests/run`` and
``packaging/run-daemon``) copies the built files with their licences into ``vendor/``
(git-ignored). Without them the page is a ``503`` naming what is missing and the command to
run. The page itself holds no secret and names no sandbox's state: it is served without the
token, the same bytes for any ``rid``; every call it makes carries the token.
"""

import re
import secrets
from pathlib import Path

from attrs import define, field, frozen

HERE = Path(__file__).resolve().parent
VENDOR = HERE / "vendor"
VENDORED = ("xterm.css", "xterm.js", "addon-fit.js", "xterm.LICENSE", "addon-fit.LICENSE")
"""What ``npm ci`` here puts in ``vendor/`` (``vendor.js``): the page inlines the first three."""
PAGE_PATH = re.compile(rb"/sandboxes/[^/?#]+/terminal")
"""The path of a sandbox's terminal page (without a query)."""


def is_page_path(path: bytes) -> bool:
    """Whether a request-line path (without its query) is a terminal page's."""
    return PAGE_PATH.fullmatch(path) is not None


@frozen
class Page:
    """One answer of the page route: its status, content type, headers and body."""

    status: int
    content_type: bytes
    body: bytes
    headers: dict[bytes, bytes] = field(factory=dict)


def content_security(nonce: str) -> bytes:
    """The page's ``Content-Security-Policy``: its own inlined scripts only (by ``nonce``),
    connections to its own origin only (the API and the terminal's WebSocket), no frames,
    forms, images or other origins. xterm.js writes its own ``<style>`` elements."""
    return (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ).encode()


@define
class TerminalPage:
    """Assembles the page from ``vendor`` (the files are read once, when all are there:
    until then each request looks again, so an ``npm ci`` run later needs no restart)."""

    vendor: Path = VENDOR
    source: Path = HERE
    parts: dict[str, bytes] | None = None

    def missing(self) -> list[str]:
        """The vendored files that are not there."""
        return [name for name in VENDORED if not (self.vendor / name).is_file()]

    def _parts(self) -> dict[str, bytes] | None:
        if self.parts is None and not self.missing():
            parts = {name: (self.vendor / name).read_bytes() for name in VENDORED[:3]}
            for name in ("terminal.html", "terminal.js"):
                parts[name] = (self.source / name).read_bytes()
            self.parts = parts
        return self.parts

    def answer(self) -> Page:
        """The page (``200``) with a fresh script nonce, or a ``503`` in plain text naming the
        files missing and the command that puts them there."""
        parts = self._parts()
        if parts is None:
            text = (
                "The terminal page is not built: "
                f"{', '.join(self.missing())} missing from {self.vendor}.\n"
                f"Run: npm ci --prefix {self.source}\n"
            )
            return Page(503, b"text/plain; charset=utf-8", text.encode())
        nonce = secrets.token_urlsafe(18)
        body = parts["terminal.html"]
        for marker, value in (
            (b"{{nonce}}", nonce.encode()),
            (b"{{xterm.css}}", parts["xterm.css"]),
            (b"{{xterm.js}}", parts["xterm.js"]),
            (b"{{addon-fit.js}}", parts["addon-fit.js"]),
            (b"{{terminal.js}}", parts["terminal.js"]),
        ):
            body = body.replace(marker, value)
        headers = {
            b"content-security-policy": content_security(nonce),
            b"cache-control": b"no-store",
            b"referrer-policy": b"no-referrer",
            b"x-content-type-options": b"nosniff",
        }
        return Page(200, b"text/html; charset=utf-8", body, headers)
