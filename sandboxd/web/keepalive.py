"""The keepalive timer of a long answer: both fronts' streams (an exec's,
:class:`sandboxd.http.stream.ExecStream`; a followed one, :class:`sandboxd.web.follow.
FollowStream`) send a frame of their own after some seconds of silence, so that proxies and
clients see the connection alive."""

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime


class Keepalive:
    """Calls ``send`` once ``interval`` seconds pass after the last :meth:`restart`, on
    ``clock``; :meth:`stop` cancels the call pending. ``send`` writes the stream's keepalive
    frame (and, as a write does, restarts the timer where silence is to be timed again)."""

    def __init__(self, clock: IReactorTime, interval: float, send: Callable[[], None]) -> None:
        self.clock = clock
        self.interval = interval
        self.send = send
        self._call: IDelayedCall | None = None

    @property
    def pending(self) -> bool:
        """Whether a send is scheduled (started, not stopped nor fired since)."""
        return self._call is not None

    def restart(self) -> None:
        """Time the silence from now: a send ``interval`` seconds from now, none before."""
        self.stop()
        self._call = self.clock.callLater(self.interval, self._fire)

    def stop(self) -> None:
        """No send until the next :meth:`restart`."""
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()

    def _fire(self) -> None:
        self._call = None
        self.send()
