"""``sandbox.pty`` of the unmodified E2B SDK (issue 32; docs/e2b.rst, "Coverage"), on a daemon
without isolation and on one under the real isolation (as root).

``pty.create`` starts ``bash -i -l`` on a terminal: what is sent with ``send_stdin`` is typed
on it and its output arrives as ``pty`` data; ``resize`` is seen by ``stty size``; ``Ctrl-C``
interrupts a ``sleep`` (the terminal is the shell's controlling one); ``connect`` attaches a
second handle; ``kill`` ends it.
"""

import threading
import time
from typing import Any

from e2b import PtySize

from tests.e2b.conftest import E2BDaemon


class Screen:
    """What a terminal printed, collected by a thread that waits on its handle."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.seen = b""
        self.result: Any = None
        self.error: BaseException | None = None
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _on_pty(self, data: bytes) -> None:
        with self.changed:
            self.seen += data
            self.changed.notify_all()

    def _wait(self) -> None:
        try:
            self.result = self.handle.wait(on_pty=self._on_pty)
        except BaseException as e:  # the SDK raises for a non-zero exit: kept for the test
            self.error = e
        with self.changed:
            self.changed.notify_all()

    def until(self, wanted: bytes, seconds: float = 30) -> bytes:
        deadline = time.monotonic() + seconds
        with self.changed:
            while wanted not in self.seen:
                left = deadline - time.monotonic()
                assert left > 0, f"{wanted!r} never came: {self.seen[-400:]!r}"
                self.changed.wait(left)
            return self.seen


def test_the_sdk_pty_types_resizes_interrupts_and_kills(any_sandbox: Any) -> None:
    sbx = any_sandbox
    terminal = sbx.pty.create(PtySize(rows=33, cols=101), timeout=120)
    screen = Screen(terminal)
    sbx.pty.send_stdin(terminal.pid, b"echo hi-$((40+2)); stty size\n")
    screen.until(b"hi-42")
    screen.until(b"33 101")
    sbx.pty.resize(terminal.pid, PtySize(rows=40, cols=132))
    sbx.pty.send_stdin(terminal.pid, b"stty size\n")
    screen.until(b"40 132")
    sbx.pty.send_stdin(terminal.pid, b"sleep 30\n")
    time.sleep(0.5)
    started = time.monotonic()
    sbx.pty.send_stdin(terminal.pid, b"\x03")
    sbx.pty.send_stdin(terminal.pid, b"echo after=$?\n")
    screen.until(b"after=130")
    assert time.monotonic() - started < 20
    second = Screen(sbx.pty.connect(terminal.pid, timeout=60))
    sbx.pty.send_stdin(terminal.pid, b"echo again-$((1+1))\n")
    second.until(b"again-2")
    assert sbx.pty.kill(terminal.pid) is True
    screen.thread.join(30)
    second.thread.join(30)
    assert not screen.thread.is_alive() and screen.error is not None  # killed: not exit 0
    assert sbx.pty.kill(terminal.pid) is False


def test_a_pty_that_exits_ends_its_handle_with_the_shell_code(sandbox: Any) -> None:
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=60)
    screen = Screen(terminal)
    sandbox.pty.send_stdin(terminal.pid, b"exit 0\n")
    screen.thread.join(30)
    assert screen.error is None and screen.result.exit_code == 0


def test_pty_calls_on_a_process_that_is_no_terminal_are_refused(
    e2b_daemon: E2BDaemon, sandbox: Any
) -> None:
    plain = sandbox.commands.run("sleep 30", background=True, stdin=True)
    try:
        for call in (
            lambda: sandbox.pty.send_stdin(plain.pid, b"x"),
            lambda: sandbox.pty.resize(plain.pid, PtySize(rows=5, cols=5)),
        ):
            try:
                call()
            except Exception as e:
                assert "not a PTY" in str(e), e
            else:
                raise AssertionError("a pty call on a plain process was accepted")
    finally:
        plain.kill()
