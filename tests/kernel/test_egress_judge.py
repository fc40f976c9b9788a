"""The egress judge on a real kernel: ``sandboxd-judge`` bound to a real NFQUEUE behind the rules
of :mod:`sandboxd.isolation.network.egress_judge_plan`, in a router namespace between a
"sandbox" namespace and an "internet" one (all made here; nothing leaves them). The test plays
the daemon on the judge's stdin and stdout (policies, resolved names).

Each protection is tried for real and, where it is the rules' doing, shown failing without
them (the sandbox's veth left out of the ``judged`` set: the kernel forwards everything).
"""

import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from sandboxd.isolation.exec.helper_build import JUDGE, build, find_compiler
from sandboxd.isolation.network.egress_judge_plan import (
    judge_argv,
    judge_chains,
    queue_rule,
    verdict_rules,
)
from sandboxd.isolation.network.egress_policy import PROXIED_PORTS
from tests.kernel.netns_helpers import EGRESS_MARKS, Scene, in_netns, scene, sh

pytestmark = [
    *EGRESS_MARKS,
    pytest.mark.skipif(find_compiler() is None, reason="no C compiler here"),
    pytest.mark.skipif(
        subprocess.run(["sh", "-c", "command -v iptables-nft"], capture_output=True).returncode
        != 0,
        reason="needs iptables-nft",
    ),
]

SANDBOX = "198.18.50.2"
UPLINK = "198.18.51.1"
ALLOWED_AT = "198.18.51.2"
"""Where ``allowed.test`` (and ``other.test``) resolve."""
ELSEWHERE = "198.18.51.3"
"""An address no allowed name resolves to."""
NAMES = {
    "allowed.test": [ALLOWED_AT],
    "api.wild.test": [ALLOWED_AT],
    "other.test": [ALLOWED_AT],
    "nowhere.test": [],
}
QUEUE = 9


class Internet:
    """Servers on ports 80 and 443 of both internet addresses; each records what it received
    and answers ``hello from ADDRESS`` (after the request, or at once when ``speaks_first``)."""

    def __init__(self, netns: str) -> None:
        self.received: list[bytes] = []
        self.socks: list[socket.socket] = []
        self.speaks_first = False
        self.resets = False
        """Each answer ends with a reset from the server's side."""
        for address in (ALLOWED_AT, ELSEWHERE):
            for port in PROXIED_PORTS:
                sock = in_netns(netns, partial(self._listen, address, port))
                self.socks.append(sock)
                threading.Thread(target=self._serve, args=(sock, address), daemon=True).start()

    @staticmethod
    def _listen(address: str, port: int) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((address, port))
        s.listen(64)
        return s

    def _serve(self, sock: socket.socket, address: str) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn, address), daemon=True).start()

    def _answer(self, conn: socket.socket, address: str) -> None:
        answer = f"hello from {address}".encode()
        with conn:
            conn.settimeout(3)
            try:
                if self.speaks_first:
                    conn.sendall(answer)
                got = b""
                while b"\r\n\r\n" not in got and len(got) < 20000:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    got += chunk
                if got:
                    self.received.append(got)
                    conn.sendall(answer)
                if self.resets:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


