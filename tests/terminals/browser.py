"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
the browser reads commands on its fd 3 and writes answers and events on its fd 4, each a JSON
message ending in a NUL byte), so no debugging port is opened. Blocking: the tests' daemons
are processes of their own."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str | None:
    """The path of a Chromium on ``PATH``, or ``None``."""
    for name in CANDIDATES:
        found = shutil.which(name)
        if found is not None:
            return found
    return None


class BrowserFailed(Exception):
    """The browser exited, answered an error, or did not answer in time."""


class Browser:
    """One headless Chromium with one page (a tab) attached in flat mode."""

    def __init__(self, executable: str, profile: Path, width: int = 900, height: int = 500):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def on_fds_3_and_4() -> None:  # pragma: no cover - runs in the child before exec
            # Out of the way first: either end may be fd 3 or 4 itself.
            reads, writes = (
                fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)
            )
            os.dup2(reads, 3)
            os.dup2(writes, 4)

        self.process = subprocess.Popen(
            [
                executable,
                "--headless",
                "--remote-debugging-pipe",
                # As root the browser refuses to start with its own sandbox.
                *(["--no-sandbox"] if os.geteuid() == 0 else []),
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            pass_fds=(3, 4),  # kept open through the exec (set by on_fds_3_and_4)
            preexec_fn=on_fds_3_and_4,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(profile / "chromium.log").open("wb"),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime"):
            self.page(f"{domain}.enable")

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserFailed("no answer from the browser in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserFailed("the browser exited")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    def call(
        self, method: str, session: str | None = None, timeout: float = 30, **params: Any
    ) -> dict[str, Any]:
        """Send one command, wait for its answer (keeping the events that come first)."""
        self._next_id += 1
        command: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            command["sessionId"] = session
        os.write(self._to_browser, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            message = self._message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise BrowserFailed(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        """A command to the page's session."""
        return self.call(method, session=self.session, **params)

    def event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        """The first event ``method`` seen (kept or still to come)."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == method:
                    self.events.remove(event)
                    params: dict[str, Any] = event.get("params", {})
                    return params
            self.events.append(self._message(deadline))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserFailed(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """Poll a JavaScript expression until its value is truthy (one that throws, as
        before the page has loaded, is not); that value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except BrowserFailed:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                status = self.evaluate("document.body && document.body.innerText")
                raise BrowserFailed(f"never true: {expression}; the page shows {status!r}")
            time.sleep(0.1)

    def type(self, text: str) -> None:
        """Type ``text`` into the focused element, then Enter."""
        self.page("Input.insertText", text=text)
        for kind in ("keyDown", "keyUp"):
            self.page(
                "Input.dispatchKeyEvent",
                type=kind,
                key="Enter",
                code="Enter",
                windowsVirtualKeyCode=13,
                **({"text": "\r"} if kind == "keyDown" else {}),
            )

    def screenshot(self, path: Path) -> Path:
        """A PNG of the page, written to ``path``."""
        path.write_bytes(base64.b64decode(self.page("Page.captureScreenshot")["data"]))
        return path

    def close(self) -> None:
        """Ask the browser to close, then make sure it has."""
        with contextlib.suppress(BrowserFailed, OSError):
            self.call("Browser.close", timeout=5)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
