"""Background processes (issue 17): start-to-first-byte, the cost per reader, and exec beside.

    python bench/processes.py                  # this tree's daemon, --isolation=none
    python bench/processes.py --isolated       # as root: real isolation
    python bench/processes.py --repo /work/main --only exec   # exec rows of another tree

Rows: ``exec true`` over one raw connection (p50/p90 of ``--runs``); a background ``echo``:
from sending the start to the first output frame of a following reader; a process printing
``--bytes`` with 0, 1, 2, 4 following readers: the daemon's CPU seconds (``/proc/PID/stat``)
and the wall time to the last reader's exit frame, and what each reader adds.
"""

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.sbench import procs  # noqa: E402
from bench.sbench.rawhttp import RawHTTP  # noqa: E402
from bench.sbench.stats import pct  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def exec_true(http: RawHTTP, rid: str, runs: int) -> dict[str, float]:
    samples = [http.timed("POST", f"/sandboxes/{rid}/exec", {"cmd": ["true"]}) for _ in range(runs)]
    return {"p50_ms": pct(samples, 0.5) * 1e3, "p90_ms": pct(samples, 0.9) * 1e3}


def first_line(port: int, path: str) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    connection.request("GET", path)
    response = connection.getresponse()
    while True:
        line = response.readline()
        if not line or b'"o"' in line:
            connection.close()
            return line


def echo_first_byte(http: RawHTTP, port: int, rid: str, runs: int) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        http.ready()
        start = time.perf_counter()
        started = http.json("POST", f"/sandboxes/{rid}/processes", {"cmd": ["echo", "hi"]})
        line = first_line(port, f"/sandboxes/{rid}/processes/{started['id']}/output?follow=true")
        samples.append(time.perf_counter() - start)
        assert b'"o"' in line, line
    return {"p50_ms": pct(samples, 0.5) * 1e3, "p90_ms": pct(samples, 0.9) * 1e3}


def drain(port: int, path: str, done: list[bool]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, blocksize=1 << 20)
    connection.request("GET", path)
    response = connection.getresponse()
    last = b""
    while chunk := response.read(1 << 20):
        last = chunk[-64:]
    connection.close()
    done.append(b'"exit"' in last)


def readers_cost(
    http: RawHTTP, server: procs.Server, rid: str, size: int, readers: int
) -> dict[str, Any]:
    before = cpu_seconds(server.pid)
    start = time.perf_counter()
    cmd = ["sh", "-c", f"head -c {size} /dev/zero"]
    started = http.json("POST", f"/sandboxes/{rid}/processes", {"cmd": cmd})
    path = f"/sandboxes/{rid}/processes/{started['id']}/output?follow=true"
    done: list[bool] = []
    threads = [
        threading.Thread(target=drain, args=(server.port, path, done)) for _ in range(readers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    while http.json("GET", f"/sandboxes/{rid}/processes")["processes"][-1]["running"]:
        time.sleep(0.01)
    wall = time.perf_counter() - start
    assert all(done) and len(done) == readers, done
    return {"readers": readers, "daemon_cpu_s": cpu_seconds(server.pid) - before, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=BENCH.parent)
    parser.add_argument("--isolated", action="store_true")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--bytes", type=int, default=256 << 20)
    parser.add_argument("--only", choices=("exec", "processes"))
    args = parser.parse_args()
    procs.REPO = args.repo.resolve()
    with tempfile.TemporaryDirectory() as work:
        server = procs.start_sandboxd("processes-bench", args.isolated, Path(work))
        try:
            http = RawHTTP(server.port)
            rid = http.json("POST", "/sandboxes", {})["remote_id"]
            rows: dict[str, Any] = {"repo": str(procs.REPO), "isolated": args.isolated}
            if args.only in (None, "exec"):
                exec_true(http, rid, 30)  # warm-up
                rows["exec_true"] = exec_true(http, rid, args.runs)
            if args.only in (None, "processes"):
                rows["echo_first_byte"] = echo_first_byte(http, server.port, rid, args.runs)
                costs = [readers_cost(http, server, rid, args.bytes, n) for n in (0, 1, 2, 4)]
                base = costs[0]["daemon_cpu_s"]
                for row in costs:
                    row["cpu_per_reader_per_gib_s"] = (
                        (row["daemon_cpu_s"] - base) / row["readers"] / (args.bytes / (1 << 30))
                        if row["readers"]
                        else None
                    )
                rows["readers"] = costs
            print(json.dumps(rows, indent=2))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
