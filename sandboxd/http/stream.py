"""The exec stream writer: the one place that writes an exec's NDJSON frames.

It turns the events of a running command (:class:`~sandboxd.core.exec.run.ExecRun`) into the
stream (docs/contract.rst, "The exec stream"): each output chunk as a live frame, a keepalive
frame while the command is silent, then the final frame (the exit, or an in-band error: the
status line is already sent). It is the response's push producer: when the client reads
slowly, twisted.web pauses it, and it pauses the command's reading and its own writing of the
final frame, in one place.
"""

from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from zope.interface import implementer

from sandboxd.core import STDERR, ExecRun
from sandboxd.http import wire
from sandboxd.web.keepalive import Keepalive

log = Logger()


@implementer(IPushProducer)
class ExecStream:
    """Writes one exec's frames to ``request``; keepalive frames every ``keepalive`` seconds
    of silence."""

    def __init__(
        self, request: IRequest, clock: IReactorTime, keepalive: float, split_stderr: bool = False
    ) -> None:
        self.request = request
        self.split_stderr = split_stderr
        """``split: true``: stderr chunks are ``{"e": …}`` frames (else ``{"o": …}`` as all)."""
        self.clock = clock
        self.keepalive = keepalive
        self.run: ExecRun | None = None
        self._paused = False
        self._writers: list[Deferred[None]] = []
        self._keepalive = Keepalive(clock, keepalive, self._send_keepalive)

    def output(self, fd: int, data: bytes) -> None:
        """A live output chunk of the command (stdout and stderr in arrival order)."""
        key = b"e" if self.split_stderr and fd == STDERR else b"o"
        self.request.write(wire.output_frame(data, key))
        if self._keepalive.pending:
            self._keepalive.restart()

    def attach(self, run: ExecRun) -> None:
        """Follow ``run``: the response's producer, keepalives until it ends."""
        self.run = run
        self.request.registerProducer(self, True)  # type: ignore[attr-defined]
        if not run.ended:
            self._keepalive.restart()
            run.when_finished().addCallback(lambda _: self._keepalive.stop())

    async def finish(self, rid: str) -> None:
        """Write the final frame once the run ends, a part at a time as the client takes it;
        then kill what is left of the command (client gone, or the stream failed)."""
        run = self.run
        assert run is not None
        request = self.request
        try:
            try:
                parts: Any = wire.final_frame_parts(await run.when_finished())
            except CancelledError:
                raise  # the client went away: finally kills the command
            except Exception as e:  # in band: the status line is already sent
                log.failure("exec in {rid} failed", Failure(), rid=rid)
                parts = [wire.in_band_error(e)]
            self._keepalive.stop()
            for part in parts:  # a megabyte at most, as it is taken
                request.write(part)
                await self.writable()
        finally:
            self._keepalive.stop()
            # Abort first: after a disconnect the request has no channel any more, and
            # unregisterProducer would raise before the command's process group is killed.
            run.abort()
            if getattr(request, "channel", None) is not None:
                request.unregisterProducer()  # type: ignore[attr-defined]

    # IPushProducer (the response's flow control)

    def pauseProducing(self) -> None:
        self._paused = True
        if self.run is not None:
            self.run.pause_reading()

    def resumeProducing(self) -> None:
        self._paused = False
        if self.run is not None:
            self.run.resume_reading()
        self._release_writers()

    def stopProducing(self) -> None:
        if self.run is not None:
            self.run.abort()
        self._release_writers()

    def writable(self) -> Deferred[None]:
        """A Deferred firing once the response takes more: at once, unless the client reads
        slowly (paused), then when it resumes or the response is stopped."""
        writer: Deferred[None] = Deferred()
        if self._paused:
            self._writers.append(writer)
        else:
            writer.callback(None)
        return writer

    def _release_writers(self) -> None:
        writers, self._writers = self._writers, []
        for writer in writers:
            if not writer.called:  # a cancelled one has been called
                writer.callback(None)

    # Keepalive

    def _send_keepalive(self) -> None:
        self.request.write(wire.KEEPALIVE_FRAME)
        self._keepalive.restart()
