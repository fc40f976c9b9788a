"""
What every part of ``HttpSandbox`` is built on: its settings, the URL of a sandbox's route,
and the two ways a call is sent (retried when idempotent, else exactly once).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import IO, Any

from hyperlink import DecodedURL
from twisted.internet.interfaces import IReactorTime
from twisted.web.client import HTTPConnectionPool
from twisted.web.iweb import IAgent

from ._handles import check_base_url, decode_handle
from ._ndjson import DEFAULT_MAX_LINE
from ._retry import RetryPolicy, retrying
from ._tls import trusting
from ._transport import Transport
from ._types import SandboxHandle

Handle = SandboxHandle | str
OCTETS = b"application/octet-stream"


@functools.lru_cache(maxsize=4096)
def sandbox_url(handle: Handle, segments: tuple[str, ...]) -> DecodedURL:
    """The URL of one sandbox route: ``{pod_url}/sandboxes/{remote_id}/{segments}``.

    Remembered for the last few thousand (handle, route) pairs, both immutable: decoding the
    handle and building its URL (hyperlink checks the host's IDNA form each time) was a third
    of the client's CPU per ``exec``. A malformed handle raises ``ValueError`` every time.
    """
    route = decode_handle(handle)
    return route.base.child("sandboxes", route.remote_id, *segments)


class ClientBase:
    """The state and the sending of ``HttpSandbox`` (its parameters are documented there);
    the groups of its calls are subclasses of this one."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        reactor: Any = None,
        clock: IReactorTime | None = None,
        pool: HTTPConnectionPool | None = None,
        agent: IAgent | None = None,
        retry: RetryPolicy | None = None,
        exec_idle_timeout: float = 30.0,
        create_timeout: float = 120.0,
        persist_timeout: float = 600.0,
        tools_timeout: float = 300.0,
        connect_timeout: float | None = None,
        max_persistent_per_host: int = 8,
        cached_connection_timeout: float = 50.0,
        max_exec_line: int = DEFAULT_MAX_LINE,
        ca_file: str | None = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as global_reactor

            reactor = global_reactor
        self._base = check_base_url(base_url)
        self._reactor = reactor
        self._token = token
        """For a terminal's WebSocket (``Terminals.attach_terminal``), which is not HTTP."""
        self._clock: IReactorTime = clock if clock is not None else reactor
        self._retry = retry if retry is not None else RetryPolicy()
        self._exec_idle_timeout = exec_idle_timeout
        self._create_timeout = create_timeout
        self._persist_timeout = persist_timeout
        self._tools_timeout = tools_timeout
        self._max_exec_line = max_exec_line
        self._tls = trusting(ca_file) if ca_file is not None else None
        """The TLS policy of ``ca_file`` (``None``: the system's trust), for the HTTP calls and
        a terminal's WebSocket alike."""
        self._capabilities: dict[str, frozenset[str]] = {}
        """``/healthz`` capabilities per replica (``Trees.capabilities``)."""
        self._http = Transport(
            reactor,
            clock=self._clock,
            token=token,
            pool=pool,
            agent=agent,
            connect_timeout=connect_timeout,
            max_persistent_per_host=max_persistent_per_host,
            cached_connection_timeout=cached_connection_timeout,
            tls=self._tls,
        )

    # -- routing ---------------------------------------------------------------------------

    def _url(self, handle: Handle, *segments: str) -> DecodedURL:
        return sandbox_url(handle, segments)

    async def _idempotent(
        self,
        method: str,
        url: DecodedURL,
        payload: Any = None,
        *,
        service: bool = False,
        gone_ok: type[BaseException] | None = None,
    ) -> Any:
        async def attempt(deadline: float) -> Any:
            return await self._http.call(
                method, url, timeout=deadline, service=service, payload=payload
            )

        return await retrying(self._clock, self._retry, attempt, gone_ok=gone_ok)

    async def _once(
        self, method: str, url: DecodedURL, payload: Any, *, timeout: float, service: bool
    ) -> Any:
        return await self._http.call(method, url, timeout=timeout, service=service, payload=payload)

    async def _put_stream(
        self,
        url: DecodedURL,
        source: IO[bytes],
        content_type: bytes,
        total: int | None,
        on_progress: Callable[[int, int | None], object] | None,
        deadline: float,
        service: bool = False,
    ) -> bytes:
        """``PUT`` the bytes of ``source`` to ``url`` as they are read, telling
        ``on_progress(sent, total)`` as they go, and return the answer's body (``service``:
        the call reaches the replica's service, as the transport's other calls say)."""
        sent = [0]

        def progress(n: int) -> None:
            sent[0] += n
            if on_progress is not None:
                on_progress(sent[0], total)

        response = await self._http.send(
            "PUT",
            url,
            timeout=deadline,
            service=service,
            body=self._http.producer(source),
            content_type=content_type,
            on_sent=progress,
        )
        await self._http.check(response, timeout=deadline, service=service)
        chunks: list[bytes] = []
        await self._http.read(response, chunks.append, timeout=deadline, service=service)
        return b"".join(chunks)
