"""What the ports proxy costs: a request through the daemon against the same request made
directly inside the sandbox's network namespace.

    python bench/ports.py [--rounds N]     # as root (an isolated daemon)

One isolated daemon, one sandbox running ``python3 -m http.server`` on its port 8000 (a small
file). In interleaved rounds (so a busy machine weighs on both alike): one ``GET`` through the
daemon (``/sandboxes/{rid}/ports/8000/f``, one kept-alive connection to the daemon; the daemon
connects to the sandbox anew for each request), and one made directly from a thread of this
process that entered the sandbox's pinned network namespace (a new connection each, as the
daemon's). Prints p50 and p90 of each in milliseconds and the difference of the p50s (the
proxy's overhead; docs/performance.rst).
"""

import argparse
import http.client
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.sbench import procs  # noqa: E402
from bench.sbench.rawhttp import RawHTTP  # noqa: E402
from bench.sbench.stats import pct  # noqa: E402
from sandboxd.isolation.namespaces.kinds import PIN  # noqa: E402
from sandboxd.isolation.namespaces.pins import NS_DIR  # noqa: E402
from sandboxd.ports.dial import setns_net  # noqa: E402

PORT = 8000
BODY = b"x" * 1024


def enter(pin: str) -> None:
    """A pool thread's start: into the sandbox's network namespace, for good."""
    fd = os.open(pin, os.O_RDONLY)
    try:
        setns_net(fd)
    finally:
        os.close(fd)


def direct() -> float:
    """Seconds for one ``GET /f`` to ``127.0.0.1:8000`` (inside the namespace), connection
    made anew."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", PORT)
    conn.request("GET", "/f")
    response = conn.getresponse()
    data = response.read()
    conn.close()
    elapsed = time.perf_counter() - start
    assert response.status == 200 and data == BODY, response.status
    return elapsed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=500)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="sandboxd-bench-ports-"))
    server = procs.start_sandboxd("ports", True, work)
    try:
        conn = RawHTTP(server.port)
        rid = conn.json("POST", "/sandboxes", {})["remote_id"]
        conn.request("PUT", f"/sandboxes/{rid}/file?path=f", BODY)
        cmd = ["python3", "-m", "http.server", str(PORT), "--bind", "127.0.0.1"]
        conn.json("POST", f"/sandboxes/{rid}/processes", {"cmd": cmd})
        path = f"/sandboxes/{rid}/ports/{PORT}/f"
        deadline = time.monotonic() + 30
        while conn.request("GET", path)[0] != 200:
            assert time.monotonic() < deadline, "the server in the sandbox never answered"
            time.sleep(0.1)
        assert server.root is not None  # start_sandboxd always names the state root
        pin = os.path.join(server.root, NS_DIR, rid, PIN["net"])
        samples: dict[str, list[float]] = {"proxied": [], "direct": []}
        with ThreadPoolExecutor(1, initializer=enter, initargs=(pin,)) as inside:
            for _ in range(args.rounds):
                samples["proxied"].append(conn.timed("GET", path))
                samples["direct"].append(inside.submit(direct).result())
        print(f"{'request':10} {'p50 ms':>8} {'p90 ms':>8}")
        for name, values in samples.items():
            print(f"{name:10} {pct(values, 0.5) * 1000:8.3f} {pct(values, 0.9) * 1000:8.3f}")
        overhead = pct(samples["proxied"], 0.5) - pct(samples["direct"], 0.5)
        print(f"overhead   {overhead * 1000:8.3f}   (p50 proxied - p50 direct)")
        print(f"loadavg after: {procs.loadavg()}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
