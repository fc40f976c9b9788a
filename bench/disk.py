"""Create and kill cost of the disk layer: isolated daemons on a loop-mounted btrfs state root,
with ``SANDBOXD_DISK_MAX`` (a subvolume and a qgroup per sandbox) and without (plain
directories), and on the machine's own filesystem without limits, interleaved round by round.

    sudo .venv/bin/python bench/disk.py [--rounds 200]

Prints p50/p90 of ``POST /sandboxes`` and ``DELETE /sandboxes/{rid}`` per daemon (plain
``http.client`` on loopback, one keep-alive connection each). Needs root, btrfs-progs and
Linux 6.7+ (simple quotas).
"""

import argparse
import http.client
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kernel.disk_fs import loop_filesystem, root_on
from tests.support.daemon import Daemon, start_daemon, stop_daemon


def timed(
    connection: http.client.HTTPConnection, method: str, path: str, body: bytes
) -> tuple[float, bytes]:
    start = time.perf_counter()
    connection.request(method, path, body=body, headers={"content-type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    elapsed = time.perf_counter() - start
    assert response.status in (200, 204), (response.status, data)
    return elapsed, data


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


def layout_rounds(rounds: int) -> None:
    """The layer alone, in-process: ``Layout.create``/``destroy`` on one btrfs, handed the btrfs
    driver (subvolume + qgroup) or plain directories, interleaved (the disk driver is the
    isolation bundle's, ``Isolation.disk``: docs/architecture.rst)."""
    from sandboxd.core.layout import Layout
    from sandboxd.isolation.base import Identity
    from sandboxd.isolation.disk.base import DiskDriver, DiskLimits
    from sandboxd.isolation.disk.select import build_disk

    with loop_filesystem("btrfs", 512) as mount:
        (mount / "q").mkdir()
        (mount / "p").mkdir()
        drivers: dict[str, tuple[Layout, DiskDriver]] = {
            "subvolume + qgroup": (
                Layout(str(mount / "q"), True),
                build_disk(str(mount / "q"), DiskLimits(1 << 30, None)),
            ),
            "plain directory": (
                Layout(str(mount / "p"), True),
                build_disk(str(mount / "p"), DiskLimits(None, None)),
            ),
        }
        times: dict[str, tuple[list[float], list[float]]] = {
            "subvolume + qgroup": ([], []),
            "plain directory": ([], []),
        }
        for i in range(rounds):
            for name, (layout, disk) in drivers.items():
                rid = f"{i:016x}"
                start = time.perf_counter()
                layout.create(rid, Identity(700_000, 700_000), disk)
                made = time.perf_counter()
                layout.destroy(rid, disk)
                done = time.perf_counter()
                times[name][0].append(made - start)
                times[name][1].append(done - made)
        print(f"layout alone, {rounds} rounds; ms")
        for name, (creates, destroys) in times.items():
            figures = [percentile(creates, 0.5), percentile(creates, 0.9)]
            figures += [percentile(destroys, 0.5), percentile(destroys, 0.9)]
            print(f"{name:<22}", "  ".join(f"{f:8.3f}" for f in figures))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    layout_rounds(args.rounds)
    with ExitStack() as stack:
        daemons: dict[str, Daemon] = {}
        for n, (name, fs, extra) in enumerate(
            [
                ("btrfs + disk limit", True, ["--disk-max=1G"]),
                ("btrfs, no limit", True, []),
                ("host fs, no limit", False, []),
            ]
        ):
            tmp = Path(tempfile.mkdtemp(prefix="bench-disk-"))
            if fs:
                root_on(tmp, stack.enter_context(loop_filesystem("btrfs", 512)))
            base = 700_000 + n * 64
            daemon = start_daemon(tmp, f"--uid-min={base}", f"--uid-max={base + 63}", *extra)
            stack.callback(stop_daemon, daemon)
            daemons[name] = daemon
        connections = {
            k: http.client.HTTPConnection("127.0.0.1", d.port) for k, d in daemons.items()
        }
        creates: dict[str, list[float]] = {k: [] for k in daemons}
        kills: dict[str, list[float]] = {k: [] for k in daemons}
        for _ in range(args.rounds):
            for name, connection in connections.items():
                elapsed, data = timed(connection, "POST", "/sandboxes", b"{}")
                creates[name].append(elapsed)
                rid = json.loads(data)["remote_id"]
                elapsed, _ = timed(connection, "DELETE", f"/sandboxes/{rid}", b"")
                kills[name].append(elapsed)
        print(f"{args.rounds} rounds, interleaved; ms")
        print(f"{'daemon':<22} {'create p50':>10} {'p90':>7} {'kill p50':>9} {'p90':>7}")
        for name in daemons:
            c, k = creates[name], kills[name]
            print(
                f"{name:<22} {percentile(c, 0.5):>10.2f} {percentile(c, 0.9):>7.2f}"
                f" {percentile(k, 0.5):>9.2f} {percentile(k, 0.9):>7.2f}"
            )


if __name__ == "__main__":
    main()
