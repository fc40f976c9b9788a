"""Fixtures of the process tests: a real ``twistd sandboxd`` (``tests.support.daemon``)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, start_daemon, stop_daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A development-mode daemon (``--isolation=none``) with small, test-friendly limits."""
    running = start_daemon(tmp_path, "--isolation=none", "--keepalive=1s", "--max-output=1M")
    try:
        yield running
    finally:
        stop_daemon(running)
