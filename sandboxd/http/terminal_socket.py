"""A terminal's WebSocket (docs/extensions.rst, "Terminals"): the native front's interactive
attachment to a terminal, with ``autobahn``.

Binary messages both ways: from the client, the terminal's keyboard (its bytes typed as
they are); to the client, what the terminal prints, starting with what its scrollback still
holds (``?offset=N`` starts at byte N instead). Text messages from the client are small JSON
controls: ``{"resize": {"rows": R, "cols": C}}`` and ``{"signal": "INT"}`` (to the
terminal's foreground process group, as a key typed would). A message refused closes the
socket with ``4000`` plus the status a route would answer (``4400``, ``4409``). The last text
message to the client says how the terminal ended (``{"exit": CODE}``), then the socket
closes; closing the socket leaves the terminal running (attach again to read on).

Flow control: the socket's connection is the producer's consumer; while the client reads
slowly the terminal's reader is paused, and holds nothing: the terminal's output goes on
into its bounded scrollback (what falls out is skipped), so the daemon's memory stays flat
however much the terminal prints.
"""

import json
from typing import Any, cast

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.types import ConnectionRequest
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

from sandboxd.core import SIGNALS, Chunk, Dropped, Process, Reader, ReaderEvent, TerminalSize
from sandboxd.errors import BadRequest, SandboxdError
from sandboxd.http import wire
from sandboxd.http.socket_bearer import SUBPROTOCOL

CLOSE_NORMAL = 1000
CLOSE_REFUSED = 4000
"""Plus the HTTP status a route would answer: the close code of a refused message (4400 for
a bad control message, 4409 for input to a terminal that has ended)."""
CLOSE_WAIT = 60.0
"""Seconds a client has to read what is left and answer the close once the terminal ended."""
CONTROL_MAX = 4096
"""The longest text (control) message a client may send."""

log = Logger()


@implementer(IPushProducer)
class _ReaderFlow:
    """The terminal reader as the producer of the socket's connection."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    def pauseProducing(self) -> None:
        self.reader.pause()

    def resumeProducing(self) -> None:
        self.reader.resume()

    def stopProducing(self) -> None:
        self.reader.stop()


class TerminalSocket(WebSocketServerProtocol):
    """One client attached to one terminal."""

    factory: "TerminalSocketFactory"
    reader: Reader | None = None

    def onConnect(self, request: ConnectionRequest) -> str | None:
        """Accept the handshake (the route checked the token and found the terminal), with
        the subprotocol :data:`~sandboxd.http.socket_bearer.SUBPROTOCOL` when the client
        offers it (a browser's socket fails without one answered), never the token's."""
        return SUBPROTOCOL if SUBPROTOCOL in request.protocols else None

    def onOpen(self) -> None:
        process = self.factory.process
        self.reader = process.reader(self.factory.offset, True, self._deliver)
        transport: Any = self.transport
        # The web channel was the connection's producer until the upgrade: now the terminal is.
        transport.unregisterProducer()
        transport.registerProducer(_ReaderFlow(self.reader), True)
        self.reader.resume()

    def _deliver(self, event: ReaderEvent) -> None:
        if self.state != self.STATE_OPEN:
            # The client's close frame came first: autobahn sends nothing more, and would
            # raise (the core would log a failure and drop this reader; the terminal reads
            # on). What it prints meanwhile stays in its scrollback; the reader stops.
            cast(Reader, self.reader).stop()
            return
        if isinstance(event, Chunk):
            self.sendMessage(event.data, isBinary=True)
        elif not isinstance(event, Dropped):  # skipped output is simply not shown
            self.sendMessage(wire.terminal_end_message(event).encode(), isBinary=False)
            self.sendClose(CLOSE_NORMAL)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        process = self.factory.process
        try:
            if isBinary:
                process.write_stdin(payload)
            else:
                self._control(process, payload)
        except SandboxdError as e:
            self.sendClose(CLOSE_REFUSED + wire.status_and_type(e)[0], e.detail[:120])

    def _control(self, process: Process, payload: bytes) -> None:
        try:
            message = json.loads(payload[:CONTROL_MAX])
        except ValueError:
            message = None
        if isinstance(message, dict) and isinstance(message.get("resize"), dict):
            size = message["resize"]
            process.resize(TerminalSize.parse(size.get("rows"), size.get("cols")))
        elif isinstance(message, dict) and message.get("signal") in SIGNALS:
            process.signal_foreground(message["signal"])
        else:
            raise BadRequest('a control message is {"resize": {..}} or {"signal": NAME}')

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        # Not both ways by the suite: a handshake refused before the reader exists.
        if self.reader is not None:  # pragma: no branch
            self.reader.stop()


class TerminalSocketFactory(WebSocketServerFactory):
    """Makes the one :class:`TerminalSocket` of an upgraded request to ``process``."""

    protocol = TerminalSocket  # type: ignore[assignment]  # autobahn: a protocol class

    def __init__(self, process: Process, offset: int | None) -> None:
        super().__init__()
        # A slow client still reads the end: its connection is not cut (and what the daemon
        # holds for it lost) a second after the close is sent, as autobahn's default does.
        self.setProtocolOptions(closeHandshakeTimeout=CLOSE_WAIT)
        self.process = process
        self.offset = offset
