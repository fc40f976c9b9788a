"""What the egress network mode costs through the daemon: create, ``exec true`` and kill.

    sudo .venv/bin/python bench/egress_daemon.py [--rounds N]

One isolated daemon with ``SANDBOXD_NETWORK_ALLOW=none,egress``, driven over one kept-alive
loopback connection, in interleaved rounds (a busy machine weighs on both alike): per round
and mode, a create with that ``network``, ``exec true`` three times, and a kill. Prints p50 and
p90 of each in milliseconds. The daemon removes its table and veths when it stops.
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

MODES = ("none", "egress")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="sandboxd-bench-egress-"))
    server = procs.start_sandboxd("egress", True, work, {"SANDBOXD_NETWORK_ALLOW": "none,egress"})
    try:
        conn = RawHTTP(server.port)
        samples: dict[str, dict[str, list[float]]] = {
            mode: {"create": [], "exec true": [], "kill": []} for mode in MODES
        }
        for _ in range(args.rounds):
            for mode in MODES:
                figures = samples[mode]
                conn.ready()
                start = time.perf_counter()
                rid = conn.json("POST", "/sandboxes", {"network": mode})["remote_id"]
                figures["create"].append(time.perf_counter() - start)
                for _ in range(3):
                    figures["exec true"].append(
                        conn.timed("POST", f"/sandboxes/{rid}/exec", {"cmd": ["true"]})
                    )
                figures["kill"].append(conn.timed("DELETE", f"/sandboxes/{rid}"))
        print(f"{'network':10} {'what':10} {'p50 ms':>8} {'p90 ms':>8}")
        for mode, values_by_what in samples.items():
            for what, values in values_by_what.items():
                p50, p90 = pct(values, 0.5) * 1000, pct(values, 0.9) * 1000
                print(f"{mode:10} {what:10} {p50:8.2f} {p90:8.2f}")
        print(f"loadavg after: {procs.loadavg()}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
