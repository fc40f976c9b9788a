"""The egress proxy's relay: once a connection is allowed and its upstream connected, the
bytes of both ways go from socket to socket inside the kernel by ``splice(2)``, never through
the daemon's Python (docs/isolation.rst, "Egress by name").

Each way (sandbox to upstream, upstream to sandbox) has a pipe of its own: what its source
socket holds is spliced into the pipe, then from the pipe into its destination socket
(``SPLICE_F_MOVE | SPLICE_F_NONBLOCK``, the sockets non-blocking). The reactor drives it: a
way waits for its source to be readable while its pipe is empty, and for its destination to
be writable while its pipe holds bytes, never both, so a destination that cannot keep up
stops its source being read (its pipe, :data:`PIPE_SIZE` at most, is all a way ever holds:
flow control stays, nothing grows). A way whose source ends shuts its destination's writing
(``shutdown(SHUT_WR)``: a half-close passes); once both ways have ended both sockets close;
when either socket fails (a reset, an error) both are reset at once. Each turn of a way moves
at most :data:`BURST` bytes before the reactor does anything else, so one fast connection does
not hold it.
"""

import fcntl
import os
import socket
import struct
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from attrs import define, field
from twisted.internet.interfaces import IReadDescriptor, IWriteDescriptor
from twisted.logger import Logger
from zope.interface import implementer

log = Logger()

SPLICE_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK

PIPE_SIZE = 1 << 18
"""The room of each way's pipe (``F_SETPIPE_SZ``; 64 KiB by default): the most bytes a way
holds when its destination cannot take them, kernel memory charged to the daemon: a sandbox
at its cap of connections whose upstreams never read holds 2 x 256 x this. A larger pipe moves
more per wake-up of the daemon; 256 KiB keeps most of 1 MiB's throughput at a quarter of its
memory (docs/performance.rst, "Egress by name")."""

CHUNK = 1 << 20
"""The most bytes one splice from a socket asks for (the pipe's room bounds it first)."""

BURST = 1 << 20
"""The most bytes a way moves in one turn of the reactor."""

LINGER_RESET = struct.pack("ii", 1, 0)
"""``SO_LINGER`` on, for 0 s: a close then resets the connection."""


def take_socket(transport: Any) -> socket.socket:
    """The socket of a Twisted TCP transport, taken from it: the reactor no longer watches
    the transport, which keeps a closed socket object (it is never told its connection was
    lost, so it never shuts the connection down: its protocol is done with it). What the
    transport read before is its protocol's; it must have nothing left to write."""
    transport.stopReading()
    transport.stopWriting()
    return socket.socket(fileno=transport.getHandle().detach())


@implementer(IReadDescriptor, IWriteDescriptor)
class End:
    """One socket of a relay as the reactor sees it: readable, it moves the way it is the
    source of; writable, the way it is the destination of."""

    def __init__(self, relay: "Relay", sock: socket.socket) -> None:
        self.relay = relay
        self.sock = sock
        self.outgoing: Way | None = None
        self.incoming: Way | None = None

    def fileno(self) -> int:
        return self.sock.fileno()

    def doRead(self) -> None:
        assert self.outgoing is not None
        self.relay.pump(self.outgoing)

    def doWrite(self) -> None:
        assert self.incoming is not None
        self.relay.pump(self.incoming)

    def connectionLost(self, reason: Any) -> None:
        """The reactor saw the socket fail (or is stopping): the relay ends at once."""
        self.relay.abort()

    def logPrefix(self) -> str:
        return "egress relay"


@define(eq=False)
class Way:
    """One direction of a relay: from ``source`` through its pipe to ``destination``."""

    source: End
    destination: End
    pending: bytes
    """Bytes that go before any of the source's (the first bytes the proxy peeked)."""
    ended: bool
    """The source has said all it will (it may not be in the pipe yet)."""
    pipe_out: int
    pipe_in: int
    in_pipe: int = 0
    done: bool = False


