"""The E2B front beside the native API: the unmodified ``e2b`` SDK's ``Sandbox.create()``
and ``commands.run("true")`` against the native client's create and ``exec true``, on one
daemon (both listeners), interleaved run by run.

    python bench/e2b_front.py                 # --isolation=none
    sudo .venv/bin/python bench/e2b_front.py --isolated

Prints p50/p90 in ms as JSON. The SDK's figures include its own client work (httpx and
connectrpc over pyqwest, a new connection per stream on HTTP/1.1).
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
sys.path.insert(0, str(BENCH.parent))

from bench.sbench.rawhttp import RawHTTP  # noqa: E402
from bench.sbench.stats import pct  # noqa: E402
from tests.support.daemon import free_port, start_daemon, stop_daemon  # noqa: E402


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": pct(samples, 0.5) * 1e3, "p90_ms": pct(samples, 0.9) * 1e3}


def timed(call: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    value = call()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isolated", action="store_true")
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as work:
        flags = [f"--e2b-listen=tcp:{port}:interface=127.0.0.1"]
        if not args.isolated:
            flags.append("--isolation=none")
        daemon = start_daemon(Path(work), *flags)
        os.environ.update(
            E2B_API_URL=f"http://127.0.0.1:{port}",
            E2B_SANDBOX_URL=f"http://127.0.0.1:{port}",
            E2B_API_KEY="bench",
            NO_PROXY="127.0.0.1,localhost",
        )
        from e2b import Sandbox

        try:
            native = RawHTTP(daemon.port)
            times: dict[str, list[float]] = {k: [] for k in ("sdk_create", "sdk_run_true")}
            times.update({"native_create": [], "native_exec_true": []})
            sdk_box = Sandbox.create()
            rid = native.json("POST", "/sandboxes", {})["remote_id"]
            for run in range(args.runs + 5):
                created, sbx = timed(Sandbox.create)
                ran, _ = timed(lambda: sdk_box.commands.run("true"))
                made, body = timed(lambda: native.json("POST", "/sandboxes", {}))
                executed = native.timed("POST", f"/sandboxes/{rid}/exec", {"cmd": ["true"]})
                sbx.kill()
                native.timed("DELETE", f"/sandboxes/{body['remote_id']}", None)
                if run >= 5:  # warm-up
                    times["sdk_create"].append(created)
                    times["sdk_run_true"].append(ran)
                    times["native_create"].append(made)
                    times["native_exec_true"].append(executed)
            rows = {"isolated": args.isolated, "runs": args.runs}
            rows.update({name: summary(samples) for name, samples in times.items()})
            print(json.dumps(rows, indent=2))
        finally:
            stop_daemon(daemon)


if __name__ == "__main__":
    main()
