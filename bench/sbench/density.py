"""Density (issue 20): many idle sandboxes in one daemon with every isolation layer on, what
each costs, how fast they are made, and that all of it goes again at the end.

The daemon is one of this section's own (root): isolated (cgroups, seccomp on), every namespace
(``ipc,mount,net``), disk limits (``SANDBOXD_DISK_MAX`` on a loop-mounted btrfs state root: a
subvolume and a qgroup per sandbox) and the egress network mode allowed, each sandbox created
with ``"network": "egress"`` (a veth pair and a /31 each), and a uid pool of its own large
enough for ``density`` sandboxes. Where the egress layer cannot be had (another daemon owns it
on this host) the section says so in a note and goes on without it.

Rows:

- cold create p50: one ``POST /sandboxes`` at a time into the empty daemon, each killed before
  the next (every create makes its cgroups, namespaces, subvolume and veth; with
  ``--set netns_pool=N``, ``SANDBOXD_NETNS_POOL=N``, its network namespace and veth are taken
  from the pool, full before each create);
- creates sustained: the fill of ``density`` sandboxes, ``density_in_flight`` at once, each on
  a thread and kept-alive connection of its own, with the p50 and p99 of those creates and the
  p50 of the first and the last tenth of them (what the N-th create costs beside the first);
- per idle sandbox: the daemon's RSS and its process tree's PSS, the host's ``MemAvailable``
  and slab, processes, descriptors, mounts, cgroups and veths: (after - before) / N;
- after the kill of every one: what is still left over against the start (each should be 0).
"""

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sandboxd.isolation.naming import instance_name

from . import procs
from .dockerd import descendants, mem_available_kib, pss_kib
from .rawhttp import RawHTTP
from .stats import pct

UIDS = (613000, 623999)
"""The density daemon's uid pool (11 000 uids), apart from the other bench daemons' and tests'."""
DISK_MAX = "64M"
VETH_PREFIX = "sbx"


