"""
The real daemon's HTTP API (``SandboxAPI``), built as ``twistd sandboxd --isolation=none``
builds it, served in memory: the client reaches it through treq's ``RequestTraversalAgent``
instead of a socket. Everything under the API (manager, processes, files, threads) is real
and runs on the real reactor; only the connection is in memory.

This is the one module of the client suite that imports the daemon (the client itself never
does): when the daemon's modules move, only the imports below change.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest_twisted
from attrs import frozen
from treq.testing import RequestTraversalAgent
from twisted.internet import reactor
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.task import LoopingCall
from twisted.python.threadpool import ThreadPool

from sandboxd.assemble import in_process
from sandboxd.config import Config
from sandboxd.core.manager import SandboxManager
from sandboxd.core.tools.resolver import build_tools
from sandboxd.http.api import SandboxAPI
from sandboxd.http.wire import ERROR_TYPES, INTERNAL
from sandboxd.isolation.select import build_isolation

POD_URL = "http://sandboxd.invalid:8080"
"""What the in-memory replica calls itself: a name that resolves nowhere, so a request that
left the in-memory agent would fail."""

PUMP_INTERVAL = 0.002
"""Seconds between moves of the in-memory connections' bytes (a pump, not a deadline)."""


def daemon_error_table() -> dict[str, int]:
    """The daemon's own table of wire error types and their statuses (its HTTP front's)."""
    table = {wire_type: status for status, wire_type in ERROR_TYPES.values()}
    table[INTERNAL[1]] = INTERNAL[0]
    return table


@frozen
class InMemoryDaemon:
    """The API's resource behind an in-memory agent, and the URL its handles carry."""

    agent: RequestTraversalAgent
    pod_url: str
    manager: SandboxManager
    api: SandboxAPI
    """Its ``capabilities`` can be narrowed to play an older replica (see :func:`older`)."""


def older(daemon: InMemoryDaemon, *missing: str) -> None:
    """Make the replica's ``/healthz`` list no ``missing`` capabilities, as a replica from
    before them would (its routes stay: a client that asks first never reaches them). Call
    before a client asks: it remembers a replica's capabilities."""
    assert set(missing) <= set(daemon.api.capabilities), "it lists them now"
    daemon.api.capabilities = [c for c in daemon.api.capabilities if c not in missing]


def serve_in_memory(
    tmp_path: Path, token: bytes | None, more: Mapping[str, str] | None = None
) -> Iterator[InMemoryDaemon]:
    """Build the daemon's API on ``tmp_path`` (``more``: further ``twistd sandboxd`` options,
    by name without the dashes); tear everything down (sandboxes killed)."""
    settings = {
        "isolation": "none",
        "root": str(tmp_path / "root"),
        "tools-dir": str(tmp_path / "tools"),
        "uid-min": "1000",
        "uid-max": "1009",
        "keepalive": "1s",
        "pod-url": POD_URL,
        **(more or {}),
    }
    config = Config.load({}, settings)
    file_pool = ThreadPool(minthreads=1, maxthreads=4, name="client-test-files")
    admin_pool = ThreadPool(minthreads=0, maxthreads=2, name="client-test-admin")
    file_pool.start()
    admin_pool.start()
    isolation = build_isolation(config, reactor, file_pool)
    tools = build_tools(config.tools_dir, reactor, admin_pool)
    served = in_process(config, reactor, reactor, isolation, admin_pool, token=token, tools=tools)
    manager, api = served.manager, served.api
    pytest_twisted.blockon(manager.start())
    agent = RequestTraversalAgent(api.app.resource())
    pump = LoopingCall(agent.flush)
    pump.clock = reactor
    pump.start(PUMP_INTERVAL)
    try:
        yield InMemoryDaemon(agent, POD_URL, manager, api)
    finally:
        kills = [Deferred.fromCoroutine(manager.kill(rid)) for rid in list(manager.sandboxes)]
        pytest_twisted.blockon(DeferredList(kills))
        pump.stop()
        file_pool.stop()
        admin_pool.stop()
        os.close(manager._devnull)
