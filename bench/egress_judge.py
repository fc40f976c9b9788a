"""What a first-payload judge in front of kernel forwarding would cost (issue 33): a small HTTP
request's latency through a router that forwards in the kernel, with and without a judge that
reads each connection's first payload from an NFQUEUE and allows it by name.

    sudo .venv/bin/python bench/egress_judge.py [--rounds N] [--requests N] [--judge-c]
                                                [--judge-fifo]

Not the daemon: the measurement its design needs first. As root, with iptables-nft (this
machine's kernel has no nftables ``queue``, but iptables-nft's ``NFQUEUE`` goes through
nft_compat): three network namespaces of this process's own (client, router, server; no
traffic leaves them), 10.9.0.0/24 and 10.9.1.0/24 between them. The router forwards; with the
judge on, its mangle ``FORWARD`` chain queues the first packet with a payload of each
connection to port 80 (not a SYN, connection mark 0) to queue 7. The judge (this file with
``--judge``, in the router's namespace: a blocking loop over a netlink socket, no reactor)
reads the name with the daemon's own :func:`~sandboxd.isolation.network.egress_names.peek_name`
and answers ``NF_REPEAT`` with mark 1 (allowed: the chain saves it as the connection's mark,
so its later packets pass in the kernel) or mark 2 (refused: rejected with a TCP reset).
With ``--judge-c`` the judge is ``egress_judge.c`` instead (the same verdicts by the HTTP
``Host`` header, built with gcc): what of a packet's cost is the interpreter's. With
``--judge-fifo`` the judge runs under ``SCHED_FIFO``: what of it is waiting to be scheduled.
In alternating rounds the client times ``--requests`` requests (connect, ``GET``, the answer,
the close) with the queue rule and without it. Prints JSON: the p50 and p90 of each round,
and a refused name's outcome.
"""

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandboxd.isolation.network.egress_names import peek_name  # noqa: E402
from tests.kernel.netns_helpers import Scene, scene, sh  # noqa: E402

ALLOWED = "bulk.example"
QUEUE = 7
RULE = ["-p", "tcp", "!", "--syn", "--dport", "80", "-m", "connmark", "--mark", "0"]
RULE += ["-m", "length", "--length", "53:65535", "-j", "NFQUEUE", "--queue-num", str(QUEUE)]
"""The judge's rule: a connection's packets to port 80 with a payload, but a SYN's, until it
has a mark."""
NETLINK_NETFILTER = 12
SUBSYS_QUEUE = 3
MSG_PACKET, MSG_VERDICT, MSG_CONFIG = 0, 1, 2
NF_REPEAT = 4
ALLOW_MARK, REFUSE_MARK = 1, 2

SERVER = """
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.9.1.2", 80))
s.listen(128)
print("up", flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(1)
    try:
        c.recv(4096)
        c.sendall(b"HTTP/1.0 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")
    except OSError:
        pass
    c.close()
"""

CLIENT = """
import json, socket, sys, time
count, name = int(sys.argv[1]), sys.argv[2].encode()
request = b"GET / HTTP/1.0\\r\\nHost: " + name + b"\\r\\n\\r\\n"
def get():
    c = socket.create_connection(("10.9.1.2", 80), timeout=3)
    try:
        c.sendall(request)
        got = b""
        while d := c.recv(4096):
            got += d
        return got.endswith(b"ok")
    except OSError as e:
        return type(e).__name__
    finally:
        c.close()
if count == 0:
    start = time.perf_counter()
    print(json.dumps([get(), time.perf_counter() - start]))
    sys.exit()
for _ in range(3):
    assert get() is True
times = []
for _ in range(count):
    start = time.perf_counter()
    assert get() is True
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def _attr(kind: int, data: bytes) -> bytes:
    length = 4 + len(data)
    return struct.pack("=HH", length, kind) + data + b"\0" * (-length % 4)


def _message(kind: int, payload: bytes) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(QUEUE)) + payload
    header = struct.pack("=IHHII", 16 + len(body), (SUBSYS_QUEUE << 8) | kind, 1, 0, 0)
    return header + body


def _packet(message: bytes) -> tuple[int, bytes]:
    """A queued packet's id and its TCP payload."""
    packet_id, ip = 0, b""
    at = 20
    while at < len(message):
        length, kind = struct.unpack_from("=HH", message, at)
        if kind & 0x7FFF == 1:  # NFQA_PACKET_HDR
            (packet_id,) = struct.unpack_from(">I", message, at + 4)
        elif kind & 0x7FFF == 10:  # NFQA_PAYLOAD
            ip = message[at + 4 : at + length]
        at += (length + 3) & ~3
    tcp = (ip[0] & 0xF) * 4
    return packet_id, ip[tcp + (ip[tcp + 12] >> 4) * 4 :]


def judge() -> None:
    """Bind queue 7 and judge every packet it is given, for ever."""
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    nl.bind((0, 0))
    nl.send(_message(MSG_CONFIG, _attr(1, struct.pack("=BBH", 1, 0, 0))))  # bind
    nl.send(_message(MSG_CONFIG, _attr(2, struct.pack(">IB", 4096, 2))))  # copy 4 KiB
    print("up", flush=True)
    while True:
        data = nl.recv(1 << 17)
        at = 0
        while at < len(data):
            (length, kind) = struct.unpack_from("=IH", data, at)
            message = data[at : at + length]
            at += (length + 3) & ~3
            if kind != (SUBSYS_QUEUE << 8) | MSG_PACKET:
                continue
            packet_id, payload = _packet(message)
            name = peek_name(payload)
            mark = ALLOW_MARK if name == ALLOWED else REFUSE_MARK
            verdict = _attr(2, struct.pack(">II", NF_REPEAT, packet_id))
            nl.send(_message(MSG_VERDICT, verdict + _attr(3, struct.pack(">I", mark))))


