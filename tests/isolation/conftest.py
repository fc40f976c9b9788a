"""Unit tests of ``sandboxd.isolation``: no root, no real cgroup, a fake kernel per test."""

import os
from collections.abc import Iterator

import pytest


@pytest.fixture
def fds() -> Iterator[list[int]]:
    """An exec's stdin, stdout and stderr (``/dev/null``), closed after the test."""
    opened = [os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC) for _ in range(3)]
    yield opened
    for fd in opened:
        os.close(fd)
