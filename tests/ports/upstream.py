"""The server a test runs inside a sandbox (written into its workspace, run as
``python3 upstream.py PORT``): ``/headers`` answers the request's headers as JSON, ``/big?n=N``
streams N bytes in 64 KiB writes, ``/chunked`` answers in chunks, ``/cut`` closes after 10 of
the 1000 bytes it announced, ``/ws`` is a WebSocket echo (a hand-made handshake, then each
client frame sent back unmasked), ``/flood?n=N`` the same handshake then N raw bytes; anything
else is ``http.server``'s file serving."""

import base64
import hashlib
import json
import socketserver
import sys
from http.server import SimpleHTTPRequestHandler

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/headers":
            body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path.startswith("/big?n="):
            size = int(self.path.split("=", 1)[1])
            self.send_response(200)
            self.send_header("content-length", str(size))
            self.end_headers()
            chunk = b"x" * 65536
            while size > 0:
                self.wfile.write(chunk[:size])
                size -= len(chunk)
            return
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for part in (b"one ", b"two"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path == "/cut":
            self.send_response(200)
            self.send_header("content-length", "1000")
            self.end_headers()
            self.wfile.write(b"only ten b")
            self.wfile.flush()
            self.close_connection = True
            return
        if self.path == "/ws":
            self.websocket()
            return
        if self.path.startswith("/flood?n="):
            self.websocket(flood=int(self.path.split("=", 1)[1]))
            return
        super().do_GET()

    def websocket(self, flood: int = 0) -> None:
        key = self.headers["sec-websocket-key"].encode()
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
        self.send_response(101)
        self.send_header("upgrade", "websocket")
        self.send_header("connection", "Upgrade")
        self.send_header("sec-websocket-accept", accept)
        self.end_headers()
        self.wfile.flush()
        chunk = b"y" * 65536
        while flood > 0:  # bytes as fast as the tunnel takes them (no framing: a byte test)
            self.wfile.write(chunk[:flood])
            flood -= len(chunk)
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            length = head[1] & 0x7F
            mask = self.rfile.read(4)
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if head[0] & 0x0F == 8:  # close
                return
            self.wfile.write(bytes([0x81, len(payload)]) + payload)
            self.wfile.flush()


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
