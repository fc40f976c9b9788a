"""The composition root (``sandboxd.assemble``): one object graph, each part handed what it
uses at construction; the boot steps themselves are pinned by ``test_unit_tap`` and
``test_unit_boot_undo``."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest
from twisted.internet.task import Clock

from sandboxd import assemble as root
from sandboxd.assemble import assemble, in_process
from sandboxd.config import Config
from sandboxd.service import ExitStatus
from sandboxd.undo import StartupUndo
from tests.http.http_harness import SyncPool
from tests.support.fakes import fake_isolation


def test_the_daemon_is_one_graph(environ: dict[str, str]) -> None:
    from twisted.internet import reactor

    environ["SANDBOXD_E2B_LISTEN"] = "tcp:0:interface=127.0.0.1"
    undo, exit_status = StartupUndo(), ExitStatus()
    daemon = assemble(Config.load(environ, {}), reactor, environ, undo, exit_status)
    service, fronts = daemon.service, daemon.fronts
    assert service.manager is fronts.manager is fronts.api.manager is fronts.e2b.manager
    assert service.listeners is not None and service.listeners.factory is daemon.site
    (e2b,) = service.more_listeners
    assert e2b.factory is not daemon.site  # the E2B front has a site of its own
    assert (service.undo, service.exit_status) == (undo, exit_status)
    # /healthz lists, once and sorted, what the API serves and how the daemon listens, guards
    # its connections and which other front it runs.
    caps = fronts.api.capabilities
    assert caps == sorted(set(caps))
    assert {"listen.dual-stack", "http.auth_at_headers", "http.connection_cap", "e2b"} <= {*caps}
    # POST /drain drains the daemon's service and exits.
    drains: list[None] = []
    service.drain_and_exit = lambda: drains.append(None)  # type: ignore[method-assign]
    fronts.api.on_drain()
    assert drains == [None]
    undo.run()


def test_in_process_is_the_graph_without_the_boot(environ: dict[str, str]) -> None:
    config = Config.load(environ, {})
    clock = Clock()
    fronts = in_process(config, clock, clock, fake_isolation(), SyncPool(), token=b"key")
    root = os.path.realpath(config.root)
    assert fronts.manager.layout.root == root
    assert Path(root).is_dir()
    assert not (Path(root) / ".lock").exists()  # no boot step ran: nothing is locked
    assert (fronts.manager.clock, fronts.api.token, fronts.e2b.token) == (clock, b"key", b"key")
    assert fronts.e2b.manager is fronts.manager
    fronts.api.on_drain()  # no service to drain: creates are refused, the daemon goes on
    assert fronts.manager.draining


def test_a_spawn_server_is_closed_by_the_undo_of_start_up(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from twisted.internet import reactor

    closed: list[str] = []

    class SpawnServer:
        def close(self) -> None:
            closed.append("spawn server")

    isolation = attrs.evolve(fake_isolation(), spawn_server=SpawnServer())  # type: ignore[arg-type]
    monkeypatch.setattr(root, "build_isolation", lambda config, reactor, pool: isolation)
    undo = StartupUndo()
    assemble(Config.load(environ, {}), reactor, environ, undo, ExitStatus())
    assert closed == []
    undo.run()
    assert closed == ["spawn server"]
