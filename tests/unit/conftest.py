"""The unit tests build the daemon's real service tree in this process: a drain it starts
installs the second-signal handlers (``sandboxd.stop_signals``); put pytest's back after."""

import signal
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def stop_signal_handlers_restored() -> Iterator[None]:
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)
