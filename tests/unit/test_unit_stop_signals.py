"""The second SIGINT/SIGTERM (``sandboxd.stop_signals``): real signals, raised in this
process, reach the action through the reactor.

Every test puts this process's own SIGINT and SIGTERM handlers back when it ends.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import pytest

from sandboxd.stop_signals import STOP_SIGNALS, on_next_stop_signal


@pytest.fixture(autouse=True)
def own_handlers() -> Iterator[None]:
    saved = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


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
