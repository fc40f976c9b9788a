"""
A real daemon for the client suite: ``twistd -n sandboxd --isolation=none`` from this work
tree, on a free loopback port, with a bearer token; stopped by ``POST /drain`` (else SIGTERM,
then SIGKILL).

The client suite starts the daemon as a process and never imports it here.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from attrs import frozen

from sandboxd_client import HttpSandbox
from tests.support.daemon import (
    SHARED_ROOTS,
    daemon_argv,
    daemon_environ,
    reachable_root,
    unisolated_uids,
)

REPO = Path(__file__).resolve().parents[2]
START_POLLS = 600
"""Looks at ``/healthz`` before start-up counts as failed (a hang guard, not a timing)."""


class DaemonFailed(Exception):
    """The daemon exited or never answered; the message carries its log."""


@frozen
class Daemon:
    url: str
    root: Path
    log: Path
    token: str
    pid: int = 0
    """The daemon's process id (to read its memory from ``/proc``)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def running_daemon(base: Path, token: str, *extra: str) -> Iterator[Daemon]:
    """Start a daemon under ``base`` (root, tools, log), yield it once it answers, stop it."""
    token_file = base / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    root, tools = reachable_root(base), reachable_root(base, "tools")
    port = free_port()
    # SANDBOXD_DRAIN_IDLE=0s: its SIGTERM stop kills what is left at once
    env = daemon_environ({"SANDBOXD_DRAIN_IDLE": "0s", "SANDBOXD_ROOT": str(root)})
    argv = daemon_argv(
        "--isolation=none",
        *unisolated_uids(["--isolation=none", *extra]),
        f"--listen=tcp:{port}:interface=127.0.0.1",
        f"--token-file={token_file}",
        f"--tools-dir={tools}",
        "--keepalive=1s",
        *extra,
    )
    log = base / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(START_POLLS):
            if process.poll() is not None:
                raise DaemonFailed(f"daemon exited {process.returncode}: {log.read_text()}")
            if healthy(url):
                break
            time.sleep(0.05)
        else:
            raise DaemonFailed(f"daemon did not answer: {log.read_text()}")
        yield Daemon(url, root, log, token, process.pid)
    finally:
        if process.poll() is None and not drained(url, token, process):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for made in (root, tools):
            if made.parent == SHARED_ROOTS:
                shutil.rmtree(made, ignore_errors=True)


def drained(url: str, token: str, process: subprocess.Popen[bytes]) -> bool:
    """Stop the daemon by ``POST /drain`` and wait for its exit; False if that fails.

    A drained daemon exits normally, so its coverage data is saved; twistd ends a SIGTERM
    stop by re-raising the signal, and the process then saves none.
    """
    request = urllib.request.Request(
        url + "/drain", method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        urllib.request.urlopen(request, timeout=10).close()
        process.wait(30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return True


def daemon_and_client(token: str) -> tuple[object, object]:
    """The fixtures of a module that drives one real daemon: ``daemon`` (started once for the
    module, with ``token``) and ``client`` (an ``HttpSandbox`` of it per test, closed after).
    A module takes them as ``daemon, client = daemon_and_client(TOKEN)``."""

    @pytest.fixture(scope="module")
    def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
        with running_daemon(tmp_path_factory.mktemp("daemon"), token) as running:
            yield running

    @pytest.fixture
    def client(daemon: Daemon) -> Iterator[HttpSandbox]:
        from twisted.internet import reactor

        c = HttpSandbox(daemon.url, token=daemon.token, reactor=reactor, exec_idle_timeout=10.0)
        yield c
        pytest_twisted.blockon(c.close())

    return daemon, client
