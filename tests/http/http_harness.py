"""The in-memory HTTP harness: the real Klein app over ``StubTreq``, time from a ``Clock``.

File work runs synchronously (an ``FsCredentials`` returning ``maybeDeferred(work)`` and an
admin pool that calls its work at once), so every route but exec answers within one
``flush()``. Exec spawns real processes through the real reactor (pytest-twisted), while its
timers (deadline, silence, keepalive) run on the ``Clock`` and move only when a test advances it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import treq
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import Clock, deferLater
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.iweb import UNKNOWN_LENGTH

from sandboxd.config import Config
from sandboxd.core.manager import SandboxManager
from sandboxd.http.api import SandboxAPI
from sandboxd.isolation.base import Identity

TOKEN = b"s3cret-token"
POLL_LIMIT = 3000
"""Polls of the real reactor before a waiting helper gives up (a hang guard, not a timing)."""


class SyncFiles:
    """``FsCredentials`` that runs the file work at once, in the calling thread."""

    def run(self, identity: Identity, work: Callable[[], Any]) -> Deferred[Any]:
        return maybeDeferred(work)


class SyncPool:
    """Stands in for the admin ``ThreadPool``: the work runs at once, in the calling thread."""

    def callInThreadWithCallback(
        self, on_result: Callable[[bool, Any], None], f: Callable[..., Any], *a: Any, **kw: Any
    ) -> None:
        try:
            result = f(*a, **kw)
        except BaseException:
            on_result(False, Failure())
        else:
            on_result(True, result)


class ProcessReactor:
    """Processes from the real reactor; ``callFromThread`` runs at once (work is synchronous)."""

    def spawnProcess(self, *args: Any, **kwargs: Any) -> Any:
        from twisted.internet import reactor

        return reactor.spawnProcess(*args, **kwargs)

    def callFromThread(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        f(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """Everything else (readers, writers, ``callLater``) is the real reactor's."""
        from twisted.internet import reactor

        return getattr(reactor, name)


def result_of(d: Deferred[Any]) -> Any:
    """The result of a Deferred that has already fired (raising its failure)."""
    results: list[Any] = []
    d.addBoth(results.append)
    assert results, "the Deferred has not fired"
    if isinstance(results[0], Failure):
        results[0].raiseException()
    return results[0]


@attrs.define
class Reply:
    """One complete HTTP answer."""

    status: int
    headers: Mapping[bytes, list[bytes]]
    body: bytes
    length: int | None = None
    """The ``Content-Length`` the answer declared (the client removes it from headers)."""

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower().encode())
        return values[0].decode() if values else None

    def json(self) -> Any:
        assert self.header("content-type") == "application/json", self.headers
        return json.loads(self.body)

    def error(self) -> tuple[int, str]:
        """``(status, error type)`` of an error body, checking its shape."""
        body = self.json()
        assert set(body) == {"error", "detail"}, body
        assert isinstance(body["detail"], str)
        return self.status, body["error"]


async def pump(stub: StubTreq, predicate: Callable[[], bool]) -> None:
    """Pump the in-memory connections and let the real reactor run until ``predicate()``."""
    from twisted.internet import reactor

    for _ in range(POLL_LIMIT):
        stub.flush()
        if predicate():
            return
        await deferLater(reactor, 0.005, lambda: None)
    raise AssertionError("gave up waiting (hang guard)")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: object) -> bytes:
    assert isinstance(text, str), text
    return base64.b64decode(text)