def meminfo_kib(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def instance_dirs(pid: int, instance: str) -> list[Path]:
    """Where the daemon's instance directory would be in each cgroup hierarchy."""
    dirs = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        name = controllers.removeprefix("name=") if controllers else "unified"
        dirs.append(Path("/sys/fs/cgroup", name, path.lstrip("/"), instance))
    return dirs


def cgroup_dirs(pid: int, instance: str) -> int:
    """Sandbox cgroups: the directories in the daemon's instance directory of each hierarchy."""
    total = 0
    for where in instance_dirs(pid, instance):
        with contextlib.suppress(OSError):
            total += sum(1 for e in os.scandir(where) if e.is_dir())
    return total


def host_leftovers(cgroups: list[Path], top: Path) -> list[str]:
    """After the daemon stopped and its filesystem went: instance cgroups still there, mounts
    still under the filesystem's directory, the directory itself."""
    left = [str(d) for d in cgroups if d.exists()]
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point == str(top) or point.startswith(f"{top}/"):
            left.append(point)
    if top.exists():
        left.append(str(top))
    return left


def uid_processes(low: int, high: int) -> int:
    """Processes of the host running as a uid of the pool."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if low <= entry.stat().st_uid <= high:
                    count += 1
    return count


def census(pid: int, root: Path, instance: str) -> dict[str, int]:
    """What the host and the daemon hold now, in the units the rows report."""
    tree = descendants({pid})
    fds = 0
    for member in tree:
        with contextlib.suppress(OSError):
            fds += len(os.listdir(f"/proc/{member}/fd"))
    mounts = 0
    with contextlib.suppress(OSError):
        mounts = len(Path(f"/proc/{pid}/mountinfo").read_text().splitlines())
    return {
        "daemon_rss_kib": procs.status_kib(pid),
        "tree_pss_kib": pss_kib(tree),
        "mem_available_kib": mem_available_kib(),
        "slab_kib": meminfo_kib("Slab"),
        "host_processes": sum(1 for e in os.scandir("/proc") if e.name.isdigit()),
        "tree_processes": len(tree),
        "tree_fds": fds,
        "mounts": mounts,
        "cgroups": cgroup_dirs(pid, instance),
        "veths": sum(1 for n in os.listdir("/sys/class/net") if n.startswith(VETH_PREFIX)),
        "sandbox_dirs": sum(1 for n in os.listdir(root) if not n.startswith(".")),
        "uid_processes": uid_processes(*UIDS),
    }


def pool_label(netns_pool: int) -> str:
    """What the rows' labels add for a daemon with a pool of network namespaces."""
    return f", netns pool {netns_pool}" if netns_pool else ""


def pinned(directory: Path, mountinfo: str = "/proc/self/mountinfo") -> int:
    """How many mounts are on files in ``directory`` (the pool's pins: a pin file is made just
    before its namespace is mounted on it, so the files alone count one too many)."""
    prefix = f"{directory}/"
    with open(mountinfo) as f:
        return sum(1 for line in f if line.split(" ", 5)[4].startswith(prefix))


def wait_pool(
    root: Path, netns_pool: int, limit: float = 10.0, mountinfo: str = "/proc/self/mountinfo"
) -> None:
    """Wait (at most ``limit`` seconds) until the daemon's pool of network namespaces holds
    ``netns_pool`` (its pins in ``{root}/.ns/.pool``, made at start-up: without it, as when the
    egress layer was off, the daemon has no pool and nothing is waited for)."""
    directory = root.resolve() / ".ns" / ".pool"  # as the mount table names it
    deadline = time.monotonic() + limit
    while netns_pool and directory.is_dir() and time.monotonic() < deadline:
        if pinned(directory, mountinfo) >= netns_pool:
            return
        time.sleep(0.005)


@contextlib.contextmanager
def layered_daemon(
    workdir: Path, image_mib: int, notes: list[str], disk_max: str = DISK_MAX, netns_pool: int = 0
) -> Iterator[tuple[procs.Server, str]]:
    """The section's daemon with every layer on, on a fresh loop btrfs, each sandbox's disk
    limited to ``disk_max`` (and ``netns_pool`` egress namespaces wired ahead); the network
    mode its creates ask for. Everything is stopped, unmounted and removed on the way out."""
    from tests.kernel.disk_fs import loop_filesystem

    settings = {
        "SANDBOXD_UID_MIN": str(UIDS[0]),
        "SANDBOXD_UID_MAX": str(UIDS[1]),
        "SANDBOXD_DISK_MAX": disk_max,
        "SANDBOXD_NAMESPACES": "all",
        "SANDBOXD_SECCOMP": "default",
        "SANDBOXD_NETWORK_ALLOW": "none,egress",
        "SANDBOXD_NETNS_POOL": str(netns_pool),
    }
    with loop_filesystem("btrfs", image_mib) as mount:
        root = mount / "root"
        root.mkdir(mode=0o711)
        mode = "egress"
        try:
            server = procs.start_sandboxd("density", True, workdir, settings, root=root)
        except RuntimeError as e:
            reason = str(e).strip().splitlines()[-1][:200]
            notes.append(f"density: egress layer off (the daemon did not start with it: {reason})")
            settings["SANDBOXD_NETWORK_ALLOW"] = "none"
            mode = "none"
            server = procs.start_sandboxd("density", True, workdir, settings, root=root)
        try:
            yield server, mode
        finally:
            server.stop()


def in_threads(work: Callable[[], None], count: int) -> float:
    """Run ``work`` in ``count`` threads at once until every one returns: the wall time."""
    threads = [threading.Thread(target=work) for _ in range(count)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def fill(
    port: int, count: int, in_flight: int, mode: str, budget: float = math.inf
) -> tuple[list[str], list[float], float]:
    """``count`` creates, ``in_flight`` threads at once, none started after ``budget`` seconds:
    the ids, each create's seconds in the order they were started, and the wall time."""
    claimed = iter(range(count))
    deadline = time.monotonic() + budget
    lock = threading.Lock()
    ids: list[str] = []
    seconds: list[float] = [0.0] * count
    failures: list[str] = []

    def work() -> None:
        raw = RawHTTP(port).ready()
        try:
            while not failures:
                with lock:
                    index = None if time.monotonic() > deadline else next(claimed, None)
                if index is None:
                    return
                start = time.perf_counter()
                rid = str(raw.json("POST", "/sandboxes", {"network": mode})["remote_id"])
                seconds[index] = time.perf_counter() - start
                with lock:
                    ids.append(rid)
        except Exception as e:
            failures.append(f"create {len(ids) + 1}: {e}")
        finally:
            raw.close()

    wall = in_threads(work, in_flight)
    if failures:
        kill_all(port, ids, in_flight)
        raise RuntimeError(f"density: {len(ids)} of {count} made, then: {failures[0]}")
    return ids, seconds[: len(ids)], wall


def kill_all(port: int, ids: list[str], in_flight: int) -> float:
    """``DELETE`` every id, ``in_flight`` threads at once: the wall time."""
    pending = list(ids)
    lock = threading.Lock()
    failures: list[str] = []

    def work() -> None:
        raw = RawHTTP(port).ready()
        try:
            while True:
                with lock:
                    if not pending:
                        return
                    rid = pending.pop()
                try:
                    raw.json("DELETE", f"/sandboxes/{rid}")
                except Exception as e:
                    failures.append(f"{rid}: {e}")
        finally:
            raw.close()

    wall = in_threads(work, in_flight)
    if failures:
        raise RuntimeError(f"density: {len(failures)} kills failed: {failures[0]}")
    return wall


def cold_creates(
    port: int, count: int, mode: str, before: Callable[[], None] = lambda: None
) -> list[float]:
    """Seconds of ``count`` creates one at a time, each killed (untimed) before the next and
    ``before`` run (untimed) ahead of each."""
    raw = RawHTTP(port)
    samples = []
    try:
        for _ in range(count):
            before()
            raw.ready()
            start = time.perf_counter()
            rid = raw.json("POST", "/sandboxes", {"network": mode})["remote_id"]
            samples.append(time.perf_counter() - start)
            raw.json("DELETE", f"/sandboxes/{rid}")
    finally:
        raw.close()
    return samples


def settle(
    seconds: float, server: procs.Server, root: Path, instance: str, netns_pool: int = 0
) -> dict[str, int]:
    """The census after ``seconds``, the pool of network namespaces full (its pins and veths
    count the same in each census)."""
    time.sleep(seconds)
    wait_pool(root, netns_pool)
    return census(server.pid, root, instance)


def measure(workdir: Path, sizes: Any, notes: list[str]) -> dict[str, Any]:
    """Everything the rows report (see the module's docstring)."""
    in_flight = sizes.density_in_flight
    pause = 0.3 if sizes.quick else 3.0
    pool = sizes.netns_pool
    with layered_daemon(workdir, sizes.density_image_mib, notes, netns_pool=pool) as (
        server,
        mode,
    ):
        assert server.root is not None
        root, instance = server.root, instance_name(str(server.root))
        health = RawHTTP(server.port)
        capabilities = health.json("GET", "/healthz").get("capabilities", [])
        health.close()
        cold = cold_creates(server.port, sizes.density_cold, mode, lambda: wait_pool(root, pool))
        # Warm the allocator and the connections: their one-off growth is not per sandbox.
        kill_all(server.port, fill(server.port, in_flight * 4, in_flight, mode)[0], in_flight)
        start_load = procs.loadavg()
        before = settle(pause, server, root, instance, pool)
        ids, seconds, wall = fill(
            server.port, sizes.density, in_flight, mode, sizes.density_seconds
        )
        n = len(ids)
        full = settle(pause, server, root, instance, pool)
        kill_wall = kill_all(server.port, ids, in_flight)
        after = settle(pause * 2, server, root, instance, pool)
        cgroups = instance_dirs(server.pid, instance)
    tenth = max(1, n // 10)
    return {
        "count": n,
        "asked": sizes.density,
        "budget_s": sizes.density_seconds,
        "in_flight": in_flight,
        "network": mode,
        "netns_pool": pool,
        "capabilities": capabilities,
        "cold_ms": [round(x * 1e3, 3) for x in cold],
        "create_ms": [round(x * 1e3, 3) for x in seconds],
        "first_tenth_p50_ms": pct(seconds[:tenth], 0.5) * 1e3,
        "last_tenth_p50_ms": pct(seconds[-tenth:], 0.5) * 1e3,
        "wall_s": wall,
        "kill_wall_s": kill_wall,
        "before": before,
        "full": full,
        "after": after,
        "host_leftovers": host_leftovers(cgroups, root.parent.parent),
        "loadavg_fill_start": start_load,
        "loadavg_fill_end": procs.loadavg(),
    }


PER_SANDBOX = (
    ("daemon memory per idle sandbox", "daemon_rss_kib", "daemon RSS", "KiB"),
    ("daemon memory per idle sandbox", "tree_pss_kib", "PSS of its process tree", "KiB"),
    ("host memory per idle sandbox", "mem_available_kib", "MemAvailable drop", "KiB"),
    ("host memory per idle sandbox", "slab_kib", "kernel slab", "KiB"),
    ("processes per idle sandbox", "host_processes", "host processes", ""),
    ("descriptors per idle sandbox", "tree_fds", "daemon tree's fds", ""),
    ("mounts per idle sandbox", "mounts", "daemon's mount table", ""),
    ("cgroups per idle sandbox", "cgroups", "sandbox cgroup dirs", ""),
    ("veths per idle sandbox", "veths", f"host links {VETH_PREFIX}*", ""),
)


def section(bench: Any) -> None:
    """The density rows (``bench``: a ``figures.Bench``); root only, else one note."""
    if os.geteuid() != 0:
        bench.notes.append("density rows skipped (not root: every layer needs root)")
        return
    add_rows(bench, measure(bench.workdir, bench.sizes, bench.notes))


def add_rows(bench: Any, m: dict[str, Any]) -> None:
    """The rows of what :func:`measure` found (the issue's targets where it sets them)."""
    from .figures import at_least, at_most

    n, mode = m["count"], m["network"]
    layers = f"every layer, network {mode}{pool_label(m.get('netns_pool', 0))}"
    cold = [x / 1e3 for x in m["cold_ms"]]
    creates = [x / 1e3 for x in m["create_ms"]]
    load = " ".join(f"{x:.1f}" for x in m["loadavg_fill_start"])
    bench.row(
        "cold create, every layer on",
        f"isolated (raw, one at a time; {layers})",
        pct(cold, 0.5) * 1e3,
        "ms",
        target=at_most(2, " ms"),
        extra={"p99_ms": pct(cold, 0.99) * 1e3, "n": len(cold), "samples_ms": m["cold_ms"]},
    )
    bench.row(
        "creates sustained, every layer on",
        f"isolated (raw, {m['in_flight']} in flight, {n} kept; load {load})",
        n / m["wall_s"],
        "/s",
        target=at_least(500, "/s"),
        extra={
            "p50_ms": pct(creates, 0.5) * 1e3,
            "p99_ms": pct(creates, 0.99) * 1e3,
            "first_tenth_p50_ms": m["first_tenth_p50_ms"],
            "last_tenth_p50_ms": m["last_tenth_p50_ms"],
            "wall_s": m["wall_s"],
            "kills_per_s": n / m["kill_wall_s"],
            "loadavg": [m["loadavg_fill_start"], m["loadavg_fill_end"]],
        },
    )
    bench.row(
        "create p50 in the fill: last tenth",
        f"isolated ({n // 10 or 1} creates each)",
        m["last_tenth_p50_ms"],
        "ms",
        ref="first tenth",
        ref_value=m["first_tenth_p50_ms"],
    )
    bench.row(
        "idle sandboxes live, every layer on",
        f"isolated ({layers})",
        float(n),
        "sandboxes",
        target=at_least(m["asked"]),
        extra={"capabilities": m["capabilities"], "budget_s": m["budget_s"]},
    )
    before, full, after = m["before"], m["full"], m["after"]
    for figure, key, what, unit in PER_SANDBOX:
        sign = -1 if key == "mem_available_kib" else 1
        bench.row(
            figure,
            f"isolated: {what} / {n}",
            sign * (full[key] - before[key]) / n,
            unit,
            target=at_most(20, " KiB") if key == "daemon_rss_kib" else None,
            extra={"before": before[key], "full": full[key]},
        )
    left = {key: after[key] - before[key] for key in ("tree_processes", "mounts", "cgroups")}
    left["veths"] = after["veths"] - before["veths"]
    for key in ("sandbox_dirs", "uid_processes"):
        left[key] = after[key]
    left["after stop"] = len(m["host_leftovers"])
    bench.row(
        "left after killing them all",
        "isolated: " + ", ".join(f"{k} {v:+d}" for k, v in left.items()),
        float(sum(abs(v) for v in left.values())),
        "",
        target=at_most(0),
        extra={"left": left, "after": after, "host_leftovers": m["host_leftovers"]},
    )
