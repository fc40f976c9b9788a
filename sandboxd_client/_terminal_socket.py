"""The WebSocket client of a terminal (``autobahn``): imported only when a client attaches
(``Terminals.attach_terminal``), so the client installs and runs without it otherwise."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from autobahn.twisted.websocket import (
    WebSocketClientFactory,
    WebSocketClientProtocol,
    connectWS,
)

from ._terminals import TerminalConnection

__all__ = ["TerminalFactory", "connectWS"]


class TerminalClient(WebSocketClientProtocol):
    factory: TerminalFactory

    def onOpen(self) -> None:
        self.factory.connection._opened(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        if isBinary:
            self.factory.on_output(payload)
            return
        try:
            message = json.loads(payload)
        except ValueError:  # not from a daemon, which sends JSON controls only
            return
        # An error end ({"error": ..}, a sandbox killed) is followed by the close: ended None
        if isinstance(message, dict) and isinstance(message.get("exit"), int):
            self.factory.connection._end(message["exit"])

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.factory.connection._end(None)


class TerminalFactory(WebSocketClientFactory):
    protocol = TerminalClient  # type: ignore[assignment]  # autobahn: a protocol class

    def __init__(
        self, url: str, headers: dict[str, str], on_output: Callable[[bytes], object]
    ) -> None:
        super().__init__(url, headers=headers)
        self.setProtocolOptions(autoPingInterval=None)
        self.on_output = on_output
        self.connection = TerminalConnection()

    def clientConnectionFailed(self, connector: Any, reason: Any) -> None:
        # A connection that failed never opened: nothing can have ended it before.
        if not self.connection.ended.called:  # pragma: no branch
            self.connection.ended.errback(reason)
