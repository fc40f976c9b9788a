"""What egress by name costs a sandbox (issue 33): a small HTTP request's latency and a large
download's throughput, direct against through the daemon's egress proxy (or, with ``--judge``,
judged in the kernel's path: ``SANDBOXD_EGRESS_JUDGE=on``).

    sudo .venv/bin/python bench/egress_names.py [--rounds N] [--requests N] [--bulk-bytes B]
        [--judge]

As root, with nftables: builds the egress tests' "internet" (``tests/kernel/names_internet``:
a namespace of its own behind a veth, an HTTP server on 198.51.100.1:80 and a DNS server
answering ``bulk.example`` with that address, nothing leaving the machine), starts one daemon
(``--network-allow=egress``, the proxy resolving with that DNS server) and two sandboxes:
``direct`` (egress, no names: its packets are forwarded by the kernel) and ``proxied``
(``allow_out: ["bulk.example"]``: its TCP to port 80 is redirected to the proxy; with
``--judge`` it is called ``judged``, and its connections' first bytes are judged). In
interleaved rounds, a program in each sandbox times ``--requests`` small requests (connect,
``GET /small``, the answer, the close; after a few unmeasured ones: the proxy's lookup) and
one ``GET /bulk/B`` (from the request to the last byte). Prints JSON: the samples (seconds)
of each sandbox, and the load average before and after.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.kernel.names_internet import BulkServer, NameServer
from tests.kernel.netns_helpers import scene
from tests.kernel.test_egress_daemon import exec_out
from tests.support.daemon import Daemon, start_daemon, stop_daemon

SERVER, DNS, HOST = "198.51.100.1", "198.51.100.53", "198.51.100.254"
NAME = "bulk.example"
VARIANTS = {"direct": {"mode": "egress"}, "proxied": {"mode": "egress", "allow_out": [NAME]}}

MEASURE = """
import json, socket, sys, time
name, address, what, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
buffer = bytearray(1 << 20)
def get(path):
    s = socket.create_connection((address, 80), timeout=60)
    s.sendall(f"GET {path} HTTP/1.1\\r\\nHost: {name}\\r\\nConnection: close\\r\\n\\r\\n".encode())
    total = 0
    while n := s.recv_into(buffer):
        total += n
    s.close()
    return total
if what == "small":
    for _ in range(3):
        get("/small")
    times = []
    for _ in range(count):
        start = time.perf_counter()
        get("/small")
        times.append(time.perf_counter() - start)
    print(json.dumps(times))
else:
    start = time.perf_counter()
    got = get(f"/bulk/{count}")
    seconds = time.perf_counter() - start
    assert got > count, got
    print(json.dumps([seconds]))
"""


def measure(daemon: Daemon, rid: str, what: str, count: int) -> list[float]:
    """The seconds a program in sandbox ``rid`` measured (see :data:`MEASURE`)."""
    out = exec_out(daemon, rid, "python3", "-c", MEASURE, NAME, SERVER, what, str(count))
    samples: list[float] = json.loads(out)
    return samples


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(rounds: int, requests: int, bulk_bytes: int, judge: bool = False) -> dict[str, Any]:
    figures: dict[str, Any] = {"small": {}, "bulk": {}, "bulk_bytes": bulk_bytes}
    variants = dict(VARIANTS)
    if judge:
        variants["judged"] = variants.pop("proxied")
    figures["loadavg_before"] = loadavg()
    with scene() as s, tempfile.TemporaryDirectory(prefix="egress-bench-") as tmp:
        inet = s.netns("inet")
        s.wire("b", inet, [f"{HOST}/24"], [f"{SERVER}/24", f"{DNS}/24"])
        servers: list[BulkServer | NameServer] = [
            BulkServer(inet, SERVER, 80),
            NameServer(inet, DNS, {NAME: [SERVER]}),
        ]
        base = 470000 + os.getpid() % 1000 * 20
        daemon = start_daemon(
            Path(tmp),
            f"--uid-min={base}",
            f"--uid-max={base + 3}",
            "--network-allow=egress",
            env={"SANDBOXD_EGRESS_DNS": DNS, "SANDBOXD_EGRESS_JUDGE": "on" if judge else "off"},
        )
        try:
            rids = {}
            for variant, network in variants.items():
                status, body = daemon.call("POST", "/sandboxes", {"network": network})
                assert status == 200, body
                rids[variant] = json.loads(body)["remote_id"]
            for _ in range(rounds):
                for variant, rid in rids.items():
                    small = measure(daemon, rid, "small", requests)
                    figures["small"].setdefault(variant, []).extend(small)
                    bulk = measure(daemon, rid, "bulk", bulk_bytes)
                    figures["bulk"].setdefault(variant, []).extend(bulk)
        finally:
            stop_daemon(daemon)
            for server in servers:
                server.close()
    figures["loadavg_after"] = loadavg()
    return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--bulk-bytes", type=int, default=64 << 20)
    parser.add_argument("--judge", action="store_true", help="judged, not proxied")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 1
    print(json.dumps(run(args.rounds, args.requests, args.bulk_bytes, args.judge)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
