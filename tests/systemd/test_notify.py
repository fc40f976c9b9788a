"""sd_notify for Type=notify: READY=1 once the API listens, STOPPING=1 when the drain starts.

A real ``twistd -n sandboxd`` is given ``NOTIFY_SOCKET`` pointing at a datagram socket the test
binds, exactly as systemd does.
"""

import os
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd import notify
from tests.support.daemon import (
    Daemon,
    daemon_argv,
    daemon_environ,
    start_daemon,
    stop_daemon,
)


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(60)
    try:
        yield sock, path
    finally:
        sock.close()


def received(sock: socket.socket) -> dict[str, str]:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.splitlines())


def test_notify_sends_one_datagram(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    assert notify.notify("READY=1\nSTATUS=x", {"NOTIFY_SOCKET": path})
    assert received(sock) == {"READY": "1", "STATUS": "x"}


def test_notify_abstract_namespace() -> None:
    name = f"sandboxd-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        assert notify.notify("STOPPING=1", {"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(100) == b"STOPPING=1"


def test_notify_outside_systemd_does_nothing(tmp_path: Path) -> None:
    assert not notify.notify("READY=1", {})
    assert not notify.notify("READY=1", {"NOTIFY_SOCKET": "relative/path"})
    # A socket that went away is logged, never raised.
    assert not notify.notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})


def start(tmp_path: Path, path: str) -> Daemon:
    return start_daemon(tmp_path, "--isolation=none", env={"NOTIFY_SOCKET": path})


def test_daemon_is_ready_only_once_listening_and_stops_on_sigterm(
    tmp_path: Path, listener: tuple[socket.socket, str]
) -> None:
    sock, path = listener
    daemon = start(tmp_path, path)
    try:
        ready = received(sock)
        assert ready["READY"] == "1"
        # READY=1 came after the port was listening: the API answers now.
        assert daemon.call("GET", "/healthz")[0] == 200
        daemon.process.send_signal(signal.SIGTERM)
        assert received(sock)["STOPPING"] == "1"
        # twistd ends by re-raising the signal that stopped it; systemd counts SIGTERM as clean.
        assert daemon.process.wait(30) == -signal.SIGTERM
    finally:
        stop_daemon(daemon)


def test_post_drain_says_stopping(tmp_path: Path, listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    daemon = start(tmp_path, path)
    try:
        assert received(sock)["READY"] == "1"
        request = urllib.request.Request(daemon.url + "/drain", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 204
        assert received(sock)["STOPPING"] == "1"
        assert daemon.process.wait(30) == 0
    finally:
        stop_daemon(daemon)


def test_no_ready_when_the_port_is_taken(
    tmp_path: Path, listener: tuple[socket.socket, str]
) -> None:
    sock, path = listener
    (tmp_path / "first").mkdir()
    first = start(tmp_path / "first", path)
    try:
        assert received(sock)["READY"] == "1"
        env = daemon_environ({"NOTIFY_SOCKET": path})
        argv = daemon_argv(
            "--isolation=none",
            f"--listen=tcp:{first.port}:interface=127.0.0.1",
            f"--root={tmp_path / 'second'}",
        )
        log = tmp_path / "second.log"
        with open(log, "wb") as out:
            second = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            # twistd fails the start at once (systemd sees the exit, not a hung start)...
            assert second.wait(120) != 0, log.read_text()
            assert "Address already in use" in log.read_text()
        finally:
            if second.poll() is None:
                second.kill()
                second.wait(30)
        # ...and never said READY=1: only the status, naming the failure.
        sock.setblocking(False)
        status = sock.recv(4096).decode()
        assert status.startswith("STATUS=start-up failed at listen: 127.0.0.1:"), status
        assert "READY=1" not in status
        with pytest.raises(BlockingIOError):
            sock.recv(4096)
    finally:
        stop_daemon(first)
