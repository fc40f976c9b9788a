"""Egress by name's relay through the daemon: a real ``twistd sandboxd`` as root whose proxy
hands an allowed connection's sockets to the kernel (splice, ``egress_relay``), a sandbox
whose policy names ``bulk.example``, and an HTTP server of the test's own in a namespace
(:class:`tests.kernel.names_internet.BulkServer`, its name answered by the test's DNS server).

Large transfers arrive whole both ways (SHA-256 on both ends), a half-close passes with them,
a reset of either side ends the other and the daemon keeps none of their descriptors, a
sandbox that stops reading holds the server back without the daemon's memory growing, and
many connections at once all arrive whole.
"""

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.isolation.test_isolation_egress_relay import in_flight_max
from tests.kernel.names_internet import BulkServer, NameServer, bulk_sha256
from tests.kernel.netns_helpers import EGRESS_MARKS, scene
from tests.kernel.test_egress_daemon import exec_out
from tests.kernel.test_egress_names import created
from tests.support.daemon import Daemon, start_daemon, stop_daemon

pytestmark = EGRESS_MARKS

SERVER, DNS, HOST = "198.18.0.1", "198.18.0.53", "198.18.0.254"
NAME = "bulk.example"
MiB = 1 << 20

CLIENT = """
import hashlib, socket, sys, threading, time
what, name, address = sys.argv[1:4]
args = [int(a) for a in sys.argv[4:]]
block = hashlib.sha256(b"sandboxd bulk").digest() * 32768

def connect():
    s = socket.create_connection((address, 80), timeout=30)
    return s

def get(path, pause=0.0):
    s = connect()
    s.sendall(f"GET {path} HTTP/1.1\\r\\nHost: {name}\\r\\n\\r\\n".encode())
    digest, head, first = hashlib.sha256(), b"", True
    while b"\\r\\n\\r\\n" not in head:
        head += s.recv(65536)
    head, body = head.split(b"\\r\\n\\r\\n", 1)
    digest.update(body)
    got = len(body)
    if pause:
        while got < 1 << 20:
            chunk = s.recv(65536)
            digest.update(chunk)
            got += len(chunk)
        time.sleep(pause)
    while chunk := s.recv(1 << 20):
        digest.update(chunk)
        got += len(chunk)
    s.close()
    return got, digest.hexdigest()

if what == "get":
    got, sha = get(f"/bulk/{args[0]}", args[1] if len(args) > 1 else 0)
    print(got, sha)
elif what == "post":
    size = args[0]
    s = connect()
    head = f"POST /sha256 HTTP/1.1\\r\\nHost: {name}\\r\\nContent-Length: {size}\\r\\n\\r\\n"
    s.sendall(head.encode())
    sent = 0
    while sent < size:
        piece = block[: min(len(block), size - sent)]
        s.sendall(piece)
        sent += len(piece)
    s.shutdown(socket.SHUT_WR)  # all said: the answer must still come
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
    print(answer.split(b"\\r\\n\\r\\n", 1)[1].decode())
elif what == "reset":
    try:
        got, sha = get(f"/reset/{args[0]}")
        print("ended", got)
    except ConnectionResetError:
        print("reset")
elif what == "abort":
    import struct
    s = connect()
    s.sendall(f"GET /bulk/{args[0]} HTTP/1.1\\r\\nHost: {name}\\r\\n\\r\\n".encode())
    s.recv(65536)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    print("aborted")
elif what == "many":
    count, size = args
    results = []
    def one():
        results.append(get(f"/bulk/{size}"))
    threads = [threading.Thread(target=one) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(len(results), len(set(results)), results[0][0], results[0][1])
"""


@pytest.fixture
def server() -> Iterator[BulkServer]:
    """The bulk server on SERVER:80 and a DNS server answering NAME with SERVER."""
    with scene() as s:
        inet = s.netns("inet")
        s.wire("r", inet, [f"{HOST}/24"], [f"{SERVER}/24", f"{DNS}/24"])
        bulk = BulkServer(inet, SERVER, 80)
        names = NameServer(inet, DNS, {NAME: [SERVER]})
        try:
            yield bulk
        finally:
            bulk.close()
            names.close()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    base = 480000 + os.getpid() % 1000 * 20
    started = start_daemon(
        tmp_path,
        f"--uid-min={base}",
        f"--uid-max={base + 1}",
        "--network-allow=egress",
        env={"SANDBOXD_EGRESS_DNS": DNS},
    )
    try:
        yield started
    finally:
        stop_daemon(started)


