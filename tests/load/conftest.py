"""Fixtures of the load test: one real daemon subprocess per test."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator

import pytest

from tests.load.load_daemon import SoakDaemon, choose_isolation, start_daemon


@pytest.fixture
def soak_daemon() -> Iterator[SoakDaemon]:
    """A ``twistd sandboxd``, isolated when root and possible (see ``load_daemon``); after the
    test, a clean stop must leave nothing of it either."""
    daemon = start_daemon(choose_isolation())
    try:
        yield daemon
    finally:
        log = daemon.stop()
        left = daemon.instance_cgroups()
        shutil.rmtree(daemon.scratch, ignore_errors=True)
    # A clean stop (SIGTERM: drain; twistd then ends by the same signal, which systemd and
    # Kubernetes count as a clean exit) removes the daemon's own cgroups too.
    assert daemon.process.returncode in (0, -signal.SIGTERM), log[-2000:]
    assert "Server Shut Down." in log, log[-2000:]
    assert left == [], f"instance cgroups left after a clean stop: {left}"
