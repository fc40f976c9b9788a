"""Contexts (docs/extensions.rst, "Contexts"): ``run_code("1")`` round trips, warm (p50/p90)
and cold (a new context's first execution, its kernel started), through the native API and
through the unmodified ``e2b-code-interpreter`` SDK on the E2B front, on one daemon.

    python bench/code_interpreter.py                 # --isolation=none
    sudo .venv/bin/python bench/code_interpreter.py --isolated

Prints the figures in ms as JSON. The SDK's include its own client work (httpx, a new
connection per cell).
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from sbench.rawhttp import RawHTTP  # noqa: E402
from sbench.stats import pct  # noqa: E402

from tests.support.daemon import free_port, start_daemon, stop_daemon  # noqa: E402


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": pct(samples, 0.5) * 1e3, "p90_ms": pct(samples, 0.9) * 1e3}


def timed(call: Any) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isolated", action="store_true")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--cold-runs", type=int, default=5)
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as work:
        flags = [f"--e2b-listen=tcp:{port}:interface=127.0.0.1", "--network-allow=none"]
        if not args.isolated:
            flags.append("--isolation=none")
        daemon = start_daemon(Path(work), *flags)
        os.environ.update(
            E2B_API_URL=f"http://127.0.0.1:{port}",
            E2B_SANDBOX_URL=f"http://127.0.0.1:{port}",
            E2B_API_KEY="bench",
            NO_PROXY="127.0.0.1,localhost",
        )
        from e2b_code_interpreter import Sandbox

        try:
            native = RawHTTP(daemon.port)
            rid = native.json("POST", "/sandboxes", {})["remote_id"]
            run = f"/sandboxes/{rid}/contexts/{{}}/run"
            times: dict[str, list[float]] = {k: [] for k in ("native_warm", "sdk_warm")}
            times.update({"native_cold": [], "sdk_cold": []})
            for _ in range(args.cold_runs):
                start = time.perf_counter()
                cid = native.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
                native.timed("POST", run.format(cid), {"code": "1"})
                times["native_cold"].append(time.perf_counter() - start)
                native.timed("DELETE", f"/sandboxes/{rid}/contexts/{cid}", None)
            cid = native.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
            with Sandbox.create(allow_internet_access=False) as box:
                for _ in range(args.cold_runs):
                    start = time.perf_counter()
                    context = box.create_code_context()  # answered once its kernel is ready
                    box.run_code("1", context=context)
                    times["sdk_cold"].append(time.perf_counter() - start)
                    box.remove_code_context(context)
                box.run_code("1")
                for _ in range(args.runs):
                    times["native_warm"].append(
                        native.timed("POST", run.format(cid), {"code": "1"})
                    )
                    times["sdk_warm"].append(timed(lambda: box.run_code("1")))
            rows: dict[str, Any] = {"isolated": args.isolated, "runs": args.runs}
            rows.update({name: summary(samples) for name, samples in times.items()})
            print(json.dumps(rows, indent=2))
        finally:
            stop_daemon(daemon)


if __name__ == "__main__":
    main()
