"""Fixtures of the E2B front's tests: real daemons with the front on a port of their own,
and the unmodified ``e2b`` SDK pointed at one by environment variables only.

Most tests use a development-mode daemon (``--isolation=none``: its code is measured by
coverage); the isolation tests, and a few others, also run against a daemon under the real
isolation (its default as root; skipped as a user).
"""

import contextlib
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, free_port, start_daemon, stop_daemon

TOKEN = "e2b-test-token"


class E2BDaemon:
    """The daemon, and the URL of its E2B front."""

    def __init__(self, daemon: Daemon, port: int, isolated: bool) -> None:
        self.daemon = daemon
        self.url = f"http://127.0.0.1:{port}"
        self.isolated = isolated


def _stop(front: E2BDaemon) -> None:
    """Stop by ``POST /drain`` (the reactor stops and the process exits normally, so its
    coverage is saved; twistd re-raises a SIGTERM and dies of it), else as usual."""
    request = urllib.request.Request(
        front.daemon.url + "/drain", method="POST", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    try:
        urllib.request.urlopen(request, timeout=30).close()
        front.daemon.process.wait(60)
    except (OSError, subprocess.TimeoutExpired):
        pass
    stop_daemon(front.daemon)


def _start(tmp: Path, *args: str, env: dict[str, str] | None = None) -> E2BDaemon:
    token = tmp / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    port = free_port()
    listen = f"--e2b-listen=tcp:{port}:interface=127.0.0.1"
    daemon = start_daemon(tmp, listen, f"--token-file={token}", *args, env=env)
    return E2BDaemon(daemon, port, isolated="--isolation=none" not in args)


@contextlib.contextmanager
def running_front(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[E2BDaemon]:
    """A daemon with the E2B front, started in ``tmp`` with ``args`` (and ``env``) and stopped
    on leaving; one under the real isolation (``args`` without ``--isolation=none``) is
    skipped as a user."""
    if "--isolation=none" not in args and os.geteuid() != 0:
        pytest.skip("the real isolation needs root")
    front = _start(tmp, *args, env=env)
    try:
        yield front
    finally:
        _stop(front)


@pytest.fixture(scope="session")
def unisolated_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BDaemon]:
    with running_front(tmp_path_factory.mktemp("e2b"), "--isolation=none") as front:
        yield front


@pytest.fixture(scope="session")
def isolated_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BDaemon]:
    with running_front(tmp_path_factory.mktemp("e2b-isolated")) as front:
        yield front


@pytest.fixture(scope="session")
def unnamespaced_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BDaemon]:
    """The real isolation with the namespace layers off by name (no mount namespace)."""
    with running_front(tmp_path_factory.mktemp("e2b-no-ns"), "--namespaces=none") as front:
        yield front


def point_sdk_at(monkeypatch: pytest.MonkeyPatch, front: E2BDaemon) -> E2BDaemon:
    """The three variables a program written for E2B changes to run here (docs/e2b.rst)."""
    monkeypatch.setenv("E2B_API_URL", front.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", front.url)
    monkeypatch.setenv("E2B_API_KEY", TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    return front


@pytest.fixture
def e2b_daemon(monkeypatch: pytest.MonkeyPatch, unisolated_front: E2BDaemon) -> E2BDaemon:
    return point_sdk_at(monkeypatch, unisolated_front)


@pytest.fixture(params=["isolation-none", "isolation-real"])
def any_daemon(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> E2BDaemon:
    """Each test using it runs against both daemons."""
    name = "unisolated_front" if request.param == "isolation-none" else "isolated_front"
    return point_sdk_at(monkeypatch, request.getfixturevalue(name))


@pytest.fixture
def sandbox(e2b_daemon: E2BDaemon) -> Iterator["object"]:
    """A sandbox made by the SDK's ``Sandbox.create()``, killed after the test."""
    from e2b import Sandbox

    with Sandbox.create(timeout=120) as created:  # killed on leaving
        yield created


@pytest.fixture
def any_sandbox(any_daemon: E2BDaemon) -> Iterator["object"]:
    """A sandbox of each daemon."""
    from e2b import Sandbox

    with Sandbox.create(timeout=120) as created:  # killed on leaving
        yield created
