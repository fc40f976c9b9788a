"""Fixtures of the lifecycle state machine: the daemon variants it runs against."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from sandboxd.isolation.base import IsolationUnavailable
from tests.lifecycle.lifecycle_harness import InProcessDaemon, build_daemon
from tests.lifecycle.lifecycle_variants import KERNEL_HOST, KERNEL_SETTINGS, NONE_SETTINGS


@pytest.fixture
def none_daemon() -> Callable[[], InProcessDaemon]:
    return lambda: build_daemon(NONE_SETTINGS)


@pytest.fixture
def kernel_daemon() -> Callable[[], InProcessDaemon]:
    """Builds cgroup v1 daemons; skips unless root on a host where that driver works."""
    if os.geteuid() != 0:
        pytest.skip("real uids and cgroups need root")
    try:
        probe = build_daemon(KERNEL_SETTINGS, KERNEL_HOST)
    except IsolationUnavailable as e:
        pytest.skip(f"cgroup1 isolation unavailable here: {e}")
    probe.close()
    return lambda: build_daemon(KERNEL_SETTINGS, KERNEL_HOST)
