"""The second SIGINT/SIGTERM (``sandboxd.stop_signals``, and the daemon's use of it): real
signals, raised in this process, reach the action through the reactor; during a drain of a
``twistd sandboxd`` service tree they end the drain at once, killing what is left.

This process's own SIGINT and SIGTERM handlers are put back after each test (conftest.py).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any, cast

import pytest_twisted
from twisted.logger import ILogObserver, globalLogPublisher

from sandboxd import tap
from sandboxd.stop_signals import on_next_stop_signal


class Reactor:
    """Records what a signal handler hands to the reactor's thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[Callable[..., object], tuple[object, ...]]] = []

    def callFromThread(self, f: Callable[..., object], *args: object) -> None:
        self.calls.append((f, args))


def test_each_stop_signal_then_runs_the_action_through_the_reactor() -> None:
    reactor = Reactor()
    seen: list[str] = []
    on_next_stop_signal(reactor, seen.append)
    signal.raise_signal(signal.SIGTERM)
    signal.raise_signal(signal.SIGINT)
    assert reactor.calls == [(seen.append, ("SIGTERM",)), (seen.append, ("SIGINT",))]
    assert seen == [], "run in the reactor's thread, not in the handler"
    for f, args in reactor.calls:
        f(*args)
    assert seen == ["SIGTERM", "SIGINT"]


@pytest_twisted.ensureDeferred
async def test_a_signal_during_the_drain_kills_every_sandbox_at_once(
    environ: dict[str, str],
) -> None:
    from twisted.internet import reactor

    # Without the signal, the drain would wait for the sandbox.
    environ["SANDBOXD_DRAIN_IDLE"] = "1h"
    environ["SANDBOXD_DRAIN_DEADLINE"] = "2h"
    options = tap.Options()
    options.parseOptions([])
    service: Any = tap.makeService(options, reactor, environ)  # the tree twistd would run
    events: list[dict[str, Any]] = []
    observer = cast(ILogObserver, events.append)
    globalLogPublisher.addObserver(observer)
    service.startService()
    try:
        await service.started
        service.manager.create()
        stopping = service.stopService()
        assert service.manager.draining and not stopping.called
        signal.raise_signal(signal.SIGTERM)
        await stopping
    finally:
        globalLogPublisher.removeObserver(observer)
    assert service.manager.sandboxes == {}
    said = [e.get("signal") for e in events if "during the drain" in str(e.get("log_format"))]
    assert said == ["SIGTERM"], "the second stop is said, naming the signal"
