"""Contexts (docs/extensions.rst, "Contexts"): ``run_code("1")`` round trips, warm (p50/p90)
and cold (a new context's first execution, its kernel started), through the native API and
through the unmodified ``e2b-code-interpreter`` SDK on the E2B front, on one daemon; the same
for a bash context (``true``); and the HTTP floor beside them (a ``GET`` of the sandbox's
contexts on the same connection), with the load average before and after.

    python bench/code_interpreter.py                 # --isolation=none
    sudo .venv/bin/python bench/code_interpreter.py --isolated

Prints the figures in ms as JSON; ``bench/run`` records them as rows (section ``contexts``).
The SDK's include its own client work (httpx, a new connection per cell).
"""

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.sbench.rawhttp import RawHTTP  # noqa: E402
from bench.sbench.stats import pct  # noqa: E402
from tests.support.daemon import free_port, start_daemon, stop_daemon  # noqa: E402

ROWS = (
    "native_warm",
    "sdk_warm",
    "native_cold",
    "sdk_cold",
    "native_bash_warm",
    "native_bash_cold",
    "http_floor",
)


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": pct(samples, 0.5) * 1e3, "p90_ms": pct(samples, 0.9) * 1e3}


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def measure(isolated: bool, runs: int, cold_runs: int) -> dict[str, Any]:
    """Every figure of :data:`ROWS` (p50/p90 in ms), on a daemon of its own."""
    port = free_port()
    with tempfile.TemporaryDirectory() as work:
        flags = [f"--e2b-listen=tcp:{port}:interface=127.0.0.1"]
        flags.append("--network-allow=none" if isolated else "--isolation=none")
        daemon = start_daemon(Path(work), *flags)
        os.environ.update(
            E2B_API_URL=f"http://127.0.0.1:{port}",
            E2B_SANDBOX_URL=f"http://127.0.0.1:{port}",
            E2B_API_KEY="bench",
            NO_PROXY="127.0.0.1,localhost",
        )
        from e2b_code_interpreter import Sandbox

        load_start = loadavg()
        try:
            native = RawHTTP(daemon.port)
            rid = native.json("POST", "/sandboxes", {})["remote_id"]
            contexts = f"/sandboxes/{rid}/contexts"
            run = contexts + "/{}/run"
            times: dict[str, list[float]] = {name: [] for name in ROWS}
            for language, code, row in (("python", "1", "native_cold"), ("bash", "true", None)):
                for _ in range(cold_runs):
                    start = time.perf_counter()
                    cid = native.json("POST", contexts, {"language": language})["id"]
                    native.timed("POST", run.format(cid), {"code": code})
                    times[row or "native_bash_cold"].append(time.perf_counter() - start)
                    native.timed("DELETE", f"{contexts}/{cid}", None)
            cid = native.json("POST", contexts, {})["id"]
            bash = native.json("POST", contexts, {"language": "bash"})["id"]
            with Sandbox.create(**({"allow_internet_access": False} if isolated else {})) as box:
                for _ in range(cold_runs):
                    start = time.perf_counter()
                    context = box.create_code_context()  # answered once its kernel is ready
                    box.run_code("1", context=context)
                    times["sdk_cold"].append(time.perf_counter() - start)
                    box.remove_code_context(context)
                box.run_code("1")
                for _ in range(runs):
                    times["http_floor"].append(native.timed("GET", contexts))
                    times["native_warm"].append(
                        native.timed("POST", run.format(cid), {"code": "1"})
                    )
                    times["native_bash_warm"].append(
                        native.timed("POST", run.format(bash), {"code": "true"})
                    )
                    times["sdk_warm"].append(timed(lambda: box.run_code("1")))
            figures: dict[str, Any] = {"isolated": isolated, "runs": runs}
            figures.update({name: summary(samples) for name, samples in times.items()})
            figures["loadavg"] = [load_start, loadavg()]
            return figures
        finally:
            stop_daemon(daemon)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isolated", action="store_true")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--cold-runs", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(measure(args.isolated, args.runs, args.cold_runs), indent=2))


if __name__ == "__main__":
    main()
