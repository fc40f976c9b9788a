"""An "internet" of names for the egress-by-name tests: a test CA, HTTP and HTTPS servers that
answer several names, and a DNS server answering for them, all in a network namespace of the
test's own (sockets made there by :func:`tests.kernel.netns_helpers.in_netns`).

Each server answers a request with its ``banner`` and the name it was asked for (the TLS SNI,
else the ``Host``), so a test sees which server a sandbox's connection really reached.
"""

import datetime
import hashlib
import ipaddress
import socket
import ssl
import struct
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import suppress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.names import dns

from tests.kernel.netns_helpers import in_netns


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


class NamesCA:
    """A CA made for one test and a server certificate it signed for ``names``."""

    def __init__(self, names: list[str]) -> None:
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (
            x509.CertificateBuilder()
            .subject_name(_name("sandboxd test CA"))
            .issuer_name(_name("sandboxd test CA"))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(names[0]))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        self.pem = ca.public_bytes(serialization.Encoding.PEM).decode()
        self._files = tempfile.TemporaryDirectory(prefix="names-ca-")
        self.cert_file = f"{self._files.name}/cert.pem"
        self.key_file = f"{self._files.name}/key.pem"
        with open(self.cert_file, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(self.key_file, "wb") as f:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def close(self) -> None:
        self._files.cleanup()


class WebServer:
    """HTTP (``tls`` None) or HTTPS on ``address:port`` in ``netns``; see the module docstring."""

    def __init__(
        self, netns: str | None, address: str, port: int, banner: str, tls: ssl.SSLContext | None
    ) -> None:
        def make() -> socket.socket:
            s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
            s.listen(16)
            return s

        self.sock = in_netns(netns, make)
        self.banner = banner
        self.tls = tls
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            sni = ""
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
                sni = getattr(conn, "server_hostname", None) or ""
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            host = ""
            for line in head.split(b"\r\n")[1:]:
                if line.lower().startswith(b"host:"):
                    host = line[5:].strip().decode()
            if head.startswith(b"GET /slow "):  # answers after the client has said all
                time.sleep(0.3)
            body = f"{self.banner} {sni or host}".encode()
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        with suppress(OSError):  # wakes the thread blocked on the socket, which then ends
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class NameServer:
    """A DNS server (UDP) in ``netns`` answering A and AAAA queries from ``zone`` (a name's
    addresses); any other name is NXDOMAIN."""

    def __init__(self, netns: str, address: str, zone: Mapping[str, list[str]]) -> None:
        def make() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((address, 53))
            return s

        self.sock = in_netns(netns, make)
        self.zone = zone
        self.asked: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            if not data:  # shut down
                return
            query = dns.Message()
            query.fromStr(data)
            reply = dns.Message(id=query.id, answer=1, opCode=query.opCode, recDes=1, recAv=1)
            reply.queries = query.queries
            for q in query.queries:
                name = q.name.name.decode().lower()
                self.asked.append(name)
                if name not in self.zone:
                    reply.rCode = dns.ENAME
                for text in self.zone.get(name, []):
                    address = ipaddress.ip_address(text)
                    if q.type == dns.A and address.version == 4:
                        payload: object = dns.Record_A(text, ttl=5)
                    elif q.type == dns.AAAA and address.version == 6:
                        payload = dns.Record_AAAA(text, ttl=5)
                    else:
                        continue
                    reply.answers.append(
                        dns.RRHeader(q.name.name, q.type, dns.IN, 5, payload)  # type: ignore[arg-type]
                    )
            self.sock.sendto(reply.toStr(), peer)

    def close(self) -> None:
        with suppress(OSError):  # wakes the thread blocked on the socket, which then ends
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class UdpEcho:
    """A UDP server in ``netns`` sending every datagram back (QUIC's port, say)."""

    def __init__(self, netns: str, address: str, port: int) -> None:
        def make() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((address, port))
            return s

        self.sock = in_netns(netns, make)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            if not data:  # shut down
                return
            self.sock.sendto(data, peer)

    def close(self) -> None:
        with suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


BLOCK = hashlib.sha256(b"sandboxd bulk").digest() * 32768
"""1 MiB that is not all one byte: what :class:`BulkServer` sends, over and over."""


def bulk(size: int) -> Iterator[memoryview]:
    """``size`` bytes of :data:`BLOCK` repeated, in blocks."""
    view = memoryview(BLOCK)
    while size > 0:
        yield view[: min(size, len(view))]
        size -= len(view)


def bulk_sha256(size: int) -> str:
    """The SHA-256 of what :class:`BulkServer` sends for ``GET /bulk/{size}``."""
    digest = hashlib.sha256()
    for block in bulk(size):
        digest.update(block)
    return digest.hexdigest()


class BulkServer:
    """Plain HTTP/1 on ``address:port`` in ``netns`` for transfers: ``GET /small`` answers
    ``ok``; ``GET /bulk/N`` answers N bytes (:func:`bulk`); ``GET /reset/N`` sends N of them,
    then resets the connection; ``POST /sha256`` answers the SHA-256 of its body
    (``Content-Length`` bytes) in hex. Each connection closes after its answer."""

    def __init__(self, netns: str | None, address: str, port: int) -> None:
        def make() -> socket.socket:
            s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
            s.listen(128)
            return s

        self.sock = in_netns(netns, make)
        self.sent = 0
        """Bytes of ``/bulk`` answers handed to the kernel so far (all connections)."""
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(60)
        try:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            head, _, rest = head.partition(b"\r\n\r\n")
            path = head.split(b" ")[1].decode()
            if path.startswith(("/bulk/", "/reset/")):
                size = int(path.rsplit("/", 1)[1])
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
                for block in bulk(size):
                    conn.sendall(block)
                    self.sent += len(block)
                if path.startswith("/reset/"):
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            if path == "/sha256":
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                digest = hashlib.sha256(rest)
                got = len(rest)
                while got < length:
                    chunk = conn.recv(min(1 << 20, length - got))
                    if not chunk:
                        return
                    digest.update(chunk)
                    got += len(chunk)
                body = digest.hexdigest().encode()
            else:
                body = b"ok"
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        with suppress(OSError):  # wakes the thread blocked on the socket, which then ends
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
