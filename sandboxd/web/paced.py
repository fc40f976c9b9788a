"""A response written a part at a time, as fast as the client takes it (large answers: walk).

:class:`PacedWriter` is the response's push producer: twisted.web pauses it when the client
reads slowly, and :meth:`PacedWriter.writable` then waits, so a large answer holds one part in
memory, not the whole answer.
"""

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.web.iweb import IRequest
from zope.interface import implementer


@implementer(IPushProducer)
class PacedWriter:
    """Writes parts to ``request``; :meth:`write` waits while the client is behind."""

    def __init__(self, request: IRequest) -> None:
        self.request = request
        self.stopped = False
        self._paused = False
        self._writers: list[Deferred[None]] = []
        request.registerProducer(self, True)  # type: ignore[attr-defined]

    async def write(self, part: bytes) -> None:
        """Write ``part``, then wait until the response takes more (or the client is gone)."""
        self.request.write(part)
        writer: Deferred[None] = Deferred()
        if self._paused and not self.stopped:
            self._writers.append(writer)
        else:
            writer.callback(None)
        await writer

    def close(self) -> None:
        """No more parts: stop being the response's producer."""
        if getattr(self.request, "channel", None) is not None:
            self.request.unregisterProducer()  # type: ignore[attr-defined]

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        self._release()

    def stopProducing(self) -> None:
        self.stopped = True
        self._release()

    def _release(self) -> None:
        writers, self._writers = self._writers, []
        for writer in writers:
            if not writer.called:
                writer.callback(None)