class Judge:
    """``sandboxd-judge`` in the router's namespace, with the test as its daemon: it answers
    ``resolve`` from :data:`NAMES` and keeps the ``refused`` lines."""

    def __init__(self, program: Path, router: str) -> None:
        argv = judge_argv(str(program), QUEUE)
        self.process = subprocess.Popen(
            ["nsenter", f"--net={router}", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        assert self.process.stdout.readline() == "ready\n"
        self.refused: list[list[str]] = []
        self.resolved: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            words = line.split()
            if words[0] == "resolve":
                self.resolved.append(words[1])
                self.send(f"addresses {words[1]} 60 {' '.join(NAMES.get(words[1], []))}")
            elif words[0] == "refused":
                self.refused.append(words[1:])

    def refusals(self, count: int) -> list[list[str]]:
        """The ``refused`` lines, once ``count`` came (or after 3 s: the test then fails)."""
        deadline = time.monotonic() + 3
        while len(self.refused) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.refused

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("judge") / "sandboxd-judge"
    assert build(target, program=JUDGE)
    return target


RESTART = "tcp flags & (syn | ack) == syn"
"""What makes each SYN restart its connection's judgement in the judge's rules."""
ONLY_NEW = "ct state new"
"""The same rule without it (the protection off): pending only when conntrack sees a new one."""


class World:
    def __init__(self, s: Scene, judged: bool, restart: bool = True) -> None:
        self.sandbox = s.netns("sandbox")
        self.router = s.netns("router")
        inet = s.netns("internet")
        sh("ip", "link", "add", "sbx0", "netns", self.router, "type", "veth", "peer", "name",
           "eth0", "netns", self.sandbox)  # fmt: skip
        sh("ip", "link", "add", "up0", "netns", self.router, "type", "veth", "peer", "name",
           "eth0", "netns", inet)  # fmt: skip
        router = ["nsenter", f"--net={self.router}"]
        sh(*router, "ip", "-batch", "-", stdin=(
            "addr add 198.18.50.1/24 dev sbx0\nlink set sbx0 up\n"
            f"addr add {UPLINK}/24 dev up0\nlink set up0 up\n"))  # fmt: skip
        sh(*router, "sysctl", "-q", "net.ipv4.ip_forward=1")
        sh("nsenter", f"--net={self.sandbox}", "ip", "-batch", "-", stdin=(
            f"addr add {SANDBOX}/24 dev eth0\nlink set eth0 up\n"
            "route add default via 198.18.50.1\n"))  # fmt: skip
        sh("nsenter", f"--net={inet}", "ip", "-batch", "-", stdin=(
            f"addr add {ALLOWED_AT}/24 dev eth0\naddr add {ELSEWHERE}/24 dev eth0\n"
            f"link set eth0 up\nroute add default via {UPLINK}\n"))  # fmt: skip
        verdicts = "\n    ".join(verdict_rules())
        chains = judge_chains('"sbx*"', PROXIED_PORTS)
        assert RESTART in chains
        chains = chains if restart else chains.replace(RESTART, ONLY_NEW)
        ruleset = f"""table inet judge_test {{
{chains}  chain forward {{
    type filter hook forward priority 0; policy accept;
    iifname "sbx*" jump from_sandbox
  }}
  chain from_sandbox {{
    {verdicts}
  }}
}}
"""
        if judged:
            ruleset += 'add element inet judge_test judged { "sbx0" }\n'
        sh(*router, "nft", "-f", "-", stdin=ruleset)
        sh(*router, "nft", "list", "table", "inet", "judge_test")  # (nft 1.0.6 lists it too)
        sh(*router, "iptables-nft", "-t", "mangle", "-I", *queue_rule(QUEUE))
        self.internet = Internet(inet)
        s.servers.append(self.internet)  # type: ignore[arg-type]

    def ifindex(self) -> int:
        out = sh("nsenter", f"--net={self.router}", "ip", "-o", "link", "show", "sbx0")
        return int(out.split(":", 1)[0])


def exchange(
    w: World,
    address: str,
    port: int,
    *chunks: bytes,
    wait: float = 3.0,
    source_port: int = 0,
    server_ends: bool = False,
) -> str:
    """Connect from the sandbox (from ``source_port`` when given), send ``chunks`` (a pause
    between them), read the answer: ``"reset"``, ``"timeout"``, ``"closed"`` or the answer's
    text, or ``"refused"`` when the connection is not made. The connection ends with a reset
    (no TIME_WAIT: its ports may be used again): the sandbox's, or with ``server_ends`` the
    server's, waited for after the answer (the sandbox then sends nothing more)."""

    def attempt() -> str:
        with socket.socket() as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if source_port:
                s.bind((SANDBOX, source_port))
            s.settimeout(wait)
            try:
                s.connect((address, port))
                for i, chunk in enumerate(chunks):
                    if i:
                        time.sleep(0.2)
                    s.sendall(chunk)
                got = s.recv(1000)
                if got and server_ends:
                    wait_for_the_end(s)
                return got.decode() if got else "closed"
            except ConnectionResetError:
                return "reset"
            except ConnectionRefusedError:
                return "refused"
            except TimeoutError:
                return "timeout"

    return in_netns(w.sandbox, attempt)


def wait_for_the_end(s: socket.socket) -> None:
    """Read until the server closes or resets ``s``."""
    try:
        while s.recv(1000):
            pass
    except ConnectionResetError:
        pass


def get(host: str) -> bytes:
    return f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def client_hello(name: str, padding: int = 0) -> bytes:
    """A TLS ClientHello naming ``name``, with ``padding`` bytes of a padding extension (a
    larger ClientHello than one segment, as post-quantum key shares make them)."""
    entry = b"\x00" + struct.pack("!H", len(name)) + name.encode()
    sni = struct.pack("!H", len(entry)) + entry
    extensions = struct.pack("!HH", 0, len(sni)) + sni
    extensions += struct.pack("!HH", 21, padding) + b"\x00" * padding
    hello = b"\x03\x03" + os.urandom(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    hello += struct.pack("!H", len(extensions)) + extensions
    handshake = b"\x01" + struct.pack("!I", len(hello))[1:] + hello
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake + b"\r\n\r\n"


@pytest.fixture
def world(program: Path) -> Iterator[tuple[World, Judge]]:
    with scene() as s:
        w = World(s, judged=True)
        judge = Judge(program, w.router)
        judge.send(f"policy {w.ifindex()} 0 1 +allowed.test +*.wild.test")
        try:
            yield w, judge
        finally:
            judge.close()


def test_an_allowed_name_goes_through_the_kernel(world: tuple[World, Judge]) -> None:
    w, judge = world
    assert exchange(w, ALLOWED_AT, 80, get("allowed.test")) == f"hello from {ALLOWED_AT}"
    assert exchange(w, ALLOWED_AT, 80, get("allowed.test")) == f"hello from {ALLOWED_AT}"
    assert judge.resolved == ["allowed.test"]  # (the second connection's name was kept)
    assert w.internet.received == [get("allowed.test")] * 2
    assert judge.refused == []


def test_names_the_policy_refuses_are_reset_before_a_byte_leaves(
    world: tuple[World, Judge],
) -> None:
    w, judge = world
    assert exchange(w, ALLOWED_AT, 80, get("other.test")) == "reset"
    assert exchange(w, ELSEWHERE, 80, get("allowed.test")) == "reset"  # not where it resolves
    assert exchange(w, ALLOWED_AT, 80, get("nowhere.test")) == "reset"
    assert exchange(w, ALLOWED_AT, 80, b"SSH-2.0-x\r\n\r\n") == "reset"
    assert w.internet.received == []
    reasons = [(words[1], words[2], words[3:]) for words in judge.refusals(4)]
    assert reasons == [
        ("not_allowed", ALLOWED_AT, ["other.test"]),
        ("mismatch", ELSEWHERE, ["allowed.test"]),
        ("unresolved", ALLOWED_AT, ["nowhere.test"]),
        ("no_name", ALLOWED_AT, []),
    ]
    assert {words[0] for words in judge.refused} == {str(w.ifindex())}


def test_a_new_connection_on_the_same_ports_is_judged_afresh(
    world: tuple[World, Judge],
) -> None:
    """A verdict kept for the packets queued before it never passes a later connection that
    uses the same addresses and ports (a sandbox chooses its source port)."""
    w, judge = world
    allowed = exchange(w, ALLOWED_AT, 80, get("allowed.test"), source_port=40404)
    assert allowed == f"hello from {ALLOWED_AT}"
    assert exchange(w, ALLOWED_AT, 80, get("other.test"), source_port=40404) == "reset"
    assert w.internet.received == [get("allowed.test")]
    assert [words[1:] for words in judge.refusals(1)] == [["not_allowed", ALLOWED_AT, "other.test"]]


def test_a_connection_the_server_reset_lends_no_verdict(program: Path) -> None:
    """The kernel may take a new connection on the ports of one the server reset for the same
    connection (the same conntrack entry, its mark): each handshake is judged anew. With the
    SYN's restart replaced by ``ct state new`` (the protection off), the refused name gets
    through on the allowed connection's verdict."""
    for restart in (True, False):
        with scene() as s:
            w = World(s, judged=True, restart=restart)
            judge = Judge(program, w.router)
            judge.send(f"policy {w.ifindex()} 0 1 +allowed.test")
            w.internet.resets = True
            try:
                answers = []
                for _ in range(2):
                    allowed = exchange(
                        w, ALLOWED_AT, 80, get("allowed.test"), source_port=40405, server_ends=True
                    )
                    assert allowed == f"hello from {ALLOWED_AT}"
                    answers.append(
                        exchange(w, ALLOWED_AT, 80, get("other.test"), source_port=40405)
                    )
            finally:
                judge.close()
            if restart:
                assert answers == ["reset"] * 2
                assert w.internet.received == [get("allowed.test")] * 2
                refused = [words[1:] for words in judge.refusals(2)]
                assert refused == [["not_allowed", ALLOWED_AT, "other.test"]] * 2
            else:
                assert answers == [f"hello from {ALLOWED_AT}"] * 2
                assert get("other.test") in w.internet.received


def test_a_name_split_over_segments_is_gathered(world: tuple[World, Judge]) -> None:
    w, judge = world
    request = get("api.wild.test")
    assert exchange(w, ALLOWED_AT, 80, request[:7], request[7:20], request[20:]) == (
        f"hello from {ALLOWED_AT}"
    )
    big = client_hello("api.wild.test", padding=4000)  # three segments at a 1500-byte MTU
    assert exchange(w, ALLOWED_AT, 443, big) == f"hello from {ALLOWED_AT}"
    assert exchange(w, ALLOWED_AT, 443, client_hello("other.test", padding=4000)) == "reset"
    assert w.internet.received == [request, big]
    assert [words[1:] for words in judge.refusals(1)] == [["not_allowed", ALLOWED_AT, "other.test"]]


def test_data_never_reaches_an_unjudged_destination(program: Path) -> None:
    """A few bytes that carry no name yet stay with the judge (then are refused); a server that
    speaks first reaches the sandbox only after a verdict. Without the judged set, both get
    through."""
    for judged in (True, False):
        with scene() as s:
            w = World(s, judged=judged)
            judge = Judge(program, w.router)
            judge.send(f"policy {w.ifindex()} 0 1 +allowed.test")
            try:
                got = exchange(w, ELSEWHERE, 80, b"abc", b"\r\n\r\n", wait=1.0)
                w.internet.speaks_first = True
                first = exchange(w, ELSEWHERE, 80, wait=1.0)
            finally:
                judge.close()
            if judged:
                assert (got, first) == ("reset", "timeout")
                assert w.internet.received == []
            else:
                assert (got, first) == (f"hello from {ELSEWHERE}", f"hello from {ELSEWHERE}")
                assert w.internet.received == [b"abc\r\n\r\n"]


def test_without_a_judge_nothing_leaves(world: tuple[World, Judge]) -> None:
    w, judge = world
    judge.close()
    assert exchange(w, ALLOWED_AT, 80, get("allowed.test"), wait=1.0) == "timeout"
    assert w.internet.received == []


def test_the_judge_keeps_only_what_its_verdicts_need(world: tuple[World, Judge]) -> None:
    """Once bound, the judge is nobody with CAP_NET_ADMIN alone, no_new_privs and a filter."""
    w, judge = world
    assert exchange(w, ALLOWED_AT, 80, get("allowed.test")) == f"hello from {ALLOWED_AT}"
    status = dict(
        line.split(":\t", 1)
        for line in Path(f"/proc/{judge.process.pid}/status").read_text().splitlines()
    )
    assert status["Uid"].split() == ["65534"] * 4 and status["Gid"].split() == ["65534"] * 4
    assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == 1 << 12  # CAP_NET_ADMIN
    assert (status["NoNewPrivs"], status["Seccomp"]) == ("1", "2")


def test_the_judges_filter_kills_what_its_loop_never_does(program: Path) -> None:
    """Confined, a new socket kills the judge (SIGSYS); without the filter it is made."""
    confined = subprocess.run([str(program), "confine-check"], capture_output=True, check=False)
    assert confined.returncode == -signal.SIGSYS
    unfiltered = subprocess.run(
        [str(program), "confine-check", "none"], capture_output=True, check=False
    )
    assert unfiltered.returncode == 3  # the socket was made


def test_one_sandbox_holds_at_most_a_mebibyte_of_first_bytes(world: tuple[World, Judge]) -> None:
    """ClientHellos that never end are held (each as far as its first flight, 14 to 15 KB)
    until the sandbox's connections hold 1 MiB; those past it are refused (too_many)."""
    w, judge = world
    partial = b"\x16\x03\x01\x3e\x80" + b"\x01" * 15000  # a 16 000-byte record, never finished

    def hold(count: int) -> list[socket.socket]:
        held = []
        for _ in range(count):
            s = socket.socket()
            s.settimeout(3)
            s.connect((ALLOWED_AT, 443))
            s.sendall(partial)
            held.append(s)
        return held

    held = in_netns(w.sandbox, lambda: hold(80))
    try:
        judge.refusals(1)
        time.sleep(0.5)
        reasons = [words[1] for words in judge.refused]
        assert reasons and set(reasons) == {"too_many"}
        assert 68 <= 80 - len(reasons) <= 76  # held: 1 MiB of first flights, no more
    finally:
        for s in held:
            s.close()
    assert w.internet.received == []
