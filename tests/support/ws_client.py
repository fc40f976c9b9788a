"""A small blocking WebSocket client (RFC 6455) for the tests: a handshake, masked frames
out, frames in; written from the RFC, not from the daemon's library, so the two check each
other."""

import base64
import contextlib
import hashlib
import os
import socket
import struct

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
TEXT, BINARY, CLOSE, PING, PONG = 1, 2, 8, 9, 10


class HandshakeRefused(Exception):
    """The server answered the upgrade with something else: its status line and body."""


class WebSocket:
    """One client connection to ``ws://127.0.0.1:port/path``."""

    def __init__(
        self, port: int, path: str, headers: dict[str, str] | None = None, timeout: float = 30
    ) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        key = base64.b64encode(os.urandom(16))
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key.decode()}",
            "Sec-WebSocket-Version: 13",
            *(f"{name}: {value}" for name, value in (headers or {}).items()),
        ]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise HandshakeRefused(head.decode(errors="replace"))
            head += chunk
        head, self.buffer = head.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise HandshakeRefused(head.decode(errors="replace") + self._rest())
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        assert accept in head, head
        self.closed = False

    def _rest(self) -> str:
        self.sock.settimeout(2)
        try:
            return self.buffer.decode(errors="replace") + self.sock.recv(65536).decode(
                errors="replace"
            )
        except OSError:
            return ""

    def send(self, data: bytes, opcode: int = BINARY) -> None:
        mask = os.urandom(4)
        length = len(data)
        if length < 126:
            header = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
        elif length < 1 << 16:
            header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(header + mask + masked)

    def send_text(self, text: str) -> None:
        self.send(text.encode(), TEXT)

    def _read(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def receive(self) -> tuple[int, bytes]:
        """The next data or close frame: ``(opcode, payload)`` (pings are answered)."""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", self._read(2))
            elif length == 127:
                (length,) = struct.unpack("!Q", self._read(8))
            payload = self._read(length)
            opcode = first & 0x0F
            if opcode == PING:
                self.send(payload, PONG)
                continue
            if opcode == CLOSE:
                self.closed = True
            return opcode, payload

    def read_until(self, wanted: bytes) -> bytes:
        """Binary payloads until ``wanted`` is among them (``ConnectionError`` at a close)."""
        seen = b""
        while wanted not in seen:
            opcode, payload = self.receive()
            if opcode == CLOSE:
                raise ConnectionError(f"closed before {wanted!r}; seen {seen!r}")
            if opcode == BINARY:
                seen += payload
        return seen

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(OSError):
                self.send(struct.pack("!H", 1000), CLOSE)
        self.sock.close()
