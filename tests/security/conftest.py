"""Fixtures of the security tests: real ``twistd -n sandboxd`` daemons over real TCP."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.security.live_daemon import new_token, start_daemon, stop_daemon, write_token


@pytest.fixture
def token() -> str:
    """A fresh random token per test, so finding it anywhere means it leaked."""
    return new_token()


@pytest.fixture
def token_file(tmp_path: Path, token: str) -> Path:
    return write_token(tmp_path / "token", token)


@pytest.fixture
def authed(tmp_path: Path, token_file: Path) -> Iterator[Any]:
    """A development daemon (``--isolation=none``) that requires the bearer token."""
    daemon = start_daemon(
        tmp_path, "--isolation=none", f"--token-file={token_file}", "--keepalive=1s"
    )
    try:
        yield daemon
    finally:
        stop_daemon(daemon)


@pytest.fixture
def open_daemon(tmp_path: Path) -> Iterator[Any]:
    """A development daemon without a token."""
    daemon = start_daemon(tmp_path, "--isolation=none", "--keepalive=1s")
    try:
        yield daemon
    finally:
        stop_daemon(daemon)
