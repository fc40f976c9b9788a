"""The ``egress`` section (issue 33): what egress by name costs a sandbox, measured by
``bench/egress_names.py`` in a process of its own (as root, with nftables: it builds the egress
tests' "internet" in a namespace of its own, starts its own daemon and two sandboxes, one
whose traffic the kernel forwards, one whose policy names the server so that its traffic goes
through the daemon's egress proxy), twice: the names read by the proxy, then judged in the
kernel's path (``--judge``: ``SANDBOXD_EGRESS_JUDGE=on``, where ``iptables-nft`` is there).

Rows, for each way: a small HTTP request (connect, ``GET``, the answer, the close), p50 in ms,
direct and by name (target: at most 1.2 times direct); a download (``egress_bulk_bytes``,
64 MiB in a full run), the median of its rounds in MB/s, direct and by name (target: at least
80 % of direct). Each row carries the load average before and after its run.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent
SECONDS = 1200
SMALL = "egress by name: small HTTP request (p50)"
BULK = "egress by name: download throughput (median)"
LATENCY_TARGET = 1.2
"""At most this many times direct's p50 through the proxy (issue 33)."""
THROUGHPUT_TARGET = 0.8
"""At least this share of direct's throughput through the proxy (issue 33)."""


def unavailable() -> str | None:
    """Why the section cannot run here (``None``: it can)."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("nft") is None:
        return "no nft (nftables)"
    return None


WAYS = {"proxied": "through the proxy", "judged": "judged in the kernel"}
"""Each way of reading names: its sandbox's name in the samples, its rows' variant."""


def measure(rounds: int, requests: int, bulk_bytes: int, judge: bool = False) -> dict[str, Any]:
    """``bench/egress_names.py``'s samples (``judge``: the names judged in the kernel)."""
    argv = [sys.executable, str(BENCH / "egress_names.py"), f"--rounds={rounds}"]
    argv += [f"--requests={requests}", f"--bulk-bytes={bulk_bytes}"]
    argv += ["--judge"] if judge else []
    done = subprocess.run(argv, capture_output=True, text=True, timeout=SECONDS, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"egress_names.py: {(done.stderr or done.stdout)[-500:]}")
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def share_of(direct: float) -> Any:
    """The throughput target: :data:`THROUGHPUT_TARGET` of ``direct``."""
    from .figures import Target

    floor = THROUGHPUT_TARGET * direct
    return Target(f"≥ {THROUGHPUT_TARGET:.0%} of direct", lambda value: value >= floor)


def record(bench: Any, figures: dict[str, Any]) -> None:
    """The section's rows from one run of ``bench/egress_names.py`` (``bench``: a
    ``figures.Bench``): its direct rows, named after the way it read names when that is not
    the proxy, and its rows by name; no target is judged in a quick run."""
    from .figures import MB, at_most

    quick = bench.sizes.quick
    load = {"loadavg": [figures["loadavg_before"], figures["loadavg_after"]]}
    way = next(name for name in WAYS if name in figures["small"])
    label = WAYS[way]
    direct = "direct" if way == "proxied" else f"direct (beside {label})"
    small = {v: statistics.median(s) * 1000 for v, s in figures["small"].items()}
    bench.row(SMALL, direct, small["direct"], "ms", extra=load)
    bench.row(
        SMALL,
        label,
        small[way],
        "ms",
        ref="direct",
        ref_value=small["direct"],
        target=None if quick else at_most(LATENCY_TARGET),
        on="ratio",
        extra={"n": len(figures["small"][way]), **load},
    )
    size = figures["bulk_bytes"]
    rates = {v: statistics.median(size / t / MB for t in s) for v, s in figures["bulk"].items()}
    bulk = f"{size / (1 << 20):g} MiB"
    bench.row(BULK, f"{direct}, {bulk}", rates["direct"], "MB/s", extra=load)
    bench.row(
        BULK,
        f"{label}, {bulk}",
        rates[way],
        "MB/s",
        ref="direct",
        ref_value=rates["direct"],
        target=None if quick else share_of(rates["direct"]),
        extra={"share_of_direct": rates[way] / rates["direct"], **load},
    )


def section(bench: Any) -> None:
    """Measure and record, or note why not."""
    why = unavailable()
    if why is not None:
        bench.notes.append(f"egress rows skipped: {why}")
        return
    sizes = bench.sizes
    sized = (sizes.egress_rounds, sizes.egress_requests, sizes.egress_bulk_bytes)
    record(bench, measure(*sized))
    if shutil.which("iptables-nft") is None:
        bench.notes.append("egress rows judged in the kernel skipped: no iptables-nft")
        return
    record(bench, measure(*sized, judge=True))
