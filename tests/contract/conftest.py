"""Fixtures of the contract tests: ``docs/openapi.yaml`` against real daemons.

The daemon helpers live in ``tests/security/live_daemon.py`` (shared with the security tests).
"""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.security.live_daemon import new_token, running, write_token


@pytest.fixture(scope="module")
def token() -> str:
    return new_token()


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory, token: str) -> Iterator[Any]:
    """A development daemon (``--isolation=none``) requiring the bearer token, shared by the
    tests of one module."""
    tmp_path = tmp_path_factory.mktemp("contract")
    token_file = write_token(tmp_path / "token", token)
    with running(
        tmp_path, "--isolation=none", f"--token-file={token_file}", "--keepalive=1s"
    ) as daemon:
        yield daemon
