"""The egress proxy's path for a connection whose name has a header rule
(docs/isolation.rst, "Header rules"): each request the sandbox sends is read, its head given
the rule's headers, then sent upstream; the answers go back untouched.

:class:`RequestRewriter` is the parser, with no I/O: it takes the sandbox's bytes as they
come and gives what goes upstream. A request's head (at most :data:`HEAD_MAX` bytes) is read
whole; the rule's headers replace any of the same name (case-insensitively) and are added
otherwise; its body follows as its framing says (``Content-Length`` bytes, or ``chunked``
chunks, checked size by size), passed on as it comes without being held; then the next
request of the kept-alive connection is read the same way. So every request gets the
headers, not only the first. Anything that could make the upstream read the requests
differently from the proxy is refused (:class:`Refused`, its reason counted): a ``Host``
other than the connection's name (no second host past the check), an absolute or CONNECT
target, ``Upgrade`` (the bytes after it would no longer be requests), both or several
``Content-Length`` and ``Transfer-Encoding``, a coding other than ``chunked`` or one in an
HTTP/1.0 request, folded or
malformed header lines, bare CR or LF, a head or chunk line too long.

:class:`RuleConnection` drives it on the reactor: both sockets stay Twisted's transports
(not spliced: the requests must cross the daemon's Python), each the producer of the other,
so a side that cannot keep up pauses the other being read (at most a transport's buffer and
one head are held per connection).
"""

import re
from collections.abc import Callable
from typing import Any

from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.internet.protocol import Protocol
from zope.interface import implementer

from sandboxd.isolation.network.egress_names import normal_name

HEAD_MAX = 65536
"""The longest request head (request line and headers), and the longest trailers."""

LINE_MAX = 4096
"""The longest chunk-size line."""

HEAD_TOO_LARGE = "head_too_large"
HOST_CHANGED = "host_changed"
MALFORMED = "malformed"
UPGRADE = "upgrade"

_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_CHUNK_SIZE = re.compile(rb"^([0-9A-Fa-f]{1,15})(;[^\r\n]*)?$")

HEAD, BODY, CHUNK_LINE, CHUNK_DATA, CHUNK_END, TRAILERS = range(6)


class Refused(Exception):
    """The sandbox sent what the proxy will not pass on; ``args[0]`` is the reason."""

    @property
    def reason(self) -> str:
        return str(self.args[0])


class RequestRewriter:
    """The requests of one connection to ``name``, given ``headers`` (see the module)."""

    def __init__(self, name: str, headers: tuple[tuple[str, str], ...]) -> None:
        self.name = name
        self.headers = b"".join(f"{n}: {v}\r\n".encode("latin-1") for n, v in headers)
        self.replaced = {n.lower().encode() for n, _ in headers}
        self.state = HEAD
        self.remaining = 0
        self.buffer = b""

    def feed(self, data: bytes) -> bytes:
        """What goes upstream for ``data``, the sandbox's next bytes; :class:`Refused`."""
        self.buffer += data
        out: list[bytes] = []
        while self.buffer:
            if self.state in (BODY, CHUNK_DATA):
                taken = self.buffer[: self.remaining]
                self.buffer = self.buffer[len(taken) :]
                self.remaining -= len(taken)
                out.append(taken)
                if not self.remaining:
                    self.state = HEAD if self.state == BODY else CHUNK_END
                continue
            if self.state == CHUNK_END:
                if len(self.buffer) < 2:
                    break
                if self.buffer[:2] != b"\r\n":
                    raise Refused(MALFORMED)
                out.append(b"\r\n")
                self.buffer = self.buffer[2:]
                self.state = CHUNK_LINE
                continue
            end = self.buffer.find(b"\r\n\r\n" if self.state == HEAD else b"\r\n")
            limit = LINE_MAX if self.state == CHUNK_LINE else HEAD_MAX
            if end < 0 or end > limit:
                if len(self.buffer) > limit or end > limit:
                    raise Refused(HEAD_TOO_LARGE if self.state == HEAD else MALFORMED)
                break
            if self.state == HEAD:
                out.append(self._head(self.buffer[:end]))
                self.buffer = self.buffer[end + 4 :]
            else:
                out.append(self._line(self.buffer[:end]))
                self.buffer = self.buffer[end + 2 :]
        return b"".join(out)

    def _line(self, line: bytes) -> bytes:
        """A chunk-size line, or a line of trailers, passed on."""
        if b"\r" in line or b"\n" in line or b"\0" in line:
            raise Refused(MALFORMED)
        if self.state == TRAILERS:
            self.remaining += len(line) + 2
            if self.remaining > HEAD_MAX:
                raise Refused(HEAD_TOO_LARGE)
            if not line:
                self.state, self.remaining = HEAD, 0
            return line + b"\r\n"
        found = _CHUNK_SIZE.match(line)
        if found is None:
            raise Refused(MALFORMED)
        self.remaining = int(found.group(1), 16)
        self.state = CHUNK_DATA if self.remaining else TRAILERS
        return line + b"\r\n"

    def _head(self, head: bytes) -> bytes:
        """A request's head, with the rule's headers, and its body's framing noted."""
        if b"\n" in head.replace(b"\r\n", b"") or b"\r" in head.replace(b"\r\n", b""):
            raise Refused(MALFORMED)
        if b"\0" in head:
            raise Refused(MALFORMED)
        request, *lines = head.split(b"\r\n")
        parts = request.split(b" ")
        if (
            len(parts) != 3
            or not _TOKEN.match(parts[0])
            or parts[2] not in (b"HTTP/1.0", b"HTTP/1.1")
            or not (parts[1].startswith(b"/") or (parts[1] == b"*" and parts[0] == b"OPTIONS"))
        ):
            raise Refused(MALFORMED)  # (an absolute or CONNECT target names another host)
        kept: list[bytes] = [request]
        hosts: list[bytes] = []
        lengths: set[bytes] = set()
        codings: list[bytes] = []
        for line in lines:
            name, colon, value = line.partition(b":")
            if not colon or not _TOKEN.match(name):
                raise Refused(MALFORMED)  # (a folded line starts with a space: no token)
            lower, value = name.lower(), value.strip(b" \t")
            if lower == b"host":
                hosts.append(value)
            elif lower == b"content-length":
                lengths.update(v.strip(b" \t") for v in value.split(b","))
            elif lower == b"transfer-encoding":
                codings.append(value.lower())
            elif lower == b"upgrade":
                raise Refused(UPGRADE)
            if lower not in self.replaced:
                kept.append(line)
        if len(hosts) != 1 or self._host(hosts[0]) != self.name:
            raise Refused(HOST_CHANGED)
        if codings and parts[2] == b"HTTP/1.0":  # (a coding a 1.0 server may not read)
            raise Refused(MALFORMED)
        self._framing(lengths, codings)
        return b"\r\n".join(kept) + b"\r\n" + self.headers + b"\r\n"

    @staticmethod
    def _host(value: bytes) -> str:
        text = value.decode("latin-1")
        if text.startswith("["):
            return ""
        try:
            return normal_name(text.rsplit(":", 1)[0] if ":" in text else text)
        except ValueError:
            return ""

    def _framing(self, lengths: set[bytes], codings: list[bytes]) -> None:
        if codings:
            if lengths or codings != [b"chunked"]:
                raise Refused(MALFORMED)
            self.state = CHUNK_LINE
            return
        if len(lengths) > 1 or not all(v.isdigit() and len(v) <= 18 for v in lengths):
            raise Refused(MALFORMED)
        self.remaining = int(lengths.pop()) if lengths else 0
        self.state = BODY if self.remaining else HEAD


