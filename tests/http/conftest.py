"""Fixtures of the in-memory HTTP tests (the harness itself is in ``http_harness``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from http_harness import Harness, ProcessReactor, SyncFiles, SyncPool, result_of
from treq.testing import StubTreq
from twisted.internet.task import Clock

from sandboxd.api import SandboxAPI
from sandboxd.config import Config
from sandboxd.isolation.none import no_isolation
from sandboxd.layout import Layout
from sandboxd.manager import SandboxManager

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
    isolation = attrs.evolve(no_isolation(reactor, None, capacity), fs=SyncFiles())  # type: ignore[arg-type]
    layout = Layout(config.root, owns_files=isolation.owns_files)
    manager = SandboxManager(config, reactor, clock, isolation, SyncPool(), layout)  # type: ignore[arg-type]
    result_of(manager.start())
    api = SandboxAPI(manager, token=token, pod_url=config.pod_url)
    yield Harness(config, clock, manager, api, StubTreq(api.app.resource()), token)
    os.close(manager._devnull)
