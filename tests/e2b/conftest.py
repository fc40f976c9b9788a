"""Fixtures of the E2B front's tests: one real daemon with the front on a port of its own,
and the unmodified ``e2b`` SDK pointed at it by environment variables only.

As root the daemon runs under the real isolation (its default); as a user, ``none``.
"""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, free_port, start_daemon, stop_daemon

TOKEN = "e2b-test-token"


class E2BDaemon:
    """The daemon, and the URL of its E2B front."""

    def __init__(self, daemon: Daemon, port: int) -> None:
        self.daemon = daemon
        self.url = f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def e2b_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BDaemon]:
    tmp = tmp_path_factory.mktemp("e2b")
    token = tmp / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    port = free_port()
    args = [f"--e2b-listen=tcp:{port}:interface=127.0.0.1", f"--token-file={token}"]
    if os.geteuid() != 0:
        args.append("--isolation=none")
    daemon = start_daemon(Path(tmp), *args)
    front = E2BDaemon(daemon, port)
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    saved["NO_PROXY"] = os.environ.get("NO_PROXY")
    # The three variables a program written for E2B changes to run here (docs/e2b.rst).
    os.environ.update(
        E2B_API_URL=front.url,
        E2B_SANDBOX_URL=front.url,
        E2B_API_KEY=TOKEN,
        NO_PROXY="127.0.0.1,localhost",
    )
    try:
        yield front
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        stop_daemon(daemon)


@pytest.fixture
def sandbox(e2b_daemon: E2BDaemon) -> Iterator["object"]:
    """A sandbox made by the SDK's ``Sandbox.create()``, killed after the test."""
    from e2b import Sandbox

    created = Sandbox.create(timeout=120)
    try:
        yield created
    finally:
        created.kill()