class RuleConnection:
    """A sandbox's connection and its upstream, the sandbox's requests rewritten (see the
    module). ``sandbox`` is the sandbox's transport, ``upstream`` the upstream's (its
    protocol replaced by this connection's, or given to ``attach``: a TLS layer's,
    :mod:`.egress_tls`); ``on_refused(reason)`` is told once when the sandbox sent what is
    refused (both connections are reset then)."""

    def __init__(
        self,
        sandbox: Any,
        upstream: Any,
        rewriter: RequestRewriter,
        on_refused: Any,
        attach: Callable[[Protocol], None] | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.upstream = upstream
        self.rewriter = rewriter
        self.on_refused = on_refused
        self.attach = attach
        self.refused = False

    def start(self, peeked: bytes, sandbox_ended: bool, answered: bytes) -> None:
        """Send ``peeked`` (rewritten) upstream and ``answered`` to the sandbox, then let
        both sides flow, each pausing the other when it cannot keep up."""
        reader = UpstreamReader(self)
        if self.attach is None:
            self.upstream.protocol = reader
        else:
            self.attach(reader)
        reader.transport = self.upstream
        self.sandbox.registerProducer(self.upstream, True)
        self.upstream.registerProducer(self.sandbox, True)
        if answered:
            self.sandbox.write(answered)
        self.from_sandbox(peeked)
        if sandbox_ended:
            self.sandbox_ended()
        elif not self.refused:
            self.sandbox.resumeProducing()

    def from_sandbox(self, data: bytes) -> None:
        """The sandbox's bytes: rewritten and sent upstream, or the connection refused."""
        if self.refused:
            return
        try:
            out = self.rewriter.feed(data)
        except Refused as e:
            self.refused = True
            self.on_refused(e.reason)
            self.sandbox.abortConnection()
            self.upstream.abortConnection()
            return
        self.upstream.write(out)

    def sandbox_ended(self) -> None:
        """The sandbox said all it will: so does the upstream's end."""
        if not self.refused:
            self.upstream.loseWriteConnection()

    def sandbox_lost(self, reason: Any) -> None:
        """The sandbox's connection is gone: so goes the upstream's (reset when the
        sandbox's was, so that a cut request never looks whole)."""
        if clean(reason):  # (a TLS layer closes only once its producer is gone)
            self.upstream.unregisterProducer()
            self.upstream.loseConnection()
        else:
            self.upstream.abortConnection()


def clean(reason: Any) -> bool:
    """Whether a connection ended cleanly (``reason``: the Failure Twisted gives)."""
    return reason is None or reason.check(ConnectionDone) is not None


@implementer(IHalfCloseableProtocol)
class UpstreamReader(Protocol):
    """The upstream's side of a :class:`RuleConnection`: its bytes go to the sandbox."""

    def __init__(self, connection: RuleConnection) -> None:
        self.connection = connection

    def dataReceived(self, data: bytes) -> None:
        self.connection.sandbox.write(data)

    def readConnectionLost(self) -> None:
        self.connection.sandbox.loseWriteConnection()

    def writeConnectionLost(self) -> None:
        """Nothing to do: the sandbox's end was read to its end already."""

    def connectionLost(self, reason: Any = None) -> None:
        if clean(reason):
            self.connection.sandbox.unregisterProducer()
            self.connection.sandbox.loseConnection()
        else:  # a reset, an error: the sandbox sees one too, never a cut answer as whole
            self.connection.sandbox.abortConnection()
