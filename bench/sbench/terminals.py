"""The ``terminals`` section (issue 32): what a person at a terminal page or ``sandboxctl
shell`` waits for, and what the ports proxy adds to a request.

- Keystroke echo: one byte typed on a terminal's WebSocket until it comes back, on each
  daemon. The terminal runs ``cat`` with its pty in raw mode without echo, so the byte is
  echoed by the program, as a shell's line editor does (a process woken per key), not by
  the kernel's line discipline. The client is a bare blocking WebSocket on loopback, as the
  raw rows' HTTP client is: the daemon's share, not a client library's.
- Port proxy overhead: ``GET`` of 1 KiB from ``python3 -m http.server`` in a sandbox through
  the daemon (``/sandboxes/{rid}/ports/8000/f``) against the same request made directly from a
  thread in the sandbox's network namespace (``bench/ports.py``, interleaved rounds); isolated
  daemon only (a sandbox without a network namespace has no ports to proxy).
"""

from __future__ import annotations

import base64
import os
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from .stats import pct, summary

if TYPE_CHECKING:
    from .figures import Bench, Sandboxd

ECHO_TARGET_MS = 2.0
PROXY_TARGET_MS = 1.0
RAW_CAT = ["sh", "-c", "stty raw -echo && exec cat"]


class TerminalSocket:
    """A terminal's WebSocket on ``127.0.0.1:port`` (RFC 6455, client side, blocking)."""

    def __init__(self, port: int, path: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"the handshake was refused: {head[:200]!r}")
            head += chunk
        head, self.buffer = head.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(f"the handshake was refused: {head[:200]!r}")

    def send(self, data: bytes) -> None:
        """One masked binary frame (payloads under 126 bytes)."""
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(bytes([0x82, 0x80 | len(data)]) + mask + masked)

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the terminal's socket closed")
            self.buffer += chunk
        taken, self.buffer = self.buffer[:n], self.buffer[n:]
        return taken

    def receive(self) -> tuple[int, bytes]:
        """The next frame's opcode and payload (the server's are not masked)."""
        first, second = self._take(2)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", self._take(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", self._take(8))[0]
        return first & 0x0F, self._take(length)

    def until(self, wanted: bytes) -> None:
        seen = b""
        while wanted not in seen:
            opcode, payload = self.receive()
            if opcode != 0x2:
                raise ConnectionError(f"the terminal ended: {payload[:200]!r}")
            seen += payload

    def close(self) -> None:
        self.sock.close()


def keystroke_echo(d: Sandboxd, keys: int) -> list[float] | str:
    """Seconds per keystroke round trip (``keys`` of them, after a warm-up), or why none."""
    try:
        terminal = d.raw.json("POST", d.path("terminals"), {"cmd": RAW_CAT})["id"]
    except RuntimeError as refused:  # 501 without the exec helper
        return str(refused)
    ws = TerminalSocket(d.server.port, d.path(f"terminals/{terminal}"))
    try:
        ws.send(b"ready?")  # once cat runs with the pty raw, what is typed comes back
        ws.until(b"ready?")
        samples = []
        for i in range(keys + 10):
            key = bytes([0x61 + i % 26])
            start = time.perf_counter()
            ws.send(key)
            ws.until(key)
            if i >= 10:
                samples.append(time.perf_counter() - start)
        return samples
    finally:
        ws.close()
        d.raw.request("DELETE", d.path(f"terminals/{terminal}"))


def proxied_and_direct(d: Sandboxd, rounds: int) -> dict[str, list[float]]:
    """Interleaved seconds of a ``GET`` through the proxy and made directly inside."""
    import ports  # bench/ports.py: the request made from inside the namespace

    d.raw.request("PUT", d.path("file", path="f"), ports.BODY)
    cmd = ["python3", "-m", "http.server", str(ports.PORT), "--bind", "127.0.0.1"]
    server = d.raw.json("POST", d.path("processes"), {"cmd": cmd})["id"]
    path = d.path(f"ports/{ports.PORT}/f")
    try:
        deadline = time.monotonic() + 30
        while d.raw.request("GET", path)[0] != 200:
            assert time.monotonic() < deadline, "the server in the sandbox never answered"
            time.sleep(0.1)
        assert d.server.root is not None
        pin = str(d.server.root / ".ns" / d.rid / "net")
        samples: dict[str, list[float]] = {"proxied": [], "direct": []}
        with ThreadPoolExecutor(1, initializer=ports.enter, initargs=(pin,)) as inside:
            for _ in range(rounds):
                samples["proxied"].append(d.raw.timed("GET", path))
                samples["direct"].append(inside.submit(ports.direct).result())
        return samples
    finally:
        d.raw.json("POST", d.path(f"processes/{server}/signal"), {"signal": "KILL"})


def section(bench: Bench) -> None:
    from .figures import at_most

    quick = bench.sizes.quick
    keys, rounds = (20, 10) if quick else (1000, 500)
    for label, d in bench.daemons.items():
        echo = keystroke_echo(d, keys)
        if isinstance(echo, str):
            bench.notes.append(f"keystroke echo on the {label} daemon skipped: {echo}")
            continue
        stats = summary(echo)
        bench.row(
            "keystroke echo, WebSocket (p50)",
            f"{label}, raw",
            stats["p50"] * 1000,
            "ms",
            target=None if quick else at_most(ECHO_TARGET_MS, " ms"),
            extra={"p90_ms": stats["p90"] * 1000, "n": stats["n"]},
        )
    isolated = bench.daemons.get("isolated")
    if isolated is None:
        bench.notes.append("port proxy rows skipped: they need the isolated daemon (root)")
        return
    samples = proxied_and_direct(isolated, rounds)
    proxied, direct = (pct(samples[k], 0.5) * 1000 for k in ("proxied", "direct"))
    bench.row(
        "port proxy overhead (p50 proxied - p50 direct)",
        "isolated, raw",
        proxied - direct,
        "ms",
        target=None if quick else at_most(PROXY_TARGET_MS, " ms"),
        extra={
            "proxied_p50_ms": proxied,
            "direct_p50_ms": direct,
            "proxied_p90_ms": pct(samples["proxied"], 0.9) * 1000,
            "direct_p90_ms": pct(samples["direct"], 0.9) * 1000,
            "n": rounds,
        },
    )
