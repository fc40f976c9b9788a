"""
A hostile fake sandboxd: a real Klein server whose every route does what a test scripts.

Requests are sorted into kinds (``"create"``, ``"kill"``, ``"GET exists"``, ``"POST exec"``…);
each kind has a queue of actions for successive hits and a default action. Actions stall
(before or after sending headers), die mid-stream, end cleanly too early, or answer garbage.
The server counts hits per kind and how many requests it currently holds open, so stall tests
can fire the client's deadlines (on a fake clock) only once a request has really arrived.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import deferLater
from twisted.web.server import Request

Action = Callable[["Hostile", Request], Any]


def kind_of(method: str, path: str) -> str:
    """The route kind of a request: create, list, kill, tools, health, or "METHOD leaf"."""
    parts = [p for p in path.split("/") if p]
    if parts == ["sandboxes"]:
        return "create" if method == "POST" else "list"
    if len(parts) == 2 and parts[0] == "sandboxes":
        return "kill" if method == "DELETE" else f"{method} sandbox"
    if parts[:1] == ["sandboxes"]:
        return f"{method} {parts[2]}"
    return "/".join(parts)


class Hostile:
    """The scripted server: ``script[kind]`` is consumed hit by hit, then ``default``."""

    def __init__(self, default: Action | None = None) -> None:
        self.app = Klein()
        self.hits: Counter[str] = Counter()
        self.holding = 0
        self.script: dict[str, list[Action]] = {}
        self.default: Action = default or respond(200, b"{}")
        self.bodies: list[bytes] = []

        @self.app.route("/", branch=True)
        def any_route(request: Request) -> Any:
            kind = kind_of(request.method.decode(), request.path.decode())
            self.hits[kind] += 1
            self.bodies.append(request.content.read())
            queue = self.script.get(kind)
            action = queue.pop(0) if queue else self.default
            return action(self, request)

    def on(self, kind: str, *actions: Action) -> Hostile:
        """Script the next hits of ``kind``."""
        self.script.setdefault(kind, []).extend(actions)
        return self

    def hold(self, request: Request) -> Deferred[None]:
        """Keep ``request`` open until the client gives up (counted in ``holding``)."""
        self.holding += 1

        def released(_: object) -> None:
            self.holding -= 1

        request.notifyFinish().addBoth(released)
        return Deferred()


def stall() -> Action:
    """Never send the response headers."""
    return lambda server, request: server.hold(request)


def stall_body(prefix: bytes, length: int | None = None) -> Action:
    """Send headers and ``prefix``, then nothing more."""

    def act(server: Hostile, request: Request) -> Deferred[None]:
        if length is not None:
            request.setHeader("Content-Length", str(length))
        request.write(prefix)
        return server.hold(request)

    return act


def respond(code: int, body: bytes, content_type: str = "application/json") -> Action:
    """Answer ``code`` with ``body``."""

    def act(server: Hostile, request: Request) -> bytes:
        request.setResponseCode(code)
        request.setHeader("Content-Type", content_type)
        return body

    return act


def error(code: int, etype: str, detail: str = "detail") -> Action:
    """A JSON error body of the wire contract."""
    return respond(code, json.dumps({"error": etype, "detail": detail}).encode())


def die_after(data: bytes, length: int | None = None) -> Action:
    """Send ``data`` then drop the connection (unsent bytes are flushed first)."""

    def act(server: Hostile, request: Request) -> Deferred[None]:
        if length is not None:
            request.setHeader("Content-Length", str(length))
        request.write(data)
        assert request.channel is not None
        request.channel.transport.loseConnection()  # type: ignore[union-attr]
        return Deferred()

    return act


def reset() -> Action:
    """Drop the connection without answering."""

    def act(server: Hostile, request: Request) -> Deferred[None]:
        assert request.channel is not None
        request.channel.transport.abortConnection()  # type: ignore[union-attr]
        return Deferred()

    return act


def trickle(data: bytes) -> Action:
    """Send ``data`` one byte per reactor turn, then finish: frames split at every byte."""

    async def act_async(request: Request) -> None:
        for i in range(len(data)):
            request.write(data[i : i + 1])
            await deferLater(reactor, 0, lambda: None)

    return lambda server, request: Deferred.fromCoroutine(act_async(request))


class _Garbage(Protocol):
    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(b"SSH-2.0-OpenSSH_9.6\r\nthis is not http\r\n\r\n")


def garbage_factory() -> Factory:
    """A TCP server that answers every connection with non-HTTP bytes."""
    return Factory.forProtocol(_Garbage)
