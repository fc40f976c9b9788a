"""
Twisted's reactor on a thread of its own, awaited from the asyncio loop the MCP SDK runs on.

The MCP SDK owns its event loop (``anyio.run`` in ``MCPServer.run``, uvicorn for streamable
HTTP); ``HttpSandbox`` runs on Twisted. Rather than installing Twisted's asyncio reactor into
a loop the SDK creates and stops (the reactor must be installed before anything imports it,
started inside that loop and stopped before it closes), the reactor runs unchanged on one
thread and the loop on another, and they meet only here: every call into the client is
scheduled on the reactor thread with ``callFromThread``, and every result, failure or output
chunk comes back to the loop with ``call_soon_threadsafe``. Neither side ever blocks the
other, and cancelling the awaiting task cancels the Deferred (an exec is then dropped, and
the host kills the command).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.python.failure import Failure

P = ParamSpec("P")
T = TypeVar("T")

STOP_WAIT = 30.0
"""Seconds ``stop`` waits for the reactor thread to end (its shutdown closes connections)."""


class ReactorThread:
    """Runs ``reactor`` on a daemon thread between ``start()`` and ``stop()``."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self._running = threading.Event()
        self._failed: Exception | None = None
        self._thread = threading.Thread(target=self._run, name="twisted-reactor", daemon=True)

    def _run(self) -> None:
        self.reactor.callWhenRunning(self._running.set)
        try:
            self.reactor.run(installSignalHandlers=False)
        except Exception as e:  # told to start(), which is waiting for the reactor
            self._failed = e
        finally:
            self._running.set()

    def start(self) -> None:
        """Start the reactor thread; return once the reactor runs (``RuntimeError`` if it
        already runs elsewhere, or could not be started)."""
        if self.reactor.running:
            raise RuntimeError("the reactor already runs: sandboxctl mcp needs one of its own")
        self._thread.start()
        self._running.wait()
        if not self.reactor.running:
            raise RuntimeError("the reactor could not be started") from self._failed

    def stop(self) -> None:
        """Stop the reactor (from any thread but its own) and wait for its thread to end."""
        if self._thread.is_alive():
            self.reactor.callFromThread(self.reactor.stop)
            self._thread.join(STOP_WAIT)

    def blocking(self, fn: Callable[P, Deferred[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Call ``fn`` on the reactor thread and wait for its Deferred (from another thread)."""
        from twisted.internet.threads import blockingCallFromThread

        result: T = blockingCallFromThread(self.reactor, fn, *args, **kwargs)  # type: ignore[arg-type]
        return result

    async def call(self, fn: Callable[P, Deferred[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """
        Call ``fn(*args, **kwargs)`` on the reactor thread and await its Deferred's result.

        Its failure is raised here as the exception it carries. Cancelling the awaiting task
        cancels the Deferred.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        started: list[Deferred[T]] = []

        def settle(outcome: T | Failure) -> None:
            if future.done():  # the awaiting task was cancelled meanwhile
                return
            if isinstance(outcome, Failure):
                future.set_exception(outcome.value or Exception(outcome.getErrorMessage()))
            else:
                future.set_result(outcome)

        def back(outcome: T | Failure) -> None:
            loop.call_soon_threadsafe(settle, outcome)

        def begin() -> None:
            d = maybeDeferred(fn, *args, **kwargs)
            started.append(d)
            d.addBoth(back)

        def cancel() -> None:
            # After begin: callFromThread runs its calls in the order they were made.
            started[0].cancel()

        self.reactor.callFromThread(begin)
        try:
            return await future
        except asyncio.CancelledError:
            self.reactor.callFromThread(cancel)
            raise

    def to_loop(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[[T], object]
    ) -> Callable[[T], None]:
        """A callback for the reactor thread that runs ``fn(value)`` on ``loop``, in order."""

        def forward(value: T) -> None:
            loop.call_soon_threadsafe(fn, value)

        return forward
