"""The second SIGINT/SIGTERM: once a stop has begun, the next one stops at once.

twistd's own handlers only ask the reactor to stop, which a stopping reactor refuses
(``ReactorNotRunning``, logged as critical) while the drain goes on waiting. Once a drain has
begun, :func:`on_next_stop_signal` replaces them: the next SIGINT or SIGTERM runs the given
action in the reactor's thread (the way Twisted's handlers call ``stop``).
"""

import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def on_next_stop_signal(reactor: Any, action: Callable[[str], None]) -> None:
    """From now on, SIGINT and SIGTERM run ``action(signal_name)`` through
    ``reactor.callFromThread``. Only the main thread may set signal handlers."""

    def handler(signum: int, frame: FrameType | None) -> None:
        reactor.callFromThread(action, signal.Signals(signum).name)

    for number in STOP_SIGNALS:
        signal.signal(number, handler)
