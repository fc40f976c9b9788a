"""The daemon's service tree at run time: recovery before listening, the drain before
stopping, and the exit status of a start-up that failed after the reactor started."""

import gc
import os
import sys
from collections.abc import Callable
from typing import Any

from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.logger import ILogObserver, Logger
from twisted.python.threadpool import ThreadPool

from sandboxd import notify
from sandboxd.core.manager import SandboxManager
from sandboxd.listen import CannotListen, Listeners
from sandboxd.reach import reach_hint
from sandboxd.undo import StartupUndo

log = Logger()

SWITCH_INTERVAL = 0.0005
"""Seconds a thread keeps the GIL once another asks for it (``sys.setswitchinterval``; CPython's
default is 5 ms), set when the daemon starts its thread pools. The reactor thread gives the GIL
up for each system call and asks for it back after; while a pool's thread runs Python code (a
walk, a spool's write loop), that wait is the reactor's, and every sandbox's request with it
(docs/performance.rst, "Neighbours and the GIL")."""


class ExitStatus:
    """The status the process exits with once twistd is done (0 unless start-up failed after
    the reactor started: a port taken once the predecessor's sandboxes were reclaimed)."""

    def __init__(self) -> None:
        self.code = 0
        self.message: str | None = None

    def apply(self) -> None:
        """At interpreter exit (registered first, so it runs after every other ``atexit``
        cleanup): exit with the status, if it is not 0."""
        if self.code:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.code)


class SandboxdService(MultiService):
    """The daemon: starting it reclaims the predecessor's sandboxes and only then listens (a
    sandbox left running may hold the port: it is killed first); a port that cannot be had then
    stops the daemon with a non-zero status, naming the address.

    Once it listens, what start-up made (the imports, the service tree: tens of thousands of
    objects) is frozen out of the garbage collector's passes (``gc.freeze``): each full pass,
    a stall of the reactor, then walks only what was made since (docs/performance.rst,
    "The garbage collector"). Before its thread pools start, the GIL's switch interval is
    shortened to :data:`SWITCH_INTERVAL`, and set back once they stop.

    Stopping it drains first (the HTTP endpoint keeps serving existing sandboxes until every
    command ended or the drain deadline passed), then stops the endpoint. ``POST /drain`` runs
    the same drain and then stops the reactor: the daemon exits.
    """

    def __init__(
        self,
        manager: SandboxManager,
        pools: list[ThreadPool],
        reactor: Any,
        log_observer: Any = None,
        on_stop_signal: Callable[[Any, Callable[[str], None]], None] = lambda reactor, act: None,
        *,
        listeners: Listeners | None = None,
        more_listeners: list[Listeners] | None = None,
        listen: str = "",
        streams_written: Callable[[], Deferred[Any]] = lambda: succeed(None),
        exit_status: ExitStatus | None = None,
        undo: StartupUndo | None = None,
    ) -> None:
        super().__init__()
        self.on_stop_signal = on_stop_signal
        """Installs what the next SIGINT/SIGTERM does once a drain has begun (``twistd``:
        :func:`sandboxd.stop_signals.on_next_stop_signal`)."""
        self.manager = manager
        self.pools = pools
        self.switch_before = sys.getswitchinterval()
        """The GIL's switch interval before :meth:`startService`, set back once the pools stop."""
        self.reactor = reactor
        self.log_observer = log_observer
        self.listen = listen
        """The endpoint string the HTTP service listens on (for the line saying where)."""
        self.streams_written = streams_written
        """Fires once the open exec streams have written their last frames (the front's)."""
        self.listeners = listeners
        self.more_listeners = [] if more_listeners is None else more_listeners
        """Other fronts' listeners (the E2B front's): listened on after :attr:`listeners`."""
        self.exit_status = ExitStatus() if exit_status is None else exit_status
        self.undo = StartupUndo() if undo is None else undo
        """What start-up made on the host, removed if the daemon cannot listen (forgotten once
        it listens: the drain cleans up from then on)."""
        self.started: Deferred[None] = Deferred()
        """Fires once listening (or start-up failed after the reactor started)."""

    def setServiceParent(self, parent: Any) -> None:
        """Under twistd, the parent is the application: give it our log observer, if any."""
        if self.log_observer is not None and hasattr(parent, "setComponent"):
            parent.setComponent(ILogObserver, self.log_observer)
        super().setServiceParent(parent)

    def startService(self) -> None:
        self.switch_before = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL)
        for pool in self.pools:
            pool.start()
        super().startService()
        recovered = self.manager.start()
        recovered.addErrback(lambda f: log.failure("recovery failed", f))
        recovered.addCallback(lambda _: Deferred.fromCoroutine(self._listen()))
        recovered.addBoth(lambda _: self.started.callback(None))
        if self.exit_status.message is not None and not self.reactor.running:
            # No leftovers: all of that ran before the reactor, and twistd exits at once
            # (without stopService): what start-up made goes now.
            self._undo_start()
            raise SystemExit(f"sandboxd: {self.exit_status.message}")

    async def _listen(self) -> None:
        assert self.listeners is not None, "the composition root gives the listeners"
        try:
            addresses = await self.listeners.listen()
            for more in self.more_listeners:
                extra = await more.listen()
                log.info("also listening on {addresses}", addresses=" ".join(extra))
        except CannotListen as e:
            message = f"start-up failed at listen: {e}"
            log.critical(message)
            notify.notify(f"STATUS={message}")
            self.exit_status.code, self.exit_status.message = 1, message
            if self.reactor.running:
                self.reactor.stop()
            return
        self.undo.forget()
        log.info("listening on {addresses}", addresses=" ".join(addresses))
        port = getattr(self.listeners.ports[0].getHost(), "port", None)
        log.info("{hint}", hint=reach_hint(self.listen, port))
        gc.freeze()
        log.info("sandboxd ready")
        notify.notify("READY=1\nSTATUS=listening")  # systemd Type=notify

    def drain_and_exit(self) -> None:
        """Drain (``POST /drain``), then stop the reactor."""
        notify.stopping()
        self.on_stop_signal(self.reactor, self.stop_now)
        drained = self.manager.drain().addCallback(lambda _: self.streams_written())
        drained.addCallback(lambda _: self.reactor.stop())

    def stopService(self) -> Deferred[Any]:
        log.info("stopping: draining first (a second SIGINT/SIGTERM stops at once)")
        notify.stopping()
        self.on_stop_signal(self.reactor, self.stop_now)
        drained = self.manager.drain().addCallback(lambda _: self.streams_written())

        def stop_children(_: object) -> Deferred[Any]:
            return maybeDeferred(MultiService.stopService, self)

        def stop_pools(result: object) -> object:
            self._undo_start()
            return result

        return drained.addCallback(stop_children).addBoth(stop_pools)

    def _undo_start(self) -> None:
        """Undo what :meth:`startService` did outside the children: stop the pools, set the
        switch interval back, and remove what start-up made on the host if it failed at
        listen (once listening, :attr:`undo` is forgotten: the drain cleans up)."""
        for pool in self.pools:
            pool.stop()
        sys.setswitchinterval(self.switch_before)
        self.undo.run()

    def stop_now(self, signal_name: str) -> None:
        """A second stop signal during a drain: kill every sandbox now, then exit."""
        log.warn(
            "{signal} during the drain: stopping at once ({count} sandboxes killed)",
            signal=signal_name,
            count=len(self.manager.sandboxes),
        )
        self.manager.stop_now()  # the drain ends, and with it the daemon
