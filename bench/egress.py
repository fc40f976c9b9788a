"""What the egress network mode costs: attach and detach of a sandbox's veth, and first connects.

    sudo .venv/bin/python bench/egress.py [--rounds 30]

As root, with a table and interface prefix of its own (so a running daemon is not touched):
builds the egress tests' "internet" (a namespace with a TCP server on 198.51.100.1 behind a
veth), then per round: make a sandbox stand-in (a pinned namespace), attach, first connect to the
internet server from it, detach; then attach to another and remove its pin (``umount``)
as kill does, timing until the kernel has deleted the veth with the namespace. Reference in the
same run: the first connect from the host itself (routing, no forwarding, no NAT). Prints p50
and p90 in milliseconds; everything made is removed, the forwarding sysctls put back.
"""

import argparse
import ipaddress
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandboxd.isolation.network.egress_host import Egress
from sandboxd.isolation.network.egress_plan import EgressPlan
from tests.kernel.netns_helpers import connect, scene


def ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(len(ordered) * 0.9) - 1]
    return f"p50 {statistics.median(ordered) * 1000:6.2f} ms  p90 {p90 * 1000:6.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    rounds = parser.parse_args().rounds
    if os.geteuid() != 0:
        print("needs root")
        return 1
    attach: list[float] = []
    detach: list[float] = []
    first_sandbox: list[float] = []
    first_host: list[float] = []
    unpin: list[float] = []
    gone: list[float] = []
    with scene() as s, tempfile.TemporaryDirectory() as tmp:
        plan = EgressPlan(
            ipaddress.IPv4Network("10.250.0.0/24"),
            ipaddress.IPv6Network("fd53:7465:7374::/120"),
            table=f"sandboxd_b{s.tag}",
            prefix=f"egb{s.tag}x",
        )
        egress = Egress(plan, state_file=f"{tmp}/found", lock_file=f"{tmp}/lock")
        inet = s.netns("inet")
        s.wire("i", inet, ["198.51.100.254/24"], ["198.51.100.1/24"])
        server = s.serve(inet, "198.51.100.1", "x")
        start = time.perf_counter()
        egress.start()
        started = time.perf_counter() - start
        try:
            for i in range(rounds):
                netns = s.netns(f"s{i}")
                t0 = time.perf_counter()
                egress.attach(netns, i % plan.slots)
                t1 = time.perf_counter()
                assert connect(netns, server.address, server.port) == "x"
                t2 = time.perf_counter()
                assert connect(None, server.address, server.port) == "x"
                t3 = time.perf_counter()
                egress.detach(i % plan.slots)
                t4 = time.perf_counter()
                s.remove_netns(netns)
                attach.append(t1 - t0)
                first_sandbox.append(t2 - t1)
                first_host.append(t3 - t2)
                detach.append(t4 - t3)
                # The kill path: the pin goes, the kernel deletes the veth with the namespace.
                netns = s.netns(f"k{i}")
                egress.attach(netns, i % plan.slots)
                t0 = time.perf_counter()
                s.remove_netns(netns)
                t1 = time.perf_counter()
                while os.path.exists(f"/sys/class/net/{plan.ifname(i % plan.slots)}"):
                    time.sleep(0.0005)
                unpin.append(t1 - t0)
                gone.append(time.perf_counter() - t1)
        finally:
            t0 = time.perf_counter()
            egress.stop()
            stopped = time.perf_counter() - t0
    print(f"egress, {rounds} rounds (one sandbox at a time)")
    print(f"  start (reclaim, sysctls, table)   {started * 1000:6.2f} ms")
    print(f"  attach                            {ms(attach)}")
    print(f"  first connect from the sandbox    {ms(first_sandbox)}")
    print(f"  first connect from the host       {ms(first_host)}")
    print(f"  detach                            {ms(detach)}")
    print(f"  umount (the pin's removal)        {ms(unpin)}")
    print(f"  ... then the veth is gone after   {ms(gone)}")
    print(f"  stop                              {stopped * 1000:6.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
