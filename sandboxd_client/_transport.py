"""
The HTTP layer under ``HttpSandbox``: treq on a persistent connection pool, with deadlines.

Every request is sent with ``unbuffered=True`` and without redirects. Two deadlines, both on the
injected clock: the wait for response headers (reset by every chunk of the request body we send,
so a large upload is only timed while it stalls), and the idle time between body chunks
(``_body.read_body``). Either firing is ``SandboxBusy``; every other transport failure goes
through ``_errors.error_from_transport`` and every non-2xx status through
``_errors.error_from_response``.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
from collections.abc import Callable, Iterator
from typing import IO, Any

from hyperlink import DecodedURL
from treq.client import HTTPClient
from treq.cookies import IndexableCookieJar
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import Cooperator
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IBodyProducer, IPolicyForHTTPS, IResponse

from ._body import SMALL_BODY, BytesProducer, IdleTimer, ProgressProducer, read_body
from ._endpoints import ReusedEndpoints
from ._errors import error_from_response, error_from_transport
from ._literal_hosts import LiteralHostAgent, standin_url
from ._types import ProtocolError
from ._wire import JSON, json_bytes

JSON_LIMIT = 64 << 20
ERROR_BODY_LIMIT = 64 << 10
USER_AGENT = b"sandboxd-client/0.1"
BODY_READ_SIZE = 1 << 20
"""Bytes of a request body read and written at a time (``FileBodyProducer`` reads 64 KiB: an
upload of 1 GiB took 16 384 cooperator steps, reads and writes)."""


PAUSE_GC_ABOVE = 1 << 20
"""JSON replies from this size on are decoded with the garbage collector paused (see
``collector_paused``)."""


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """
    Pause Python's cyclic garbage collector for a burst of allocations that all stay alive.

    Decoding a large reply (a walk of 100 000 files: as many dicts, then as many entries) makes
    the collector run full collections over the whole process, all of whose objects survive;
    in an application with a large heap that was about half of the decoding time. Nothing is
    collected later than it would be: the collector resumes at the end (it is only resumed if
    it was running).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Enough(Exception):
    """Raised by a bounded collector to stop reading."""


