"""Header rules through the daemon (docs/isolation.rst, "Header rules"): a real ``twistd
sandboxd`` as root, a sandbox whose policy sets an ``Authorization`` for one name, commands
run as its uid sending HTTP/1.1 to an "internet" of the test's own (a namespace behind a veth:
:class:`HeaderRecorder`, a keep-alive HTTP server that records every request's headers and
body on the test's side and answers with neither, and a DNS server the proxy resolves with).

The upstream sees the rule's header on every request of a kept-alive connection (replacing
the one the sandbox sent), a chunked body intact; a second ``Host`` on the connection is
refused (over TLS the name is terminated: ``test_egress_rules_tls.py``); a name without a rule
passes as the sandbox sent it.
The sandbox never holds the value: not in its environment, not in any file of the daemon's
state root (its files live there), not in the memory of any of its processes, read through
``/proc/PID/mem`` from the host while its client, having talked to the upstream, is stopped.
"""

import hashlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from attrs import frozen

from tests.kernel.names_internet import NameServer
from tests.kernel.netns_helpers import EGRESS_MARKS, in_netns, scene
from tests.kernel.test_egress_daemon import exec_out
from tests.kernel.test_egress_names import created, refused_counts
from tests.support.daemon import Daemon, start_daemon, stop_daemon

pytestmark = EGRESS_MARKS

A4, B4, DNS4, HOST4 = "203.0.113.1", "203.0.113.2", "203.0.113.53", "203.0.113.254"
API, PLAIN = "api.rules.example", "plain.rules.example"
ZONE = {API: [A4], PLAIN: [A4], "other.rules.example": [B4]}
SECRET = "Bearer rules33-" + hashlib.sha256(str(os.getpid()).encode()).hexdigest()[:24]
UIDS = 2


def bulk(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


class HeaderRecorder:
    """HTTP/1.1 on ``address:80`` in ``netns``, kept alive: each request's line, headers and
    body (by length or chunks) go to :attr:`seen`; the answer says its number on the
    connection and its body's length and hash, never a header."""

    def __init__(self, netns: str, address: str) -> None:
        def make() -> socket.socket:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, 80))
            s.listen(16)
            return s

        self.sock = in_netns(netns, make)
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn, peer[0]), daemon=True).start()

    def _answer(self, conn: socket.socket, peer: str) -> None:
        conn.settimeout(10)
        reader = conn.makefile("rb")
        try:
            for number in range(1, 100):
                line = reader.readline(65536)
                if not line:
                    return
                headers = []
                while (header := reader.readline(65536)) not in (b"\r\n", b""):
                    name, _, value = header.decode("latin-1").partition(":")
                    headers.append((name.strip().lower(), value.strip()))
                found = dict(headers)
                body = b""
                if "content-length" in found:
                    body = reader.read(int(found["content-length"]))
                elif found.get("transfer-encoding") == "chunked":
                    while size := int(reader.readline(100).split(b";")[0], 16):
                        body += reader.read(size)
                        reader.readline(10)
                    while reader.readline(65536) not in (b"\r\n", b""):
                        pass
                self.seen.append(
                    {"line": line.decode().strip(), "headers": headers, "body": body, "peer": peer}
                )
                answer = json.dumps(
                    {"n": number, "len": len(body), "sha": hashlib.sha256(body).hexdigest()}
                ).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer)
                )
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        with suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


CLIENT = r"""
import json, os, signal, socket, sys
address, port, stop = sys.argv[1], int(sys.argv[2]), sys.argv[4] == "stop"
canary = ("canary-" + str(12345 * 7)).encode()  # made here: only this process's memory has it
out = []
try:
    s = socket.create_connection((address, port), timeout=5)
    if port == 443:
        import ssl
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        s = context.wrap_socket(s, server_hostname=json.loads(sys.argv[3])[0]["host"])
    reader = s.makefile("rb")
    for r in json.loads(sys.argv[3]):
        head = f"{r.get('method', 'GET')} /{len(out)} HTTP/1.1\r\nHost: {r['host']}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in r.get("headers", {}).items())
        chunks = [bytes(i % 251 for i in range(n)) for n in r.get("chunks", [])]
        if chunks:
            head += "Transfer-Encoding: chunked\r\n"
        s.sendall(head.encode() + b"\r\n")
        for chunk in chunks:
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        if chunks:
            s.sendall(b"0\r\n\r\n")
        if not reader.readline():
            out.append("closed")
            break
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        out.append(json.loads(reader.read(length)))
except Exception as e:
    out.append("refused " + type(e).__name__)
print(json.dumps(out), flush=True)
if stop:  # held still while the host reads this process's memory
    os.kill(os.getpid(), signal.SIGSTOP)
"""


@frozen
class Ruled:
    daemon: Daemon
    recorder: HeaderRecorder
    rid: str


@contextmanager
def rules_internet(*more: str) -> Iterator[tuple[HeaderRecorder, str]]:
    """The "internet" and its namespace: behind a veth, a :class:`HeaderRecorder` on A4
    (which :data:`API` and :data:`PLAIN` resolve to), a DNS server on DNS4, and ``more``
    addresses of its own."""
    servers: list[Any] = []
    try:
        with scene() as s:
            inet = s.netns("inet")
            inside = [f"{a}/24" for a in (A4, B4, DNS4, *more)]
            s.wire("r", inet, [f"{HOST4}/24"], inside)
            servers += [HeaderRecorder(inet, A4), NameServer(inet, DNS4, ZONE)]
            yield servers[0], inet
    finally:
        for server in servers:
            server.close()


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ruled]:
    """One daemon and one "internet" for the module; a sandbox with a rule for :data:`API`."""
    with rules_internet() as (recorder, _):
        base = 491000 + os.getpid() % 1000 * 20
        daemon = start_daemon(
            tmp_path_factory.mktemp("rules"),
            f"--uid-min={base}",
            f"--uid-max={base + UIDS - 1}",
            "--network-allow=egress",
            env={"SANDBOXD_EGRESS_DNS": DNS4},
        )
        try:
            network = {
                "mode": "egress",
                "allow_out": [API, PLAIN],
                "rules": {API: [{"headers": {"Authorization": SECRET}}]},
            }
            yield Ruled(daemon, recorder, created(daemon, network))
        finally:
            stop_daemon(daemon)


