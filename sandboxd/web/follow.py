"""Streams that follow something until it ends: a process's output, a workspace watch.

:class:`FollowStream` is the response's push producer: twisted.web pauses it when the client
reads slowly, and it pauses its source (a process :class:`~sandboxd.core.processes.process.
Reader` reads nothing more from the log meanwhile; the process runs on). A source that cannot
wait (a workspace watch) is fed through :class:`DropWhilePaused` instead. While nothing is
written for ``keepalive`` seconds it writes its keepalive frame (:attr:`FollowStream.
keepalive_frame`: the native API's ``{}``, a front's own in a subclass). :meth:`wait` fires
when the source says it ended, or when the client goes.
"""

from collections.abc import Callable

from attrs import define
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.web.iweb import IRequest
from zope.interface import implementer

from sandboxd.web.keepalive import Keepalive

KEEPALIVE_FRAME = b"{}\n"
"""The keepalive frame of a stream of NDJSON lines: an empty object (the native API's, see
docs/extensions.rst, "Background processes")."""


@implementer(IPushProducer)
class FollowStream:
    """Writes lines to ``request`` for a source that is paused and resumed."""

    keepalive_frame: bytes = KEEPALIVE_FRAME
    """What is written after ``keepalive`` seconds of silence (a front whose streams are
    framed otherwise sets its own, as the E2B front's Connect envelopes do)."""

    def __init__(
        self,
        request: IRequest,
        clock: IReactorTime,
        keepalive: float,
        pause: Callable[[], None] = lambda: None,
        resume: Callable[[], None] = lambda: None,
    ) -> None:
        self.request = request
        self.clock = clock
        self.keepalive = keepalive
        self.pause = pause
        self.resume = resume
        self.ended: Deferred[None] = Deferred()
        self._keepalive = Keepalive(clock, keepalive, self._send_keepalive)

    def start(self) -> None:
        """Register as the response's producer; the source starts (resumes) now."""
        self.request.registerProducer(self, True)  # type: ignore[attr-defined]
        self._schedule_keepalive()
        self.resume()

    def write(self, line: bytes) -> None:
        if line and not self.ended.called:
            self.request.write(line)
            self._schedule_keepalive()

    def end(self) -> None:
        """The source has ended: the response ends."""
        if not self.ended.called:
            self.ended.callback(None)

    async def wait(self) -> None:
        """Until the source ends; then (and when the client goes) the producer is let go."""
        try:
            await self.ended
        finally:
            self._keepalive.stop()
            if getattr(self.request, "channel", None) is not None:
                self.request.unregisterProducer()  # type: ignore[attr-defined]

    # IPushProducer

    def pauseProducing(self) -> None:
        self.pause()

    def resumeProducing(self) -> None:
        self.resume()

    def stopProducing(self) -> None:
        self.end()

    # Keepalive

    def _schedule_keepalive(self) -> None:
        self._keepalive.stop()
        if not self.ended.called:
            self._keepalive.restart()

    def _send_keepalive(self) -> None:
        self.write(self.keepalive_frame)


@define
class DropWhilePaused:
    """The feed of a source that cannot wait for a slow client (a workspace watch: changes
    happen when the sandbox makes them). While its stream is paused, :meth:`admits` refuses
    what comes; once the stream resumes, ``missed`` is called once in place of all of it (an
    ``overflow`` event, as inotify reports its own full queue). What the daemon holds for a
    client that never reads is the transport's buffer up to its pause, not every change."""

    missed: Callable[[], None]
    paused: bool = False
    _dropped: bool = False

    def admits(self) -> bool:
        """Whether a frame may be written now (else it is counted as missed)."""
        if self.paused:
            self._dropped = True
        return not self.paused

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        if self._dropped:
            self._dropped = False
            self.missed()
