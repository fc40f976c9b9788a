"""The twisted.web site: its channel (malformed requests answered in JSON, the connection
gate's defences), its request (:class:`~sandboxd.web.request.LimitedRequest`: bodies over the
configured limit refused), and where it stores request bodies.

Bodies of :data:`SPOOL_MIN` bytes or more are stored in a :class:`~sandboxd.web.spool.Spool`
(an unnamed file on the workspaces' own filesystem), written in a thread pool when the site
has one (:class:`~sandboxd.web.spool.SpoolThreads`); the request is handled once every byte
is written.
"""

import io
import tempfile
from typing import Any

from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource
from twisted.web.server import Site
from zope.interface import implementer

from sandboxd import _twisted
from sandboxd.web import answers
from sandboxd.web.body_pace import BodyMeter, BodyPace, ReadHolds
from sandboxd.web.guard import Admission, Admit, ConnectionGate, Refusal
from sandboxd.web.request import LimitedRequest as LimitedRequest
from sandboxd.web.request import _Discard as _Discard
from sandboxd.web.spool import SPOOL_MIN as SPOOL_MIN
from sandboxd.web.spool import Spool as Spool
from sandboxd.web.spool import SpoolPlaces, SpoolThreads
from sandboxd.web.spool import can_spool as can_spool

READ_SIZE = 1 << 20
"""Bytes a connection reads from its socket at a time (Twisted's default is 64 KiB; see
docs/performance.rst)."""

SEND_SIZE = 2 << 20
"""Bytes a connection hands the kernel per ``send()`` at most (Twisted's default is 128 KiB,
each a turn of the reactor): several whole exec output frames (a pipe's worth each, in
base64) or a megabyte of a download at once. Only a cap, never a buffer."""


LINGER = 2.0
"""Seconds a refused connection keeps reading (and dropping) what its peer still sends after
the ``401``, so that the peer reads the answer instead of a reset (RFC 9112 §9.6)."""

LINGER_BYTES = 4 << 20
"""Bytes a refused connection drops at most before it is closed outright."""

FLUSH_TIMEOUT = 5.0
"""Seconds a stopping daemon waits for a client to take what was written to it."""

PACE = "pace"
"""The reason a connection's reading is held while its body is ahead of its pace."""