def talk(
    ruled: Ruled, requests: list[dict[str, Any]], port: int = 80, stop: str = "no"
) -> list[Any]:
    """What the sandbox's one connection to A4 got for ``requests``, one answer each."""
    argv = ("python3", "-c", CLIENT, A4, str(port), json.dumps(requests), stop)
    return list(json.loads(exec_out(ruled.daemon, ruled.rid, *argv)))


def auth_of(seen: dict[str, Any]) -> list[str]:
    return [value for name, value in seen["headers"] if name == "authorization"]


def test_every_request_of_a_kept_alive_connection_gets_the_rules_header(rules: Ruled) -> None:
    rules.recorder.seen.clear()
    chunks = [1, 70000, 3, 65536]
    answers = talk(
        rules,
        [
            {"host": API},
            {"host": API, "headers": {"authorization": "Bearer mine"}},
            {"host": API, "method": "POST", "chunks": chunks},
        ],
    )
    body = b"".join(bulk(n) for n in chunks)
    assert [answer["n"] for answer in answers] == [1, 2, 3]  # one connection, kept alive
    assert answers[2] == {"n": 3, "len": len(body), "sha": hashlib.sha256(body).hexdigest()}
    assert [auth_of(seen) for seen in rules.recorder.seen] == [[SECRET]] * 3
    assert rules.recorder.seen[2]["body"] == body
    # a name without a rule passes as the sandbox sent it
    assert talk(rules, [{"host": PLAIN, "headers": {"Authorization": "Bearer mine"}}])[0]["n"] == 1
    assert auth_of(rules.recorder.seen[3]) == ["Bearer mine"]
    listed = rules.daemon.json("GET", f"/sandboxes/{rules.rid}/network")
    assert listed["rules"] == {API: ["Authorization"]}
    assert SECRET not in rules.daemon.call("GET", "/sandboxes")[1].decode()


def test_a_second_host_on_the_connection_is_refused(rules: Ruled) -> None:
    rules.recorder.seen.clear()
    before = refused_counts(rules.daemon, rules.rid)
    answers = talk(rules, [{"host": API}, {"host": PLAIN, "headers": {"Authorization": "x"}}])
    assert answers[0]["n"] == 1 and answers[1] in ("closed", "refused ConnectionResetError")
    assert [seen["line"] for seen in rules.recorder.seen] == ["GET /0 HTTP/1.1"]
    # (over TLS the rule's name is terminated, its upstream connected: none listens on 443)
    assert talk(rules, [{"host": API}], port=443)[0].startswith("refused")
    counts = refused_counts(rules.daemon, rules.rid)
    assert counts.get("host_changed", 0) == before.get("host_changed", 0) + 1, counts
    assert counts.get("unreachable", 0) == before.get("unreachable", 0) + 1, counts


def sandbox_pids() -> list[int]:
    """The host's processes running as one of the daemon's sandbox uids."""
    base = 491000 + os.getpid() % 1000 * 20
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uid = int(status.split("\nUid:")[1].split()[0])
            if base <= uid < base + UIDS:
                found.append(int(entry))
    return found


def memory_holds(pid: int, needles: list[bytes]) -> set[bytes]:
    """Which of ``needles`` the readable memory of ``pid`` holds (read as root)."""
    found: set[bytes] = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if perms[0] != "r" or "[vvar" in line or "[vsyscall]" in line:
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                data = os.pread(mem.fileno(), end - start, start)
            except OSError:
                continue
            found.update(needle for needle in needles if needle in data)
    return found


def test_the_sandbox_never_holds_the_value(rules: Ruled) -> None:
    env = exec_out(rules.daemon, rules.rid, "env")
    assert "rules33" not in env and SECRET not in env
    rules.recorder.seen.clear()
    result: list[Any] = []
    client = threading.Thread(
        target=lambda: result.append(talk(rules, [{"host": API}, {"host": API}], stop="stop"))
    )
    client.start()
    try:
        stopped: list[int] = []
        for _ in range(200):
            stopped = [
                pid
                for pid in sandbox_pids()
                if "\nState:\tT" in Path(f"/proc/{pid}/status").read_text()
            ]
            if stopped:
                break
            time.sleep(0.05)
        assert stopped, "the sandbox's client never stopped"
        assert [auth_of(seen) for seen in rules.recorder.seen] == [[SECRET]] * 2
        canary, secret = ("canary-" + str(12345 * 7)).encode(), SECRET.encode()
        assert memory_holds(stopped[0], [canary, secret]) == {canary}  # the scan sees memory
        for pid in sandbox_pids():
            assert secret not in memory_holds(pid, [secret]), pid
    finally:
        for pid in sandbox_pids():
            os.kill(pid, signal.SIGCONT)
        client.join(30)
    assert [answer["n"] for answer in result[0]] == [1, 2]
    for path in rules.daemon.root.rglob("*"):  # the sandbox's files, the daemon's state
        if path.is_file() and not path.is_symlink():
            try:
                assert SECRET.encode() not in path.read_bytes(), path
            except OSError:
                continue
    assert SECRET not in rules.daemon.log.read_text()
