"""The pool of network namespaces (``SANDBOXD_NETNS_POOL``) at a crash and at stop, through real
daemons as root: a SIGKILLed daemon's pooled namespaces (their pins, their veths) are removed by
the next daemon on the same state root before it makes its own, and a stop leaves nothing: no
pin, no veth, no table. (The pool at work: ``test_netns_pool.py``.)
"""

import os
import signal
import time
from pathlib import Path

from tests.kernel.netns_helpers import EGRESS_MARKS
from tests.kernel.test_egress_daemon import table_exists
from tests.kernel.test_netns_pool import POOL, host_ends, wait_full
from tests.support.daemon import start_daemon, stop_daemon

pytestmark = EGRESS_MARKS


def pinned_under(root: Path) -> list[str]:
    """The network namespace pins mounted under ``root`` in the host's mount table. (A
    namespace's inode number is reused once it is gone: the pins, and the veths' ifindexes,
    which the host never reuses soon, tell the namespaces apart.)"""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[3].startswith("net:[") and fields[4].startswith(f"{root}/"):
                found.append(fields[4])
    return sorted(found)


def test_a_crashed_daemons_pool_is_reclaimed_and_a_stop_leaves_nothing(tmp_path: Path) -> None:
    base = 438000 + os.getpid() % 1000 * 20
    args = (f"--uid-min={base}", f"--uid-max={base + 19}", "--network-allow=none,egress")
    env = {"SANDBOXD_NETNS_POOL": str(POOL), "SANDBOXD_EGRESS_POOL6": "none"}
    first = start_daemon(tmp_path, *args, env=env)
    try:
        wait_full(first)
        root = Path(os.path.realpath(first.root))
        crashed_ends = set(host_ends())
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        assert len(pinned_under(root / ".ns" / ".pool")) == POOL  # left behind, veths with them
        assert crashed_ends <= set(host_ends())
        second = start_daemon(tmp_path, *args, env=env)
    finally:
        if first.process.poll() is None:  # the test failed before its kill
            stop_daemon(first)
    try:
        wait_full(second)
        assert len(pinned_under(root / ".ns" / ".pool")) == POOL  # its own alone
        for _ in range(500):  # the predecessor's veths go with their namespaces, asynchronously
            if not crashed_ends & set(host_ends()):
                break
            time.sleep(0.01)
        assert not crashed_ends & set(host_ends())
    finally:
        stop_daemon(second)
    assert pinned_under(root) == []
    assert not (root / ".ns").exists() or not pool_pins_left(root)
    for _ in range(500):
        if not host_ends():
            break
        time.sleep(0.01)
    assert not host_ends()
    assert not table_exists()


def pool_pins_left(root: Path) -> list[str]:
    try:
        return os.listdir(root / ".ns" / ".pool")
    except FileNotFoundError:
        return []
