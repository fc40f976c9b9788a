"""``sandboxctl shell`` (its own process, on a real pty made by the test) against a real
daemon with a token: a person at a terminal typing into a sandbox's terminal (issue 32).

The local terminal goes raw (``Ctrl-C`` reaches the sandbox: it interrupts a ``sleep`` there,
not ``sandboxctl``), the remote one starts at the local window size and follows a resize
(``SIGWINCH``), full-screen output (an alternate screen, cursor moves) passes through
untouched, and ``sandboxctl`` exits with the remote shell's exit code, leaving the local
terminal's mode as it found it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import struct
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.coverage import coverage_env
from tests.support.ws_client import HandshakeRefused, WebSocket

from .real_daemon import Daemon, running_daemon

REPO = str(Path(__file__).resolve().parents[2])
TOKEN = "shell-daemon-token"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("daemon"), TOKEN) as running:
        yield running


class Pty:
    """``sandboxctl shell`` on a pty of the test's: what it printed, keys typed on it."""

    def __init__(self, argv: list[str], env: dict[str, str], rows: int, cols: int) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.mode = termios.tcgetattr(slave)
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child execs
            try:
                os.setsid()
                fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
                for fd in (0, 1, 2):
                    os.dup2(slave, fd)
                os.execve(sys.executable, [sys.executable, *argv], env)
            finally:
                os._exit(99)
        self.slave = slave
        self.seen = b""

    def until(self, wanted: bytes, seconds: float = 30) -> bytes:
        deadline = time.monotonic() + seconds
        while wanted not in self.seen:
            assert time.monotonic() < deadline, f"{wanted!r} never came: {self.seen[-500:]!r}"
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    break
                self.seen += chunk
        return self.seen

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        os.kill(self.pid, signal.SIGWINCH)

    def exit_status(self, seconds: float = 30) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                with contextlib.suppress(OSError):
                    self.seen += os.read(self.master, 65536)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"sandboxctl did not exit: {self.seen[-500:]!r}")

    def close(self) -> None:
        os.close(self.master)
        os.close(self.slave)


def test_shell_is_an_interactive_terminal_in_the_sandbox(daemon: Daemon, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {
        **coverage_env(),
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": REPO,
        "SANDBOXD_URL": daemon.url,
        "SANDBOXD_TOKEN_FILE": str(token),
        "TERM": "xterm",
    }
    import subprocess

    made = subprocess.run(
        [sys.executable, "-m", "sandboxd_client.cli", "create"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert made.returncode == 0, made.stderr
    handle = made.stdout.decode().strip()
    shell = Pty(["-m", "sandboxd_client.cli", "shell", handle, "sh"], env, rows=30, cols=90)
    try:
        shell.until(b"$ ")
        shell.type(b"echo T=$TERM; stty size\n")
        shell.until(b"T=xterm")
        shell.until(b"30 90")
        shell.resize(45, 120)
        time.sleep(0.3)
        shell.type(b"stty size\n")
        shell.until(b"45 120")
        # full-screen output: the alternate screen, a cursor move, back
        shell.type(b"printf '\\033[?1049h\\033[10;5Hfull-%s\\033[?1049l' screen\n")
        shell.until(b"\x1b[?1049h\x1b[10;5Hfull-screen\x1b[?1049l")
        shell.type(b"sleep 30\n")
        time.sleep(0.5)
        shell.type(b"\x03")  # raw mode: a byte for the sandbox's terminal, not a SIGINT here
        shell.type(b"echo after=$?\n")
        shell.until(b"after=130")
        shell.type(b"exit 5\n")
        assert shell.exit_status() == 5
        assert termios.tcgetattr(shell.slave) == shell.mode  # the local mode is restored
    finally:
        shell.close()


def test_a_terminal_socket_without_the_token_is_refused(daemon: Daemon) -> None:
    port = int(daemon.url.rsplit(":", 1)[1].rstrip("/"))
    for headers in ({}, {"Authorization": "Bearer not-the-token"}):
        with pytest.raises(HandshakeRefused, match="401"):
            WebSocket(port, "/sandboxes/0123456789abcdef/terminals/x", headers)