def started(netns: str, program: list[str], fifo: bool = False) -> subprocess.Popen[str]:
    """``program`` in ``netns`` (under ``SCHED_FIFO`` with ``fifo``), killed with this process;
    returned once it printed ``up``."""
    argv = ["setpriv", "--pdeathsig", "KILL", "nsenter", f"--net={netns}"]
    if fifo:
        argv += ["chrt", "-f", "10"]
    child = subprocess.Popen([*argv, *program], text=True, stdout=subprocess.PIPE, cwd=ROOT)
    assert child.stdout is not None and child.stdout.readline() == "up\n"
    return child


def built_judge(where: Path) -> list[str]:
    """The C judge (``egress_judge.c``), built in ``where``: its command line."""
    binary = where / "egress_judge"
    source = Path(__file__).with_suffix(".c")
    sh("gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary), str(source))
    return [str(binary), str(QUEUE), ALLOWED]


def measure(client: str, count: int, name: str = ALLOWED) -> object:
    argv = ["timeout", "-s", "KILL", "600", "nsenter", f"--net={client}", sys.executable]
    out = subprocess.run(
        [*argv, "-c", CLIENT, str(count), name], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def percentiles(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "p50_us": round(ordered[len(ordered) // 2] * 1e6, 1),
        "p90_us": round(ordered[len(ordered) * 9 // 10] * 1e6, 1),
    }


def ip_batch(netns: str, commands: str) -> None:
    sh("nsenter", f"--net={netns}", "ip", "-batch", "-", stdin=commands)


def routed(s: Scene) -> tuple[str, str, str]:
    """Client, router and server namespaces, wired and routed; the router's chains (the marks
    saved as the connection's, a refused connection reset) without the judge's rule."""
    client, router, server = s.netns("client"), s.netns("router"), s.netns("server")
    for end, net, address, gateway in (
        ("rc", client, "10.9.0.2/24", "10.9.0.1"),
        ("rs", server, "10.9.1.2/24", "10.9.1.1"),
    ):
        peer = ["peer", "name", end, "netns", router]
        sh("ip", "link", "add", "eth0", "netns", net, "type", "veth", *peer)
        ip_batch(net, f"addr add {address} dev eth0\nlink set eth0 up\n")
        ip_batch(net, f"route add default via {gateway}\n")
        ip_batch(router, f"addr add {gateway}/24 dev {end}\nlink set {end} up\n")
    sh("nsenter", f"--net={router}", "sysctl", "-qw", "net.ipv4.ip_forward=1")
    for mark in (ALLOW_MARK, REFUSE_MARK):
        save = ["-m", "mark", "--mark", str(mark), "-j", "CONNMARK", "--save-mark"]
        sh(*iptables(router, "mangle"), "-A", "FORWARD", *save)
    reset = ["-j", "REJECT", "--reject-with", "tcp-reset"]
    refused = ["-p", "tcp", "-m", "connmark", "--mark", str(REFUSE_MARK), *reset]
    sh(*iptables(router, "filter"), "-A", "FORWARD", *refused)
    return client, router, server


def iptables(netns: str, table: str) -> list[str]:
    return ["nsenter", f"--net={netns}", "iptables-nft", "-t", table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument(
        "--judge-fifo",
        action="store_true",
        help="run the judge under SCHED_FIFO (chrt -f 10): woken ahead of every other task",
    )
    parser.add_argument(
        "--judge-c", action="store_true", help="judge with egress_judge.c (built with gcc)"
    )
    parser.add_argument("--judge", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.judge:
        judge()
        return
    children: list[subprocess.Popen[str]] = []
    with scene() as s, tempfile.TemporaryDirectory() as work:
        client, router, server = routed(s)
        mangle = iptables(router, "mangle")
        judge_argv = [sys.executable, str(Path(__file__)), "--judge"]
        if options.judge_c:
            judge_argv = built_judge(Path(work))
        try:
            children.append(started(server, [sys.executable, "-c", SERVER]))
            children.append(started(router, judge_argv, fifo=options.judge_fifo))
            rounds = []
            for _ in range(options.rounds):
                direct = measure(client, options.requests)
                sh(*mangle, "-A", "FORWARD", *RULE)
                judged = measure(client, options.requests)
                sh(*mangle, "-D", "FORWARD", *RULE)
                assert isinstance(direct, list) and isinstance(judged, list)
                rounds.append({"direct": percentiles(direct), "judged": percentiles(judged)})
            sh(*mangle, "-A", "FORWARD", *RULE)
            refused = measure(client, 0, "other.example")
            load = os.getloadavg()
        finally:
            for child in children:
                child.kill()
                child.wait()
    which = "C" if options.judge_c else "Python"
    summary = {"judge": which, "fifo": options.judge_fifo, "rounds": rounds}
    print(json.dumps({**summary, "refused": refused, "load": load}, indent=1))


if __name__ == "__main__":
    main()