@define(eq=False)
class Relay:
    """Two connected sockets spliced both ways (see the module); :meth:`start` them."""

    reactor: Any
    on_end: Callable[[], None]
    """Called once, when the relay ends (both sockets closed)."""
    ends: list[End] = field(factory=list)
    ways: list[Way] = field(factory=list)
    closed: bool = False

    @classmethod
    def start(
        cls,
        reactor: Any,
        sandbox: socket.socket,
        upstream: socket.socket,
        peeked: bytes,
        sandbox_ended: bool,
        on_end: Callable[[], None],
        answered: bytes = b"",
    ) -> "Relay":
        """Relay ``sandbox`` and ``upstream``: ``peeked`` goes upstream first, and when
        ``sandbox_ended`` (the sandbox's end was read already) nothing more follows it;
        ``answered`` (the upstream's bytes read already) goes to the sandbox first."""
        relay = cls(reactor, on_end)
        near, far = End(relay, sandbox), End(relay, upstream)
        relay.ends = [near, far]
        for source, destination in ((near, far), (far, near)):
            try:
                pipe_out, pipe_in = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as e:  # out of descriptors: reset, never left half made
                log.warn("egress relay: no pipe ({error}): connection reset", error=e.strerror)
                relay.abort()
                return relay
            with suppress(OSError):  # (past the user's pipe quota: the default's 64 KiB)
                fcntl.fcntl(pipe_in, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
            first, ended = (peeked, sandbox_ended) if source is near else (answered, False)
            way = Way(source, destination, first, ended, pipe_out, pipe_in)
            source.outgoing = destination.incoming = way
            relay.ways.append(way)
        for way in relay.ways:
            relay.pump(way)
        return relay

    def pump(self, way: Way) -> None:
        """Move what ``way`` can move now (at most :data:`BURST` bytes), then wait for what
        it needs next: its source readable (its pipe empty) or its destination writable."""
        if self.closed:  # (a reset by the other way, in the same turn of the reactor)
            return
        moved = 0
        try:
            while moved < BURST:
                if way.pending:
                    sent = way.destination.sock.send(way.pending)
                    way.pending = way.pending[sent:]
                    moved += sent
                elif way.in_pipe:
                    out = os.splice(
                        way.pipe_out, way.destination.fileno(), way.in_pipe, flags=SPLICE_FLAGS
                    )
                    way.in_pipe -= out
                    moved += out
                elif way.ended:
                    way.destination.sock.shutdown(socket.SHUT_WR)
                    self._finish(way)
                    return
                else:
                    got = os.splice(way.source.fileno(), way.pipe_in, CHUNK, flags=SPLICE_FLAGS)
                    way.ended = got == 0
                    way.in_pipe = got
                    moved += got
        except BlockingIOError:
            pass
        except OSError:  # a reset, a broken pipe: nothing more can pass either way
            self.abort()
            return
        self._wait(way)

    def _wait(self, way: Way) -> None:
        if way.pending or way.in_pipe:
            self.reactor.removeReader(way.source)
            self.reactor.addWriter(way.destination)
        else:
            self.reactor.removeWriter(way.destination)
            self.reactor.addReader(way.source)

    def _finish(self, way: Way) -> None:
        way.done = True
        self.reactor.removeReader(way.source)
        self.reactor.removeWriter(way.destination)
        if all(other.done for other in self.ways):
            self._close(reset=False)

    def abort(self) -> None:
        """End the relay now: both connections reset (their peers see ``ECONNRESET``)."""
        self._close(reset=True)

    def _close(self, reset: bool) -> None:
        if self.closed:
            return
        self.closed = True
        for end in self.ends:
            self.reactor.removeReader(end)
            self.reactor.removeWriter(end)
            if reset:
                end.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
            end.sock.close()
        for way in self.ways:
            os.close(way.pipe_out)
            os.close(way.pipe_in)
        self.on_end()
