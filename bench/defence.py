"""Self-defence (issue 15): another sandbox's exec while unauthenticated requests are in flight.

    python bench/defence.py                 # this tree's daemon, --isolation=none
    python bench/defence.py --isolated      # as root: real isolation
    python bench/defence.py --in-flight 1000 --runs 300

For each ``SANDBOXD_AUTH_GATE`` (``headers``, then ``off``: the 401 only once the body is
stored), a daemon with a token: ``exec true`` p50/p99 of an authenticated client, first
quiet, then while an attacker process keeps ``--in-flight`` unauthenticated ``POST
/sandboxes/…/file`` requests (64 KiB bodies) open at all times, each connection replaced by a
new one as soon as it is answered or closed. Also the daemon's RSS and descriptors at the end.
"""

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.sbench import procs  # noqa: E402
from bench.sbench.rawhttp import RawHTTP  # noqa: E402
from bench.sbench.stats import pct  # noqa: E402

ATTACKER = r"""
import resource, selectors, socket, sys
port, in_flight = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (in_flight + 256, in_flight + 256))
body = b"x" * 65536
head = (b"POST /sandboxes/0123456789abcdef/file?path=a HTTP/1.1\r\nhost: x\r\n"
        b"content-length: %d\r\n\r\n" % len(body))
selector = selectors.DefaultSelector()
def open_one():
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    selector.register(s, selectors.EVENT_WRITE, [head + body])
for _ in range(in_flight):
    open_one()
while True:
    for key, events in selector.select(0.5):
        s, pending = key.fileobj, key.data
        try:
            if events & selectors.EVENT_WRITE and pending[0]:
                sent = s.send(pending[0])
                pending[0] = pending[0][sent:]
                if not pending[0]:
                    selector.modify(s, selectors.EVENT_READ, pending)
                continue
            data = s.recv(65536)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            data = b""
        selector.unregister(s)
        s.close()
        open_one()
"""


def exec_true(http: RawHTTP, rid: str, runs: int) -> dict[str, float]:
    samples = [http.timed("POST", f"/sandboxes/{rid}/exec", {"cmd": ["true"]}) for _ in range(runs)]
    return {"p50_ms": pct(samples, 0.5) * 1e3, "p99_ms": pct(samples, 0.99) * 1e3}


def one_gate(gate: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    token = "sbx-" + secrets.token_urlsafe(32)
    token_file = work / f"token-{gate}"
    token_file.write_text(token)
    token_file.chmod(0o600)
    settings = {"SANDBOXD_TOKEN_FILE": str(token_file), "SANDBOXD_AUTH_GATE": gate}
    server = procs.start_sandboxd(f"defence-{gate}", args.isolated, work, settings)
    try:
        http = RawHTTP(server.port, {"authorization": f"Bearer {token}"})
        rid = http.json("POST", "/sandboxes", {})["remote_id"]
        exec_true(http, rid, 30)  # warm-up
        quiet = exec_true(http, rid, args.runs)
        attacker = subprocess.Popen(
            [sys.executable, "-c", ATTACKER, str(server.port), str(args.in_flight)]
        )
        try:
            time.sleep(args.settle)  # the attacker's connections open
            attacked = exec_true(http, rid, args.runs)
        finally:
            attacker.terminate()
            attacker.wait()
        descriptors = len(os.listdir(f"/proc/{server.pid}/fd"))
        return {
            "gate": gate,
            "quiet": quiet,
            "attacked": attacked,
            "daemon_rss_kib": server.rss_kib(),
            "daemon_descriptors": descriptors,
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=BENCH.parent)
    parser.add_argument("--isolated", action="store_true")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--gates", default="headers,off")
    args = parser.parse_args()
    procs.REPO = args.repo.resolve()
    rows: dict[str, Any] = {
        "repo": str(procs.REPO),
        "isolated": args.isolated,
        "in_flight": args.in_flight,
    }
    with tempfile.TemporaryDirectory() as work:
        rows["gates"] = [one_gate(g, args, Path(work)) for g in args.gates.split(",")]
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
