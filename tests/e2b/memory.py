"""The E2B front in memory: the real Klein app of :func:`make_front` over ``StubTreq``, on the
in-memory HTTP harness's manager (file work synchronous, processes real, timers on a
``Clock``).

No site and no header gate stand in front of it: this is the front as it serves with
``SANDBOXD_AUTH_GATE=off``, where its own checks of the key and the access token are all
there is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import treq
from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from sandboxd.assemble import in_process
from sandboxd.config import Config
from sandboxd.core.manager import SandboxManager
from sandboxd.e2b import wire
from sandboxd.e2b.api import E2BFront
from sandboxd.e2b.registry import E2BSandbox
from sandboxd.isolation.exec.helper import HELPER, helper_problem
from sandboxd.isolation.none import no_isolation
from tests.http.http_harness import ProcessReactor, Reply, SyncFiles, SyncPool, pump, result_of

KEY = "e2b-key"
SETTINGS = {
    "isolation": "none",
    "uid-min": "1000",
    "uid-max": "1009",
    "keepalive": "5s",
    "exec-timeout": "10m",
}


class WatchingReactor(ProcessReactor):
    """Processes, and the inotify descriptors of watches, on the real reactor."""

    def addReader(self, reader: Any) -> None:
        from twisted.internet import reactor

        reactor.addReader(reader)

    def removeReader(self, reader: Any) -> None:
        from twisted.internet import reactor

        reactor.removeReader(reader)


def read_frames(raw: bytes) -> list[tuple[int, dict[str, Any]]]:
    """``(flags, message)`` of each envelope of a Connect stream's body."""
    frames, offset = [], 0
    while offset < len(raw):
        flags, length = wire.HEADER.unpack_from(raw, offset)
        offset += wire.HEADER.size
        frames.append((flags, json.loads(raw[offset : offset + length])))
        offset += length
    return frames


class _Body(Protocol):
    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def dataReceived(self, data: bytes) -> None:
        self.stream.raw.extend(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.stream.done = True


class Stream:
    """A streaming RPC in flight: its envelopes as the pump delivers them."""

    def __init__(self, memory: Memory, d: Deferred[Any]) -> None:
        self.memory = memory
        self.raw = bytearray()
        self.response: Any = None
        self.done = False
        d.addCallback(self._got)

    def _got(self, response: Any) -> None:
        self.response = response
        response.deliverBody(_Body(self))

    @property
    def frames(self) -> list[tuple[int, dict[str, Any]]]:
        return read_frames(bytes(self.raw))

    async def until(self, predicate: Any) -> None:
        await pump(self.memory.stub, predicate)

    async def finished(self) -> list[tuple[int, dict[str, Any]]]:
        await self.until(lambda: self.done)
        return self.frames


@attrs.define
class Memory:
    """A manager, the E2B front on it, and a ``StubTreq`` on the front."""

    config: Config
    clock: Clock
    manager: SandboxManager
    front: E2BFront
    stub: StubTreq

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Deferred[Any]:
        if body is not None:
            data = json.dumps(body).encode()
        return self.stub.request(  # type: ignore[attr-defined]  # StubTreq's generated methods
            method, "http://e2b.test" + path, data=data, headers=dict(headers or {})
        )

    def call(self, method: str, path: str, **kwargs: Any) -> Reply:
        """One request, answered within a flush (not a stream, not a download)."""

        async def read(response: Any) -> Reply:
            body = await treq.content(response)
            raw = {k.lower(): v for k, v in response.headers.getAllRawHeaders()}
            return Reply(response.code, raw, body)

        d = self._request(method, path, **kwargs)
        d.addCallback(lambda response: Deferred.fromCoroutine(read(response)))
        self.stub.flush()
        self.stub.flush()
        return result_of(d)

    def control(self, method: str, path: str, body: Any = None, key: str = KEY) -> Reply:
        return self.call(method, path, body=body, headers={"X-API-Key": key})

    def create(self, **body: Any) -> E2BSandbox:
        reply = self.control("POST", "/v2/sandboxes", {"templateID": "base", **body})
        assert reply.status == 201, reply
        return self.front.registry.get(reply.json()["sandboxID"])

    @staticmethod
    def envd_headers(entry: E2BSandbox, **extra: str) -> dict[str, str]:
        return {"E2b-Sandbox-Id": entry.id, "X-Access-Token": entry.token, **extra}

    def rpc(
        self, entry: E2BSandbox, name: str, message: Any, headers: Mapping[str, str] | None = None
    ) -> Reply:
        """A unary Connect call of ``entry``'s envd."""
        given = {"Content-Type": "application/json", **self.envd_headers(entry), **(headers or {})}
        return self.call("POST", "/" + name, body=message, headers=given)

    def stream(
        self, entry: E2BSandbox, name: str, message: Any, headers: Mapping[str, str] | None = None
    ) -> Stream:
        """A server-streaming Connect call (one enveloped request message)."""
        given = {"Content-Type": "application/connect+json", **self.envd_headers(entry)}
        d = self._request(
            "POST", "/" + name, data=wire.envelope(message), headers={**given, **(headers or {})}
        )
        self.stub.flush()
        return Stream(self, d)


def memory_front(root: str, **settings: str) -> Iterator[Memory]:
    """A :class:`Memory` whose daemon keeps its files under ``root``."""
    options = {**SETTINGS, "root": f"{root}/root", "tools-dir": f"{root}/tools", **settings}
    config = Config.load({}, options)
    clock = Clock()
    reactor = WatchingReactor()
    helper = HELPER if helper_problem(HELPER, as_root=False) is None else None
    bundle = no_isolation(reactor, None, 10, helper)  # type: ignore[arg-type]
    isolation = attrs.evolve(bundle, fs=SyncFiles())
    served = in_process(config, reactor, clock, isolation, SyncPool(), token=KEY.encode())
    manager, front = served.manager, served.e2b
    result_of(manager.start())
    try:
        yield Memory(config, clock, manager, front, StubTreq(front.app.resource()))
    finally:
        for rid in list(manager.sandboxes):
            result_of(Deferred.fromCoroutine(manager.kill(rid)))
        os.close(manager._devnull)
