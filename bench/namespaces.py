"""What the namespace layers cost: create, ``exec true`` and kill with them on and off.

    python bench/namespaces.py [--rounds N]     # as root (isolated daemons)

Two isolated daemons, ``SANDBOXD_NAMESPACES=all`` (network ``none``) and ``none``, driven over
one kept-alive loopback connection each, in interleaved rounds (so a busy machine weighs on
both alike): per round and daemon, a create, ``exec true`` three times, and a kill. Prints
p50 and p90 of each in milliseconds.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.sbench import procs  # noqa: E402
from bench.sbench.rawhttp import RawHTTP  # noqa: E402
from bench.sbench.stats import pct  # noqa: E402

LAYERS = {"all": {"SANDBOXD_NAMESPACES": "all"}, "none": {"SANDBOXD_NAMESPACES": "none"}}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="sandboxd-bench-ns-"))
    servers = {}
    try:
        for name, settings in LAYERS.items():
            servers[name] = procs.start_sandboxd(f"ns-{name}", True, work, settings)
        http = {name: RawHTTP(server.port) for name, server in servers.items()}
        samples: dict[str, dict[str, list[float]]] = {
            name: {"create": [], "exec true": [], "kill": []} for name in servers
        }
        for _ in range(args.rounds):
            for name, conn in http.items():
                figures = samples[name]
                conn.ready()
                start = time.perf_counter()
                rid = conn.json("POST", "/sandboxes", {})["remote_id"]
                figures["create"].append(time.perf_counter() - start)
                for _ in range(3):
                    figures["exec true"].append(
                        conn.timed("POST", f"/sandboxes/{rid}/exec", {"cmd": ["true"]})
                    )
                figures["kill"].append(conn.timed("DELETE", f"/sandboxes/{rid}"))
        print(f"{'namespaces':12} {'what':10} {'p50 ms':>8} {'p90 ms':>8}")
        for name, figures in samples.items():
            for what, values in figures.items():
                p50, p90 = pct(values, 0.5) * 1000, pct(values, 0.9) * 1000
                print(f"{name:12} {what:10} {p50:8.2f} {p90:8.2f}")
        print(f"loadavg after: {procs.loadavg()}")
    finally:
        for server in servers.values():
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
