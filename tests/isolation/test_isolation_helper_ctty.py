"""The exec helper's ``--ctty``, run for real on a pseudo-terminal of the kernel.

A terminal's command is spawned with the slave of a pty as its stdio. ``--ctty`` makes that
terminal the controlling terminal of the command's session, whether the spawner made the
session already (Twisted's ``usePTY`` child calls ``setsid`` and ``TIOCSCTTY``) or not: then
``Ctrl-C`` typed on the master interrupts the command, and ``stty size`` reads the size set
on the master. Without it, a command in a session of its own has no controlling terminal and
``Ctrl-C`` is a byte like any other.
"""

import fcntl
import os
import select
import signal
import struct
import tempfile
import termios
import time
from collections.abc import Iterator

import pytest

from sandboxd.isolation.base import Identity, NoTerminals, terminal_wrap
from sandboxd.isolation.exec.helper import HELPER, HelperSession, HelperWrapper
from sandboxd.isolation.exec.wrapper import spawn_env

SANDBOX = Identity(612111, 612112)
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "xterm"}

pytestmark = [
    pytest.mark.skipif(not os.path.exists(HELPER), reason="the helper is not built (no cc)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="sandbox mode needs root"),
]


def spawn_on_pty(
    argv: list[str], lead_session: bool, rows: int = 33, cols: int = 101
) -> tuple[int, int]:
    """Fork ``argv`` with a pty's slave as its stdio (``lead_session``: made session leader
    with the terminal as its controlling one first, as Twisted's ``usePTY`` does); the
    child's pid and the master."""
    master, slave = os.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs
        try:
            os.close(master)
            if lead_session:
                os.setsid()
                fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
            for fd in (0, 1, 2):
                os.dup2(slave, fd)
            os.execve(argv[0], argv, spawn_env(ENV))
        finally:
            os._exit(99)
    os.close(slave)
    return pid, master


def read_until(master: int, wanted: bytes, seconds: float = 10.0) -> bytes:
    """What the master gives until ``wanted`` is in it (or the time is up)."""
    seen = b""
    deadline = time.monotonic() + seconds
    while wanted not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


def wait_status(pid: int, seconds: float = 10.0) -> int | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


@pytest.fixture
def top() -> Iterator[str]:
    """A directory the sandbox uid can enter (pytest's own tmp_path is root's alone)."""
    path = tempfile.mkdtemp(prefix="sandboxd-ctty-test-")
    os.chmod(path, 0o755)
    yield path
    os.rmdir(path)


PROBE = "stty size; ps -o tty= -p $$; echo ready; exec sleep 30"


@pytest.mark.parametrize("lead_session", [True, False])
def test_ctrl_c_interrupts_the_command_and_stty_reads_the_size(
    top: str, lead_session: bool
) -> None:
    argv = HelperWrapper(HELPER, ctty=True)(SANDBOX, [], top, ["sh", "-c", PROBE])
    pid, master = spawn_on_pty(argv, lead_session)
    try:
        seen = read_until(master, b"ready")
        lines = seen.decode().split()
        assert "33" in lines and "101" in lines, seen
        assert lines[2] != "?", seen  # ps names the controlling terminal (pts/N)
        os.write(master, b"\x03")
        status = wait_status(pid)
    finally:
        os.close(master)
    assert status is not None and os.WIFSIGNALED(status), status
    assert os.WTERMSIG(status) == signal.SIGINT


def test_without_ctty_the_command_has_no_controlling_terminal(top: str) -> None:
    argv = HelperWrapper(HELPER)(SANDBOX, [], top, ["sh", "-c", PROBE])
    pid, master = spawn_on_pty(argv, lead_session=False)
    try:
        seen = read_until(master, b"ready")
        assert seen.decode().split()[2] == "?", seen
        os.write(master, b"\x03")
        status = wait_status(pid, seconds=1.0)
    finally:
        os.close(master)
    assert status is None  # Ctrl-C reached nobody: still sleeping, killed by the test


def test_a_spawned_session_leader_without_ctty_is_refused_before_the_command(top: str) -> None:
    argv = HelperWrapper(HELPER)(SANDBOX, [], top, ["sh", "-c", "echo ran"])
    pid, master = spawn_on_pty(argv, lead_session=True)
    try:
        seen = read_until(master, b"\n")
        status = wait_status(pid)
    finally:
        os.close(master)
    assert b"setsid" in seen and b"ran" not in seen
    assert status is not None and os.WEXITSTATUS(status) == 125


def test_session_mode_takes_ctty_too(top: str) -> None:
    argv = HelperSession(HELPER, ctty=True)(SANDBOX, [], top, ["sh", "-c", PROBE])
    assert "--ctty" in argv
    pid, master = spawn_on_pty(argv, lead_session=True)
    try:
        assert b"ready" in read_until(master, b"ready")
        os.write(master, b"\x03")
        status = wait_status(pid)
    finally:
        os.close(master)
    assert status is not None and os.WTERMSIG(status) == signal.SIGINT


def test_terminal_wrap_needs_a_chain_with_ctty() -> None:
    wrapped = terminal_wrap(HelperWrapper(HELPER))
    assert wrapped(SANDBOX, [], "/w", ["sh"])[:3] == [HELPER, "--umask=077", "--seccomp=default"]
    assert "--ctty" in wrapped(SANDBOX, [], "/w", ["sh"])
    with pytest.raises(NoTerminals):
        terminal_wrap(lambda identity, joins, cwd, argv: list(argv))
