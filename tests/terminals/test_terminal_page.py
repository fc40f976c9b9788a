"""The terminal page (issue 32; docs/extensions.rst, "The terminal page") in a real headless
Chromium against a real daemon with a token: the page starts a shell in the sandbox, the
prompt shows, a typed command's output is read back from the page's DOM, a window resize
reaches the terminal (``stty size``), the token comes from the fragment or a prompt and is
gone from the address afterwards, and a wrong token shows the refusal. Screenshots are saved
in each test's tmp dir.

Skipped when no Chromium is installed (``tests/run`` installs Debian's ``chromium`` as root)
or the page is not built (``npm ci --prefix sandboxd/terminal_page``, run by ``tests/run``).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.terminal_page import TerminalPage
from tests.client.real_daemon import Daemon, running_daemon

from .browser import Browser, chromium

TOKEN = "page-token+/=~"
"""Not base64url-safe: the page must encode it for the socket's subprotocol."""
CHROMIUM = chromium()
MISSING = TerminalPage().missing()
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (Debian: apt-get install chromium)"),
    pytest.mark.skipif(
        bool(MISSING),
        reason="the terminal page is not built: npm ci --prefix sandboxd/terminal_page",
    ),
]
ROWS_TEXT = (
    "document.querySelector('.xterm-rows') && document.querySelector('.xterm-rows').innerText"
)
ROW_COUNT = "document.querySelector('.xterm-rows').children.length"
STATUS_TEXT = "document.getElementById('status').textContent"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("daemon"), TOKEN) as running:
        yield running


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    assert CHROMIUM is not None
    profile = tmp_path / "profile"
    profile.mkdir()
    opened = Browser(CHROMIUM, profile)
    try:
        yield opened
    finally:
        opened.close()


def sandbox(daemon: Daemon) -> str:
    request = urllib.request.Request(
        daemon.url + "/sandboxes",
        data=b"{}",
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.load(response)["remote_id"])


def page_url(daemon: Daemon, rid: str, fragment: str = "") -> str:
    return f"{daemon.url}/sandboxes/{rid}/terminal{fragment}"


def fragment_of(token: str) -> str:
    return "#token=" + urllib.parse.quote(token, safe="")


def test_the_page_runs_a_shell_and_shows_what_it_prints(
    daemon: Daemon, browser: Browser, tmp_path: Path
) -> None:
    rid = sandbox(daemon)
    browser.page("Page.navigate", url=page_url(daemon, rid, fragment_of(TOKEN)))
    assert browser.wait_for(f"{STATUS_TEXT}.startsWith('connected')")
    browser.wait_for(f"({ROWS_TEXT} || '').includes('$')")  # sh's prompt
    # The token left the address bar (and the history) as soon as the page read it.
    assert browser.evaluate("location.href") == page_url(daemon, rid)
    browser.type("echo page-$((6*7)); echo T=$TERM")
    rows = browser.wait_for(f"({ROWS_TEXT} || '').includes('page-42') && {ROWS_TEXT}")
    assert "T=xterm-256color" in rows
    browser.screenshot(tmp_path / "terminal.png")
    assert (tmp_path / "terminal.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A window resize: the page fits the terminal to it (fewer rows drawn) and tells the
    # daemon, which sets the pty's size: the shell's stty reads what the page shows.
    browser.page(
        "Emulation.setDeviceMetricsOverride",
        width=500,
        height=300,
        deviceScaleFactor=1,
        mobile=False,
    )
    drawn = browser.wait_for(f"{ROW_COUNT} < 20 && {ROW_COUNT}")
    browser.type("clear; stty size")
    browser.wait_for(f"/^\\d+ \\d+$/m.test({ROWS_TEXT})")
    text = browser.evaluate(ROWS_TEXT)
    rows, cols = (int(n) for n in re.search(r"^(\d+) (\d+)$", text, re.M).groups())  # type: ignore[union-attr]
    assert rows == drawn and 20 < cols < 80, (rows, cols, drawn)
    browser.screenshot(tmp_path / "resized.png")

    browser.type("exit 3")
    assert browser.wait_for(f"{STATUS_TEXT}.includes('exit 3') && {STATUS_TEXT}")
    # The page's request line, its calls and its socket left no trace of the token in the
    # daemon's log (the fragment is never sent; the subprotocol is not logged).
    log = daemon.log.read_text()
    assert f"/sandboxes/{rid}/terminal " in log
    assert TOKEN not in log and urllib.parse.quote(TOKEN, safe="") not in log


def test_the_token_from_a_prompt(daemon: Daemon, browser: Browser, tmp_path: Path) -> None:
    rid = sandbox(daemon)
    browser.page("Page.navigate", url=page_url(daemon, rid))
    dialog = browser.event("Page.javascriptDialogOpening")
    assert dialog["type"] == "prompt"
    browser.page("Page.handleJavaScriptDialog", accept=True, promptText=TOKEN)
    assert browser.wait_for(f"{STATUS_TEXT}.startsWith('connected')")
    browser.type("echo prompted-ok")
    browser.wait_for(f"({ROWS_TEXT} || '').includes('prompted-ok')")
    browser.screenshot(tmp_path / "prompted.png")


def test_a_wrong_token_shows_the_refusal(daemon: Daemon, browser: Browser, tmp_path: Path) -> None:
    rid = sandbox(daemon)
    browser.page("Page.navigate", url=page_url(daemon, rid, fragment_of("not-the-token")))
    status = browser.wait_for(f"{STATUS_TEXT}.startsWith('refused') && {STATUS_TEXT}")
    assert "401" in status and "Unauthorized" in status, status
    assert browser.evaluate("document.getElementById('status').className") == "refused"
    browser.screenshot(tmp_path / "refused.png")


def test_attaching_to_a_terminal_with_a_wrong_token_shows_the_refusal(
    daemon: Daemon, browser: Browser, tmp_path: Path
) -> None:
    """The socket's own check: the page is told an existing terminal's id and a wrong token,
    so its first call is the WebSocket handshake, which the daemon refuses."""
    rid = sandbox(daemon)
    request = urllib.request.Request(
        f"{daemon.url}/sandboxes/{rid}/terminals",
        data=b"{}",
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        terminal = json.load(response)["id"]
    browser.page("Page.navigate", url=page_url(daemon, rid, f"#token=wrong&terminal={terminal}"))
    status = browser.wait_for(f"{STATUS_TEXT}.startsWith('refused') && {STATUS_TEXT}")
    assert "closed the connection" in status, status
    browser.screenshot(tmp_path / "socket-refused.png")
    # With the right token the same terminal is reached (about:blank first: a new fragment
    # alone would not load the page again).
    browser.page("Page.navigate", url="about:blank")
    browser.page(
        "Page.navigate", url=page_url(daemon, rid, f"{fragment_of(TOKEN)}&terminal={terminal}")
    )
    assert browser.wait_for(f"{STATUS_TEXT}.startsWith('connected')")