class Channel(_twisted.BadRequestChannel):
    """An HTTP channel that answers an over-long request line or header line with a JSON
    ``400`` before closing, instead of dropping the connection without a word (a client takes
    a dropped connection for a dead replica: ``SandboxNotFound``).

    With a :class:`~sandboxd.web.guard.ConnectionGate` on its site, it also defends the
    daemon (docs/operating.rst, "Connections"): it is counted by the gate (and may be refused
    or evicted by it); its header section must be complete within the header timeout of its opening
    (within the idle timeout of its previous answer, between requests), however slowly its
    bytes come; and a request that lacks the token is answered ``401`` as soon as its headers
    are in, paced per peer, before one byte of its body is read into a request (what the peer
    still sends is dropped for :data:`LINGER` seconds, then the connection closed).

    It reads up to :data:`READ_SIZE` and sends up to :data:`SEND_SIZE` bytes at a time on a
    TCP or UNIX socket. With a :class:`~sandboxd.web.body_pace.BodyPace` on its site, its
    request bodies are paced while other connections' requests come in; the reasons its
    reading is paused (the pace, the spool's back-pressure) are held in one
    :class:`~sandboxd.web.body_pace.ReadHolds`.
    """

    site: Any = None
    closed: Deferred[None] | None = None
    """Fires once the connection is closed (``None`` until it is made)."""
    _deadline: IDelayedCall | None = None
    _refused = False
    _refused_path = b""
    _verdict = Admission.REFUSED
    _refused_headers: Any = None
    _dropped = 0
    _holds: ReadHolds | None = None
    _meter: BodyMeter | None = None
    _pace_call: IDelayedCall | None = None

    @property
    def gate(self) -> ConnectionGate | None:
        """The site's connection gate (``None``: no defences)."""
        return getattr(self.site, "gate", None)

    def connectionMade(self) -> None:
        self.closed = Deferred()
        self.site.channels.add(self)  # a SpoolingSite's (make_site)
        super().connectionMade()
        _twisted.set_socket_sizes(self.transport, READ_SIZE, SEND_SIZE)
        self._holds = ReadHolds(self.transport)
        pace: BodyPace | None = getattr(self.site, "pace", None)
        if pace is not None:
            self._meter = pace.meter(self)
        gate = self.gate
        if gate is None:
            return
        if not gate.opened(self):
            self._abort()
            return
        self._arm(gate.limits.header_timeout)

    def _arm(self, seconds: float | None) -> None:
        self._disarm()
        gate = self.gate
        if seconds is not None and gate is not None:
            self._deadline = gate.clock.callLater(seconds, self._headers_late)

    def _disarm(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        gate = self.gate
        assert gate is not None, "armed only with a gate"
        gate.late.event(f"closed a connection from {self._peer()} whose headers were late")
        self._abort()

    def evict(self) -> None:
        """Close the connection now (the gate needs its slot)."""
        self._abort()

    def _abort(self) -> None:
        self._disarm()
        transport: Any = self.transport  # made: every caller runs once connected
        transport.abortConnection()

    def close_when_flushed(self, clock: IReactorTime, seconds: float) -> Deferred[None]:
        """Close the connection once what was written to it is sent (a stopping daemon's last
        answers are not cut off); a peer that has not taken it within ``seconds`` is cut off.
        Fires once closed."""
        closed = self.closed
        if closed is None or closed.called or self.transport is None:
            return succeed(None)
        closed.addTimeout(seconds, clock, onTimeoutCancel=lambda _, __: self._abort())
        self.transport.loseConnection()
        return closed

    def _peer(self) -> str:
        peer = self.transport.getPeer() if self.transport is not None else None
        return str(getattr(peer, "host", "local"))

    def allHeadersReceived(self) -> None:
        self._disarm()
        gate = self.gate
        if gate is not None:
            gate.busy(self)
        admit = getattr(self.site, "admit", None)
        if gate is None or admit is None:
            self._began()
            super().allHeadersReceived()
            return
        request = self.requests[-1]
        _, path = _twisted.request_line(self)
        authorization = request.requestHeaders.getRawHeaders(b"authorization", [None])[0]
        verdict = admit(path, authorization, request.requestHeaders)
        self._refused_path = path
        if verdict is Admission.TRUSTED:
            gate.trust(self)
        if verdict not in (Admission.REFUSED, Admission.ABSENT):
            self._began()
            super().allHeadersReceived()
            return
        self._verdict = verdict
        self._refused_headers = request.requestHeaders
        self._refuse_unauthorized(gate)

    def _refuse_unauthorized(self, gate: ConnectionGate) -> None:
        self._refused = True
        self.length = None  # the channel goes on to the body: dropped (rawDataReceived)
        transport: Any = self.transport
        transport.pauseProducing()  # nothing more is read while the answer waits
        peer = self._peer()
        wait = gate.pace.wait(peer)
        if wait is None:
            gate.unauthorized.event(f"dropped one from {peer}: too many refused at once")
            self._abort()
            return
        gate.unauthorized.event(f"refused one from {peer}")
        if wait:  # the deadline's call: cancelled if the peer goes first
            self._deadline = gate.clock.callLater(wait, self._answer_unauthorized)
        else:
            self._answer_unauthorized()

    def _answer_unauthorized(self) -> None:
        self._deadline = None
        transport: Any = self.transport
        refusal: Refusal | None = getattr(self.site, "refusal", None)
        if refusal is None:
            answer = answers.unauthorized_answer()
        else:
            answer = refusal(self._refused_path, self._verdict, self._refused_headers)
        transport.write(answer)
        transport.loseWriteConnection()
        transport.resumeProducing()
        gate = self.gate
        assert gate is not None
        self._deadline = gate.clock.callLater(LINGER, self._abort)

    def _began(self) -> None:
        """An admitted request began: the others' bodies are paced for a while."""
        if self._meter is not None:
            self._meter.pace.began(self)

    def hold(self, reason: str) -> None:
        """Stop reading for ``reason`` until :meth:`release`."""
        assert self._holds is not None, "connected"
        self._holds.hold(reason)

    def release(self, reason: str) -> None:
        """``reason`` no longer stops the reading."""
        assert self._holds is not None, "connected"
        self._holds.release(reason)

    def _paced(self) -> None:
        """The body's pause for its pace is over, or extended by what was read meanwhile."""
        meter = self._meter
        assert meter is not None, "armed only with a meter"
        owed = meter.owed()
        if owed > 0:
            self._pace_call = meter.pace.clock.callLater(owed, self._paced)
            return
        self._pace_call = None
        self.release(PACE)

    def allContentReceived(self) -> None:
        # The body is in: no more pace. twisted.web resumes the reading once it has answered.
        self._cancel_pace()
        assert self._holds is not None, "connected"
        self._holds.forget(PACE)
        super().allContentReceived()

    def _cancel_pace(self) -> None:
        if self._pace_call is not None and self._pace_call.active():
            self._pace_call.cancel()
        self._pace_call = None

    def rawDataReceived(self, data: bytes) -> None:
        if not self._refused:
            meter = self._meter
            owed = 0.0 if meter is None else meter.received(len(data))
            if owed > 0 and self._pace_call is None:
                assert meter is not None
                self.hold(PACE)
                self._pace_call = meter.pace.clock.callLater(owed, self._paced)
            super().rawDataReceived(data)
            return
        self._dropped += len(data)
        if self._dropped > LINGER_BYTES:
            self._abort()

    def requestDone(self, request: Any) -> None:
        gate = self.gate
        if gate is not None and self.persistent:
            gate.waiting(self)  # before the next request, maybe buffered, is parsed
            self._arm(gate.limits.idle_timeout)
        super().requestDone(request)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._disarm()
        self._cancel_pace()
        self.site.channels.discard(self)
        if self.closed is not None and not self.closed.called:
            self.closed.callback(None)
        gate = self.gate
        if gate is not None:
            gate.closed(self)
        super().connectionLost(reason)

    def lineLengthExceeded(self, line: bytes) -> None:
        self._refuse(f"a request or header line is over {self.MAX_LENGTH} bytes")

    def bad_request(self) -> None:
        """twisted.web's answer to a malformed request (bad request line, headers too many
        or too large, bad length or chunking): the same, with a JSON body."""
        self._refuse("malformed HTTP request")

    def _refuse(self, detail: str) -> None:
        body = answers.bad_request_body(detail)
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        self.loseConnection()


@implementer(IResource)
class Utf8URLs:
    """The API's resource, behind a check that the URL is UTF-8: Klein would answer anything
    else with a ``text/html`` ``400``; this gives the contract's JSON ``400 BadRequest``."""

    isLeaf = True

    def __init__(self, inner: IResource) -> None:
        self.inner = inner

    def getChildWithDefault(self, name: bytes, request: IRequest) -> IResource:
        return self  # a leaf: never called by twisted.web

    def putChild(self, path: bytes, child: IResource) -> None:
        raise NotImplementedError("a leaf resource has no children")

    def render(self, request: IRequest) -> Any:
        try:
            request.getRequestHostname().decode("utf-8")
            for segment in (*request.prepath, *request.postpath):
                segment.decode("utf-8")
        except UnicodeDecodeError:
            request.setResponseCode(400)
            request.setHeader(b"content-type", answers.JSON)
            return answers.bad_request_body("the URL is not UTF-8")
        return self.inner.render(request)


class SpoolingSite(Site):
    """A site that stores request bodies of :data:`SPOOL_MIN` bytes or more (or of unknown
    length) in a :class:`Spool` of ``spool_dir``; with no ``spool_dir``, where twisted.web
    does (a temporary file in the system's temporary directory)."""

    spool_dir: str | None = None
    spool_threads: SpoolThreads | None = None
    """Where spooled bodies are written (``None``: on the reactor thread, as they arrive)."""
    spool_place: SpoolPlaces | None = None
    """The place of the sandbox a request names, where its body is spooled instead of
    ``spool_dir`` (see :mod:`sandboxd.web.request`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.channels: set[Channel] = set()
        """Its connections open now."""

    def close_connections(
        self, clock: IReactorTime, seconds: float = FLUSH_TIMEOUT
    ) -> Deferred[Any]:
        """Close every connection once what was written to it is sent (see
        :meth:`Channel.close_when_flushed`); fires once all are closed."""
        return DeferredList([c.close_when_flushed(clock, seconds) for c in list(self.channels)])

    def getContentFile(self, length: int | None) -> Any:
        """The file a request's body is written to (twisted.web's hook, called per request)."""
        if length is not None and length < SPOOL_MIN:
            return io.BytesIO()
        if self.spool_dir is None:
            return tempfile.TemporaryFile()
        return Spool(self.spool_dir)


def make_site(
    resource: IResource,
    max_body: int,
    spool_dir: str | None = None,
    *,
    gate: ConnectionGate | None = None,
    admit: Admit | None = None,
    refusal: Refusal | None = None,
    spool_threads: SpoolThreads | None = None,
    spool_place: SpoolPlaces | None = None,
    pace: BodyPace | None = None,
) -> SpoolingSite:
    """A site whose requests refuse bodies over ``max_body`` bytes, store large bodies in
    ``spool_dir`` (see :class:`SpoolingSite`), and whose malformed requests get JSON errors.

    With a ``gate`` and an ``admit`` rule, its connections defend the daemon (see
    :class:`Channel`); the gate's idle timeout also bounds the silence within a request body.
    ``refusal`` makes the whole answer to a request refused or found absent at its headers
    (each front passes its own; default: :func:`sandboxd.web.answers.unauthorized_answer`).
    With ``spool_threads``, spooled bodies are written in its threads; with ``spool_place``,
    those of a request naming a sandbox in that sandbox's place. With ``pace``, request bodies
    are paced while other connections' requests come in (:class:`Channel`).
    """
    request_class = type("SandboxdRequest", (LimitedRequest,), {"max_body": max_body})
    # No route takes an HTML form: twisted.web would parse each POST's content type with the
    # email package (see docs/performance.rst), and read a multipart body whole into memory.
    clock: dict[str, Any] = {} if gate is None else {"reactor": gate.clock}
    site = SpoolingSite(
        Utf8URLs(resource), requestFactory=request_class, parsePOSTFormSubmission=False, **clock
    )
    site.spool_dir = spool_dir
    site.spool_threads = spool_threads
    site.spool_place = spool_place
    site.pace = pace  # type: ignore[attr-defined]
    site.gate = gate  # type: ignore[attr-defined]
    site.admit = admit  # type: ignore[attr-defined]
    site.refusal = refusal  # type: ignore[attr-defined]
    if gate is not None:
        site.timeOut = gate.limits.idle_timeout
    site.protocol = Channel  # type: ignore[assignment]
    site.displayTracebacks = False
    return site
