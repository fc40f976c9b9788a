"""The ``bursts`` section (issue 34): what an agent platform sees when many sandboxes are asked
for at once, each used at once.

The daemon is :func:`sbench.density.layered_daemon`'s: every layer on (cgroups, seccomp, every
namespace, a btrfs subvolume and qgroup each, a veth each where the egress mode can be had).

- create → first output, one at a time: ``POST /sandboxes`` then ``POST …/exec`` of ``echo``,
  timed from the create's first byte sent to the exec's answer with the echoed line (the
  exec's answer comes when the command has ended, so this bounds the first output from above);
  each sandbox killed (untimed) before the next.
- a burst of N: N threads, each with a kept-alive connection opened beforehand, released at
  once by a barrier, each doing the same create and first exec; the p50 and p99 of those N
  create → first output times and the burst's wall time. A create that waits behind another's
  slow layer shows in the p99.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .density import kill_all, layered_daemon, pool_label, wait_pool
from .rawhttp import RawHTTP
from .stats import pct

if TYPE_CHECKING:
    from .figures import Bench

FIRST_OUTPUT_TARGET_MS = 5.0
BURST_100_P99_TARGET_MS = 25.0
MARK = "first"


def create_and_first_output(
    raw: RawHTTP, mode: str, template: str | None = None
) -> tuple[str, float]:
    """One create (from ``template`` if given) and its first exec of ``echo`` on ``raw``'s
    connection: the id and the seconds from the create's start to the exec's answer holding
    the echoed line."""
    payload: dict[str, str] = {"network": mode}
    if template is not None:
        payload["template"] = template
    start = time.perf_counter()
    rid = str(raw.json("POST", "/sandboxes", payload)["remote_id"])
    body = json.dumps({"cmd": ["echo", MARK]}).encode()
    status, data = raw.request(
        "POST", f"/sandboxes/{rid}/exec", body, {"Content-Type": "application/json"}
    )
    elapsed = time.perf_counter() - start
    last = json.loads(data.splitlines()[-1]) if status == 200 and data else {}
    if last.get("exit") != 0 or base64.b64decode(last.get("out", "")) != MARK.encode() + b"\n":
        raise RuntimeError(f"the first exec in {rid} answered {status}: {data[-200:]!r}")
    return rid, elapsed


def one_at_a_time(
    port: int, count: int, mode: str, before: Callable[[], None] = lambda: None
) -> list[float]:
    """Seconds of ``count`` create → first output, each sandbox killed before the next and
    ``before`` run (untimed) ahead of each."""
    raw = RawHTTP(port)
    samples = []
    try:
        for _ in range(count):
            before()
            raw.ready()
            rid, seconds = create_and_first_output(raw, mode)
            samples.append(seconds)
            raw.json("DELETE", f"/sandboxes/{rid}")
    finally:
        raw.close()
    return samples


def burst(port: int, count: int, mode: str) -> tuple[list[float], float]:
    """``count`` create → first output released at once: each one's seconds and the wall time.
    Every sandbox made is killed before this returns."""
    barrier = threading.Barrier(count + 1, timeout=120)
    lock = threading.Lock()
    ids: list[str] = []
    seconds = [math.nan] * count
    failures: list[str] = []

    def work(index: int) -> None:
        raw = RawHTTP(port)
        try:
            raw.ready()
            barrier.wait()
            rid, seconds[index] = create_and_first_output(raw, mode)
            with lock:
                ids.append(rid)
        except Exception as e:
            failures.append(f"{type(e).__name__}: {e}")
            barrier.abort()
        finally:
            raw.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    kill_all(port, ids, min(count, 8))
    if failures:
        raise RuntimeError(f"bursts: {len(ids)} of {count} made, then: {failures[0]}")
    return seconds, wall


def section(bench: Bench) -> None:
    """The rows (root only: every layer needs root; else one note)."""
    import os

    from .figures import at_most

    if os.geteuid() != 0:
        bench.notes.append("bursts rows skipped (not root: every layer needs root)")
        return
    sizes = bench.sizes
    pool = sizes.netns_pool
    with layered_daemon(bench.workdir, sizes.bursts_image_mib, bench.notes, netns_pool=pool) as (
        server,
        mode,
    ):
        assert server.root is not None
        root = server.root

        def full() -> None:  # each create, and each burst, starts with the pool full
            wait_pool(root, pool)

        # Warm the daemon's allocator and its first layers' one-off work.
        one_at_a_time(server.port, 3, mode)
        single = one_at_a_time(server.port, sizes.bursts_single, mode, full)
        bursts = {}
        for n in map(int, sizes.bursts.split(",")):
            full()
            bursts[n] = burst(server.port, n, mode)
    layers = f"every layer, network {mode}{pool_label(pool)}"
    bench.row(
        "create → first output, one at a time",
        f"isolated (raw; {layers})",
        pct(single, 0.5) * 1e3,
        "ms",
        target=None if sizes.quick else at_most(FIRST_OUTPUT_TARGET_MS, " ms"),
        extra={"p99_ms": pct(single, 0.99) * 1e3, "n": len(single)},
    )
    for n, (seconds, wall) in bursts.items():
        extra: dict[str, Any] = {
            "p50_ms": pct(seconds, 0.5) * 1e3,
            "max_ms": max(seconds) * 1e3,
            "wall_s": wall,
            "n": n,
        }
        bench.row(
            "burst: create → first output (p99)",
            f"isolated: {n} at once (raw; {layers})",
            pct(seconds, 0.99) * 1e3,
            "ms",
            target=at_most(BURST_100_P99_TARGET_MS, " ms") if n == 100 else None,
            extra=extra,
        )
