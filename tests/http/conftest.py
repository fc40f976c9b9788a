"""Fixtures of the in-memory HTTP tests (the harness itself is in ``http_harness``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from treq.testing import StubTreq
from twisted.internet.task import Clock

from sandboxd.assemble import in_process
from sandboxd.config import Config
from sandboxd.isolation.exec.helper import HELPER, helper_problem
from sandboxd.isolation.none import no_isolation
from tests.http.http_harness import Harness, ProcessReactor, SyncFiles, SyncPool, result_of

DEFAULTS = {
    "isolation": "none",
    "uid-min": "1000",
    "uid-max": "1009",
    "keepalive": "5s",
    "log-timeout": "5m",
    "exec-timeout": "10m",
    "max-output": "16M",
}


@pytest.fixture
def settings(tmp_path: Any) -> dict[str, str]:
    """Options for ``Config.load``; tests change them before asking for ``harness``."""
    return {
        **DEFAULTS,
        "root": str(tmp_path / "root"),
        "tools-dir": str(tmp_path / "tools"),
    }


@pytest.fixture
def token() -> bytes | None:
    return None


@pytest.fixture
def harness(settings: dict[str, str], token: bytes | None) -> Iterator[Harness]:
    config = Config.load({}, settings)
    clock = Clock()
    reactor = ProcessReactor()
    capacity = config.uid_max - config.uid_min + 1
    # The helper when it is built (as the daemon would), else the shell chain.
    helper = HELPER if helper_problem(HELPER, as_root=False) is None else None
    bundle = no_isolation(reactor, None, capacity, helper)  # type: ignore[arg-type]
    isolation = attrs.evolve(bundle, fs=SyncFiles())
    served = in_process(config, reactor, clock, isolation, SyncPool(), token=token)
    manager, api = served.manager, served.api
    result_of(manager.start())
    yield Harness(config, clock, manager, api, StubTreq(api.app.resource()), token)
    os.close(manager._devnull)


def _cache_pytests_twisted_version_lookup() -> None:
    """``treq.testing`` imports ``twisted.trial.unittest``; from then on pytest (9.x) asks
    ``importlib.metadata`` for Twisted's version before *every* test, which costs more than
    most of these tests. The installed version cannot change during a run: ask once."""
    import functools
    import sys

    from _pytest import unittest as pytest_unittest

    original = getattr(pytest_unittest, "_get_twisted_version", None)
    if original is None or hasattr(original, "cache_info"):
        return
    cached = functools.cache(original)

    def lookup() -> Any:
        if "twisted.trial.unittest" not in sys.modules:
            return original()
        return cached()

    lookup.cache_info = cached.cache_info  # type: ignore[attr-defined]
    pytest_unittest._get_twisted_version = lookup


_cache_pytests_twisted_version_lookup()


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    """An empty directory for request-body spools."""
    path = tmp_path / "spool"
    path.mkdir()
    return path