class _Body(Protocol):
    """Collects a streamed response body for an :class:`ExecStream`."""

    def __init__(self, stream: ExecStream) -> None:
        self.stream = stream

    def dataReceived(self, data: bytes) -> None:
        self.stream.raw.extend(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if not reason.check(ResponseDone):
            self.stream.failure = reason
        self.stream.done = True


class ExecStream:
    """An exec call in flight: raw NDJSON bytes collected as the pump delivers them."""

    def __init__(self, harness: Harness, d: Deferred[Any]) -> None:
        self.harness = harness
        self.raw = bytearray()
        self.response: Any = None
        self.body: _Body | None = None
        self.done = False
        self.failure: Failure | None = None
        d.addCallback(self._got_response).addErrback(self._failed)

    def _got_response(self, response: Any) -> None:
        self.response = response
        self.body = _Body(self)
        response.deliverBody(self.body)

    def _failed(self, failure: Failure) -> None:
        self.failure = failure
        self.done = True

    @property
    def frames(self) -> list[dict[str, Any]]:
        lines = bytes(self.raw).split(b"\n")
        assert lines[-1] == b"", "the stream ends mid-line"
        return [json.loads(line) for line in lines[:-1]]

    @property
    def live(self) -> bytes:
        """The concatenated live ``o`` chunks."""
        return b"".join(unb64(f["o"]) for f in self.frames if "o" in f)

    @property
    def last(self) -> dict[str, Any]:
        return self.frames[-1]

    async def until(self, predicate: Callable[[], bool]) -> None:
        await pump(self.harness.stub, predicate)

    async def finished(self) -> dict[str, Any]:
        """Wait for the end of the stream; the final frame."""
        await self.until(lambda: self.done)
        if self.failure is not None:
            self.failure.raiseException()
        assert self.response.code == 200
        assert self.response.headers.getRawHeaders(b"content-type") == [b"application/x-ndjson"]
        for frame in self.frames[:-1]:
            # e: only with split (docs/extensions.rst, "Live stderr")
            assert set(frame) in ({"o"}, {"e"}), frame
        return self.last

    def disconnect(self) -> None:
        """The client goes away mid-stream."""
        assert self.body is not None and self.body.transport is not None
        self.body.transport.stopProducing()
        self.harness.stub.flush()


@attrs.define
class Harness:
    """A manager, its API and a ``StubTreq`` on it, all in memory."""

    config: Config
    clock: Clock
    manager: SandboxManager
    api: SandboxAPI
    stub: StubTreq
    token: bytes | None

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        if self.token is not None and "Authorization" not in headers:
            headers["Authorization"] = "Bearer " + self.token.decode()
        return headers

    def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        data: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Deferred[Reply]:
        kwargs: dict[str, Any] = {"headers": self.headers(headers)}
        if params is not None:
            kwargs["params"] = params
        if json_body is not None:
            kwargs["data"] = json.dumps(json_body).encode()
        if data is not None:
            kwargs["data"] = data
        d = self.stub.request(method, "http://sandboxd.test" + path, **kwargs)

        async def read(response: Any) -> Reply:
            body = await treq.content(response)
            raw = {k.lower(): v for k, v in response.headers.getAllRawHeaders()}
            length = None if response.length is UNKNOWN_LENGTH else response.length
            return Reply(response.code, raw, body, length)

        return d.addCallback(lambda response: Deferred.fromCoroutine(read(response)))

    def call(self, method: str, path: str, **kwargs: Any) -> Reply:
        """One request, answered within one flush (every route but exec and download)."""
        d = self._request(method, path, **kwargs)
        self.stub.flush()
        self.stub.flush()
        return result_of(d)

    async def acall(self, method: str, path: str, **kwargs: Any) -> Reply:
        """One request whose answer needs the real reactor (a download's ``FileSender``)."""
        d = self._request(method, path, **kwargs)
        replies: list[Any] = []
        d.addBoth(replies.append)
        await pump(self.stub, lambda: bool(replies))
        if isinstance(replies[0], Failure):
            replies[0].raiseException()
        return replies[0]

    def create(self, body: Any = None) -> str:
        reply = self.call("POST", "/sandboxes", json_body={} if body is None else body)
        assert reply.status == 200, reply
        return str(reply.json()["remote_id"])

    def workspace(self, rid: str) -> str:
        return self.manager.layout.workspace(rid)

    def exec(self, rid: str, body: Mapping[str, Any]) -> ExecStream:
        d = self.stub.request(
            "POST",
            f"http://sandboxd.test/sandboxes/{rid}/exec",
            data=json.dumps(body).encode(),
            headers=self.headers(),
        )
        return ExecStream(self, d)