class _Collector:
    """A sink that keeps at most ``limit`` bytes, then raises ``_Enough``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0

    def __call__(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > self.limit:
            raise _Enough()

    def data(self) -> bytes:
        return b"".join(self.chunks)


class NoCookies(IndexableCookieJar):
    """A cookie jar that keeps nothing and sends nothing: sandboxd sets no cookie, calls are
    routed by URL (a replica's own ``pod_url``), and treq's jar looks at every request and
    response (urllib's cookie machinery: a tenth of the client's CPU for a short ``exec``)."""

    def add_cookie_header(self, request: Any) -> None:
        """Send no cookie."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        """Keep no cookie."""


class Transport:
    """
    Send requests and read replies for one client.

    ``service=True`` marks requests to the load-balanced base URL (create, health, list,
    tools): a dead address there is ``SandboxUnavailable``, not ``SandboxNotFound``.
    """

    def __init__(
        self,
        reactor: Any,
        *,
        clock: IReactorTime,
        token: str | None,
        pool: HTTPConnectionPool | None,
        agent: IAgent | None,
        connect_timeout: float | None,
        max_persistent_per_host: int,
        cached_connection_timeout: float,
        tls: IPolicyForHTTPS | None = None,
    ) -> None:
        self._clock = clock
        self._own_pool = pool is None and agent is None
        if pool is None:
            pool = HTTPConnectionPool(reactor, persistent=True)
            pool.maxPersistentPerHost = max_persistent_per_host
            pool.cachedConnectionTimeout = cached_connection_timeout  # type: ignore[assignment]
        self._pool = pool
        if agent is None:
            endpoints = ReusedEndpoints(reactor, connect_timeout, tls)
            agent = Agent.usingEndpointFactory(reactor, endpoints, pool=pool)
        self._cooperator = Cooperator(scheduler=lambda f: reactor.callLater(0, f))
        self._treq = HTTPClient(
            LiteralHostAgent(agent), cookiejar=NoCookies(), data_to_body_producer=self.producer
        )
        self._token = token

    def producer(self, data: bytes | IO[bytes] | IBodyProducer) -> IBodyProducer:
        """A body producer for bytes or an open binary file, on this client's cooperator: bytes
        up to :data:`~sandboxd_client._body.SMALL_BODY` are written whole at once, anything
        larger is read and written :data:`BODY_READ_SIZE` bytes at a time."""
        if IBodyProducer.providedBy(data):
            return data
        if isinstance(data, bytes | bytearray) and len(data) <= SMALL_BODY:
            return BytesProducer(bytes(data))
        source = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
        return FileBodyProducer(source, cooperator=self._cooperator, readSize=BODY_READ_SIZE)

    def _headers(self, content_type: bytes | None) -> Headers:
        headers = Headers({b"User-Agent": [USER_AGENT]})
        if self._token is not None:
            headers.setRawHeaders(b"Authorization", [b"Bearer " + self._token.encode("utf-8")])
        if content_type is not None:
            headers.setRawHeaders(b"Content-Type", [content_type])
        return headers

    async def send(
        self,
        method: str,
        url: DecodedURL,
        *,
        timeout: float,
        service: bool,
        body: IBodyProducer | None = None,
        content_type: bytes | None = None,
        on_sent: Callable[[int], object] | None = None,
    ) -> IResponse:
        """
        Send a request; return the response once its headers arrived (body not read).

        ``timeout`` bounds the wait for headers, restarted by each request-body chunk sent;
        ``on_sent(n)`` is told about each chunk.
        """
        pending: list[Deferred[Any]] = []
        timer = IdleTimer(self._clock, timeout, lambda: pending[0].cancel() if pending else None)
        if body is not None:

            def sent(n: int) -> None:
                timer.reset()
                if on_sent is not None:
                    on_sent(n)

            body = ProgressProducer(body, sent)
        d = self._treq.request(
            method,
            standin_url(url),
            headers=self._headers(content_type),
            data=body,
            unbuffered=True,
            allow_redirects=False,
        )
        pending.append(d)
        try:
            return await d
        except BaseException as e:
            mapped = error_from_transport(e, timed_out=timer.fired, service=service)
            if mapped is e:
                raise
            raise mapped from e
        finally:
            timer.cancel()

    async def read(
        self, response: IResponse, sink: Callable[[bytes], object], *, timeout: float, service: bool
    ) -> None:
        """Stream the body to ``sink``; its exceptions propagate unchanged."""
        raised: list[BaseException] = []

        def guarded(data: bytes) -> None:
            try:
                sink(data)
            except BaseException as e:
                raised.append(e)
                raise

        try:
            await read_body(self._clock, response, guarded, timeout)
        except BaseException as e:
            if raised and e is raised[0]:
                raise
            mapped = error_from_transport(e, timed_out=False, service=service)
            if mapped is e:
                raise
            raise mapped from e

    async def check(self, response: IResponse, *, timeout: float, service: bool) -> None:
        """Raise the mapped exception for a non-2xx response (reading a bounded error body)."""
        if 200 <= response.code < 300:
            return
        collector = _Collector(ERROR_BODY_LIMIT)
        # The status decides; a partial or missing error body only loses the detail.
        with contextlib.suppress(Exception):
            await self.read(response, collector, timeout=timeout, service=service)
        raise error_from_response(response.code, collector.data()[:ERROR_BODY_LIMIT])

    async def call(
        self,
        method: str,
        url: DecodedURL,
        *,
        timeout: float,
        service: bool,
        payload: Any = None,
    ) -> Any:
        """
        One JSON round trip: send ``payload`` (if not ``None``) as JSON, return the decoded
        reply, or ``None`` for an empty one (204). ``ProtocolError`` for a non-JSON reply.
        """
        body, ctype = None, None
        if payload is not None:
            body, ctype = self.producer(json_bytes(payload)), JSON
        response = await self.send(
            method, url, timeout=timeout, service=service, body=body, content_type=ctype
        )
        await self.check(response, timeout=timeout, service=service)
        collector = _Collector(JSON_LIMIT)
        try:
            await self.read(response, collector, timeout=timeout, service=service)
        except _Enough:
            raise ProtocolError(f"reply larger than {JSON_LIMIT} bytes") from None
        data = collector.data()
        if response.code == 204 or not data.strip():
            return None
        try:
            if len(data) < PAUSE_GC_ABOVE:
                return json.loads(data)
            with collector_paused():
                return json.loads(data)
        except (ValueError, UnicodeDecodeError):
            snippet = data[:80].decode("utf-8", "replace")
            raise ProtocolError(f"reply is not JSON (HTTP {response.code}): {snippet!r}") from None

    def close(self) -> Deferred[None]:
        """Close the pooled connections (only when the pool is ours) and stop the cooperator."""
        self._cooperator.stop()
        if self._own_pool:
            closed: Deferred[None] = self._pool.closeCachedConnections()
            return closed
        return succeed(None)
