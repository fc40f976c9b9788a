"""The pool of network namespaces wired ahead (``SANDBOXD_NETNS_POOL``) through a real daemon as
root: one ``twistd sandboxd`` for the module, its pool of two egress namespaces.

An egress create takes a namespace of the pool (the sandbox's network namespace is one the pool
pinned before the create, its veth's host end older than the create) and reaches the test's
"internet" (a namespace on 203.0.113.1 behind a veth); a ``none`` sandbox never gets one (only
its loopback, reaching nothing); the pool refills; and a pooled namespace carries nothing of a
previous sandbox: one that listens and is killed leaves nothing in the next one's namespace,
which is another. (Stop and a crash's leftovers: ``test_netns_pool_recovery.py``.)
"""

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel.netns_helpers import EGRESS_MARKS, scene
from tests.kernel.test_egress_daemon import create, exec_out, reach
from tests.support.daemon import Daemon, start_daemon, stop_daemon

pytestmark = EGRESS_MARKS

INET4 = "203.0.113.1"
POOL = 2

LISTEN = """
import socket, time
s = socket.socket()
s.bind(("0.0.0.0", 4711))
s.listen(4)
print("listening", flush=True)
time.sleep(600)
"""


def pool_pins(daemon: Daemon) -> dict[str, int]:
    """The pool's pins now: name to the inode of the namespace pinned there."""
    directory = Path(daemon.root) / ".ns" / ".pool"
    found = {}
    for name in os.listdir(directory):
        try:
            found[name] = os.stat(directory / name).st_ino
        except FileNotFoundError:  # handed out meanwhile
            continue
    return found


def wait_full(daemon: Daemon) -> dict[str, int]:
    """The pool's pins once it holds :data:`POOL` wired namespaces (its refill is done)."""
    for _ in range(1000):
        pins = pool_pins(daemon)
        if len(pins) == POOL and len(host_ends()) >= POOL:
            return pins
        time.sleep(0.01)
    raise AssertionError(f"the pool did not refill: {pool_pins(daemon)}")


def host_ends() -> dict[int, str]:
    """The egress veths' host ends now, by ifindex."""
    ends = {}
    for name in os.listdir("/sys/class/net"):
        if name.startswith("sbx"):
            try:
                ends[int(Path(f"/sys/class/net/{name}/ifindex").read_text())] = name
            except OSError:  # deleted meanwhile (ENOENT, or EINVAL while it goes)
                continue
    return ends


def netns_inode(daemon: Daemon, rid: str) -> int:
    text = exec_out(daemon, rid, "readlink", "/proc/self/ns/net").strip()
    return int(text.removeprefix("net:[").removesuffix("]"))


def peer_index(daemon: Daemon, rid: str) -> int:
    """The host end's ifindex of the sandbox's ``eth0`` (``eth0@ifN``)."""
    link = exec_out(daemon, rid, "/bin/ip", "-o", "link", "show", "dev", "eth0")
    return int(link.split(":")[1].strip().split("@if")[1])


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, int]]:
    with scene() as s:
        inet = s.netns("inet")
        s.wire("p", inet, ["203.0.113.254/24"], [f"{INET4}/24"])
        server = s.serve(inet, INET4, "internet")
        base = 436000 + os.getpid() % 1000 * 20
        daemon = start_daemon(  # few uids: a freed slot comes round again soon
            tmp_path_factory.mktemp("pool"),
            f"--uid-min={base}",
            f"--uid-max={base + 4}",
            "--network-allow=none,egress",
            env={"SANDBOXD_NETNS_POOL": str(POOL), "SANDBOXD_EGRESS_POOL6": "none"},
        )
        try:
            yield daemon, server.port
        finally:
            stop_daemon(daemon)


def test_an_egress_create_takes_a_namespace_wired_before_it(
    pooled: tuple[Daemon, int],
) -> None:
    daemon, port = pooled
    before = wait_full(daemon)
    ends_before = host_ends()
    rid = create(daemon, "egress")
    assert netns_inode(daemon, rid) in before.values()  # the pool's, not a new one
    assert peer_index(daemon, rid) in ends_before  # its veth was there before the create
    assert reach(daemon, rid, INET4, port) == "ok internet"
    assert reach(daemon, rid, "127.0.0.1", daemon.port).startswith("refused")
    after = wait_full(daemon)  # refilled: a new namespace took the one handed out's place
    assert len(set(after.values()) - set(before.values())) == 1
    daemon.call("DELETE", f"/sandboxes/{rid}")


