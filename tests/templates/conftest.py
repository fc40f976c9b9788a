"""Fixtures of the template tests: a real ``twistd sandboxd`` (``tests.support.daemon``)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, start_daemon, stop_daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A development-mode daemon (``--isolation=none``) whose templates may hold 64 KiB."""
    running = start_daemon(tmp_path, "--isolation=none", "--template-max=64K")
    try:
        yield running
    finally:
        stop_daemon(running)