def client(daemon: Daemon, rid: str, what: str, *args: int) -> str:
    argv = ("python3", "-c", CLIENT, what, NAME, SERVER, *map(str, args))
    return exec_out(daemon, rid, *argv).strip()


def descriptors(daemon: Daemon) -> int:
    return len(os.listdir(f"/proc/{daemon.process.pid}/fd"))


def rss_kib(daemon: Daemon) -> int:
    with open(f"/proc/{daemon.process.pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1])


def steady(read: Callable[[], int], seconds: float = 20) -> int:
    """What ``read()`` gives once it has not changed for half a second."""
    deadline = time.monotonic() + seconds
    last = read()
    while True:
        time.sleep(0.5)
        now = read()
        if now == last:
            return now
        assert time.monotonic() < deadline, "never steady"
        last = now


def idle_descriptors(daemon: Daemon) -> int:
    """The daemon's descriptors once steady (an exec's pipes close after its answer)."""
    return steady(lambda: descriptors(daemon))


def settled(daemon: Daemon, count: int) -> bool:
    """Whether the daemon's descriptors come back to ``count`` (or fewer) within 10 s: a
    relay's six (two sockets, two pipes) are gone."""
    deadline = time.monotonic() + 10
    while descriptors(daemon) > count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_large_transfers_arrive_whole_both_ways(server: BulkServer, daemon: Daemon) -> None:
    rid = created(daemon, {"mode": "egress", "allow_out": [NAME]})
    assert client(daemon, rid, "get", 1) == f"1 {bulk_sha256(1)}"  # (the name's lookup)
    idle = idle_descriptors(daemon)
    size = 64 * MiB
    assert client(daemon, rid, "get", size) == f"{size} {bulk_sha256(size)}"
    # the sandbox's upload, then its half-close: the server's answer still comes
    assert client(daemon, rid, "post", 48 * MiB + 7) == bulk_sha256(48 * MiB + 7)
    assert settled(daemon, idle)  # both sockets and both pipes of each closed


def test_a_reset_of_either_side_ends_the_other(server: BulkServer, daemon: Daemon) -> None:
    rid = created(daemon, {"mode": "egress", "allow_out": [NAME]})
    assert client(daemon, rid, "get", 1) == f"1 {bulk_sha256(1)}"
    idle = idle_descriptors(daemon)
    assert client(daemon, rid, "reset", 4 * MiB) == "reset"  # not a clean end: a reset
    assert settled(daemon, idle)
    sent = server.sent
    assert client(daemon, rid, "abort", 256 * MiB) == "aborted"
    assert settled(daemon, idle)  # the relay ended with the sandbox's reset
    assert server.sent - sent < 64 * MiB  # the server's sending failed long before the end


def test_a_sandbox_that_stops_reading_holds_the_server_back(
    server: BulkServer, daemon: Daemon
) -> None:
    rid = created(daemon, {"mode": "egress", "allow_out": [NAME]})
    assert client(daemon, rid, "get", 1) == f"1 {bulk_sha256(1)}"
    size = 256 * MiB
    before = rss_kib(daemon)
    sent = server.sent
    answers: list[str] = []
    reading = threading.Thread(
        target=lambda: answers.append(client(daemon, rid, "get", size, 8)), daemon=True
    )
    reading.start()
    held = steady(lambda: server.sent - sent)  # the server waits: nothing more is taken
    assert held <= in_flight_max() < size  # what the kernel's buffers hold, no more
    assert rss_kib(daemon) - before < 16 * 1024  # and nothing piles up in the daemon
    reading.join(60)
    assert answers == [f"{size} {bulk_sha256(size)}"]


def test_many_connections_at_once(server: BulkServer, daemon: Daemon) -> None:
    rid = created(daemon, {"mode": "egress", "allow_out": [NAME]})
    assert client(daemon, rid, "get", 1) == f"1 {bulk_sha256(1)}"
    idle = idle_descriptors(daemon)
    size = 2 * MiB
    assert client(daemon, rid, "many", 100, size) == f"100 1 {size} {bulk_sha256(size)}"
    assert settled(daemon, idle)
