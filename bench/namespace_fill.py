"""What a sandbox's namespaces cost to make as more of them live: the namespace server alone.

    python bench/namespace_fill.py [--count N] [--helper PATH]     # as root

Makes ``N`` sets of the namespaces a default daemon makes (``SANDBOXD_NAMESPACES=all``: IPC,
mount, network, and PID where the kernel allows it; network ``none``) one after the other
through ``Namespaces`` and one ``sandboxd-exec namespace-server`` (``--helper``: another build
of the helper, e.g. an older one to compare), each pinned under a scratch state root as the
daemon pins them, none removed until the end: no daemon, cgroup, disk or veth, so what grows
with the number alive is the namespace work alone. Prints each tenth's create p50 and the
rate of the fill, the host's mount count at the end, and what one sandbox's mount table
lists; then removes everything.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.sbench.stats import pct  # noqa: E402
from sandboxd.isolation.exec.helper import HELPER  # noqa: E402
from sandboxd.isolation.namespaces.creators import HelperCreator  # noqa: E402
from sandboxd.isolation.namespaces.kinds import parse_namespaces  # noqa: E402
from sandboxd.isolation.namespaces.pins import PLACES, Namespaces, kept_directories  # noqa: E402
from sandboxd.isolation.namespaces.server import NamespaceServer  # noqa: E402
from sandboxd.isolation.network.modes import NetworkPolicy, NoNetwork  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--helper", default=HELPER)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="sandboxd-bench-nsfill-", dir="/var/tmp"))
    root.chmod(0o711)
    ns = Namespaces(
        kinds=parse_namespaces("all"),
        nsroot=str(root / ".ns"),
        network=NetworkPolicy({"none": NoNetwork()}, ("none",), "none"),
        creator=HelperCreator(args.helper),
        keep=kept_directories(PLACES, [str(root)]),
        shm_bytes=8 << 20,
        run=NamespaceServer(args.helper),
    )
    ns.prepare()
    rids: list[str] = []
    seconds: list[float] = []
    try:
        start = time.perf_counter()
        for i in range(args.count):
            rid = f"{i:016x}"
            tmp, workspace = root / rid / "tmp", root / rid / "workspace"
            tmp.mkdir(parents=True)
            workspace.mkdir()
            began = time.perf_counter()
            ns.create(rid, str(tmp), str(workspace), NoNetwork())
            seconds.append(time.perf_counter() - began)
            rids.append(rid)
        wall = time.perf_counter() - start
        tenth = max(1, args.count // 10)
        parts = [seconds[i : i + tenth] for i in range(0, len(seconds), tenth)][:10]
        print("create p50 per tenth (ms):", " ".join(f"{pct(p, 0.5) * 1000:.2f}" for p in parts))
        print(f"fill: {args.count} in {wall:.1f} s, {args.count / wall:.0f}/s")
        host = len(Path("/proc/self/mountinfo").read_text().splitlines())
        inside = subprocess.run(
            ns.enter(rids[-1], [args.helper, "session", "/", "cat", "/proc/self/mountinfo"]),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        pins = sum(f"{root}/.ns/" in line for line in inside)
        print(f"mounts: host {host}, last sandbox {len(inside)} (pins of ours: {pins})")
    finally:
        for rid in rids:
            ns.remove(rid)
        ns.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
