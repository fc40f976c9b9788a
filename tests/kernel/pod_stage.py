"""Run inside a pod-like set of namespaces (its own mount, PID and network namespaces, as a
Kubernetes pod gives): start a daemon with real isolation, create sandboxes in a row, stop it
(proven clean), and print what failed as one JSON line.

    unshare --mount --pid --net --fork --mount-proc python -m tests.kernel.pod_stage TMP COUNT
"""

import json
import subprocess
import sys
from pathlib import Path

from tests.kernel.kernel_http import KernelDaemon


def creates_in_a_row(kd: KernelDaemon, count: int) -> list[str]:
    """Create ``count`` sandboxes one after another, killing each; the answers that failed."""
    failed = []
    for _ in range(count):
        answer = kd.call("POST", "/sandboxes", {})
        if answer.status != 200:
            failed.append(f"{answer.status} {answer.body[:200]!r}")
            continue
        rid = answer.json()["remote_id"]
        assert kd.call("DELETE", f"/sandboxes/{rid}").status == 204
    return failed


def main(tmp: str, count: int) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    kd = KernelDaemon.start(Path(tmp), "--network=none")
    try:
        failed = creates_in_a_row(kd, count)
    finally:
        kd.stop()
    print(json.dumps({"failed": failed}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
