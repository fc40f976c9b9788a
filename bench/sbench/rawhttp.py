"""A minimal blocking HTTP/1.1 client on one kept-alive connection (``http.client``).

The raw rows use it to drive sandboxd and the peer alike, so that they compare the servers with
the same (thin) client in front of both; sandboxd's own client has rows of its own.
"""

import http.client
import json
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

CHUNK = 1 << 20
IDLE_REOPEN = 2.0
"""Seconds after which a kept-alive connection is replaced before use (uvicorn closes idle
connections after 5 s; a request sent on a closed one fails)."""


class RawHTTP:
    """Requests to one server over one persistent connection (reopened when it drops)."""

    def __init__(self, port: int, headers: dict[str, str] | None = None) -> None:
        self.port = port
        self.headers = dict(headers or {})
        self.conn: http.client.HTTPConnection | None = None
        self.used = 0.0

    def _connection(self) -> http.client.HTTPConnection:
        if self.conn is not None and time.monotonic() - self.used > IDLE_REOPEN:
            self.close()
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, blocksize=CHUNK)
            self.conn.connect()
            self.used = time.monotonic()
        return self.conn

    def ready(self) -> "RawHTTP":
        """Have a usable connection now (before a timed request starts)."""
        self._connection()
        return self

    def request(
        self,
        method: str,
        path: str,
        body: bytes | BinaryIO | Iterator[bytes] | None = None,
        headers: dict[str, str] | None = None,
        sink: Callable[[bytes], object] | None = None,
    ) -> tuple[int, bytes]:
        """One request; the body goes to ``sink`` chunk by chunk if given (then ``b""``)."""
        conn = self._connection()
        all_headers = {**self.headers, **(headers or {})}
        try:
            conn.request(method, path, body=body, headers=all_headers)
            response = conn.getresponse()
            if sink is None:
                data = response.read()
            else:
                data = b""
                while chunk := response.read(CHUNK):
                    sink(chunk)
        except (http.client.HTTPException, OSError):
            self.close()
            raise
        if response.will_close:
            self.close()
        self.used = time.monotonic()
        return response.status, data

    def json(self, method: str, path: str, payload: Any = None) -> Any:
        body = None if payload is None else json.dumps(payload).encode()
        status, data = self.request(
            method, path, body, {"Content-Type": "application/json"} if body else None
        )
        if not 200 <= status < 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {data[:200]!r}")
        return json.loads(data) if data.strip() else None

    def timed(self, method: str, path: str, payload: Any = None) -> float:
        """Seconds for one JSON request, from sending it to the end of the answer."""
        body = None if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"} if body else None
        self.ready()
        start = time.perf_counter()
        status, data = self.request(method, path, body, headers)
        elapsed = time.perf_counter() - start
        if not 200 <= status < 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {data[:200]!r}")
        return elapsed

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
