"""Fixtures of the load test: one real daemon subprocess per test."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from load_daemon import SoakDaemon, choose_isolation, start_daemon


@pytest.fixture
def soak_daemon() -> Iterator[SoakDaemon]:
    """A ``twistd sandboxd``, isolated when root and possible (see ``load_daemon``)."""
    daemon = start_daemon(choose_isolation())
    try:
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(daemon.scratch, ignore_errors=True)