def test_a_none_sandbox_never_gets_a_pooled_namespace(pooled: tuple[Daemon, int]) -> None:
    daemon, port = pooled
    before = wait_full(daemon)
    rid = create(daemon, "none")
    assert netns_inode(daemon, rid) not in before.values()
    assert pool_pins(daemon) == before  # the pool gave nothing
    links = exec_out(daemon, rid, "/bin/ip", "-o", "link", "show").splitlines()
    assert [line.split(":")[1].strip() for line in links] == ["lo"]
    assert reach(daemon, rid, INET4, port).startswith("refused")
    daemon.call("DELETE", f"/sandboxes/{rid}")


def test_a_pooled_namespace_carries_nothing_of_a_previous_sandbox(
    pooled: tuple[Daemon, int],
) -> None:
    daemon, _ = pooled
    wait_full(daemon)
    first = create(daemon, "egress")
    said = exec_out(
        daemon,
        first,
        "sh",
        "-c",
        'python3 -u -c "$1" >"$HOME/out" 2>&1 </dev/null &'
        ' until [ -s "$HOME/out" ]; do sleep 0.05; done; cat "$HOME/out"',
        "sh",
        LISTEN,
    )
    assert said.strip() == "listening"
    first_ns = netns_inode(daemon, first)
    first_addr = exec_out(daemon, first, "/bin/ip", "-o", "-4", "addr", "show", "dev", "eth0")
    listeners = exec_out(daemon, first, "cat", "/proc/net/tcp").splitlines()[1:]
    assert any(line.split()[1].endswith(f":{4711:04X}") for line in listeners)
    status, body = daemon.call("DELETE", f"/sandboxes/{first}")
    assert status in (200, 204), body
    wait_full(daemon)
    second = create(daemon, "egress")
    assert netns_inode(daemon, second) != first_ns
    assert exec_out(daemon, second, "cat", "/proc/net/tcp").splitlines()[1:] == []
    assert exec_out(daemon, second, "cat", "/proc/net/tcp6").splitlines()[1:] == []
    addrs = exec_out(daemon, second, "/bin/ip", "-o", "addr", "show").splitlines()
    own = [line.split()[3] for line in addrs if " inet " in line]
    assert own[0] == "127.0.0.1/8" and len(own) == 2, addrs  # loopback and its own eth0
    assert own[1] not in first_addr
    routes = exec_out(daemon, second, "/bin/ip", "-o", "route", "show").splitlines()
    assert len(routes) == 2 and routes[0].startswith("default via "), routes
    assert " dev eth0 " in routes[1] and "scope link" in routes[1], routes
    daemon.call("DELETE", f"/sandboxes/{second}")


def eth0_address(daemon: Daemon, rid: str) -> str:
    line = exec_out(daemon, rid, "/bin/ip", "-o", "-4", "addr", "show", "dev", "eth0")
    return line.split()[3]


def test_a_policy_holds_in_a_pooled_namespace_and_leaves_with_its_sandbox(
    pooled: tuple[Daemon, int],
) -> None:
    daemon, port = pooled
    before = wait_full(daemon)
    status, body = daemon.call(
        "POST", "/sandboxes", {"network": {"mode": "egress", "deny_out": [f"{INET4}/32"]}}
    )
    assert status == 200, body
    denied = str(json.loads(body)["remote_id"])
    assert netns_inode(daemon, denied) in before.values()
    assert reach(daemon, denied, INET4, port).startswith("refused")
    address = eth0_address(daemon, denied)
    daemon.call("DELETE", f"/sandboxes/{denied}")
    for _ in range(40):  # until its slot (its address) serves another sandbox, through the pool
        wait_full(daemon)
        rid = create(daemon, "egress")
        if eth0_address(daemon, rid) == address:
            assert reach(daemon, rid, INET4, port) == "ok internet"  # nothing of the policy
            daemon.call("DELETE", f"/sandboxes/{rid}")
            return
        daemon.call("DELETE", f"/sandboxes/{rid}")
    raise AssertionError(f"slot of {address} never served again")
