"""Per-sandbox egress policies through the daemon: a real ``twistd sandboxd`` as root, sandboxes
created with ``network: {"mode": "egress", "allow_out": [...], "deny_out": [...]}``, commands
run as their uids trying to reach the test's own "internet" (a namespace behind a veth with
servers on two IPv4 and two IPv6 addresses).

Allowed destinations are reached, denied and unlisted ones refused (IPv4 and IPv6); an
``allow_out`` naming what the operator denies is a ``400`` naming it; a policy replaced at
run time holds for the next connection; a slot's next sandbox, in the same daemon or the
next one after a ``SIGKILL``, inherits nothing of its last one's policy.
"""

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kernel.netns_helpers import EGRESS_MARKS, scene
from tests.kernel.test_egress_daemon import reach
from tests.support.daemon import Daemon, start_daemon, stop_daemon

pytestmark = EGRESS_MARKS

A4, B4 = "203.0.113.1", "203.0.113.2"
A6, B6 = "2001:db8:33::1", "2001:db8:33::2"
HOST4 = "203.0.113.254"


@pytest.fixture
def internet() -> Iterator[dict[str, int]]:
    """Servers answering ``a``/``b`` (IPv4) and ``a6``/``b6`` (IPv6); their ports by address."""
    with scene() as s:
        inet = s.netns("inet")
        inside = [f"{A4}/24", f"{B4}/24", f"{A6}/64", f"{B6}/64"]
        s.wire("p", inet, [f"{HOST4}/24", "2001:db8:33::fe/64"], inside)
        banners = {A4: "a", B4: "b", A6: "a6", B6: "b6"}
        yield {address: s.serve(inet, address, banner).port for address, banner in banners.items()}


def create(daemon: Daemon, network: Any) -> tuple[int, Any]:
    for _ in range(600):  # a restarted daemon answers 503 while it reclaims its predecessor's
        status, body = daemon.call("POST", "/sandboxes", {"network": network})
        if status != 503:
            break
        time.sleep(0.05)
    return status, json.loads(body)


def created(daemon: Daemon, network: Any) -> str:
    status, body = create(daemon, network)
    assert status == 200, body
    return str(body["remote_id"])


def reached(daemon: Daemon, rid: str, ports: dict[str, int]) -> set[str]:
    """The addresses of the internet the sandbox reaches (each answered with its banner)."""
    return {
        address
        for address, port in ports.items()
        if reach(daemon, rid, address, port).startswith("ok ")
    }


def start(tmp_path: Path, uids: int) -> Daemon:
    base = 470000 + os.getpid() % 1000 * 20
    return start_daemon(
        tmp_path, f"--uid-min={base}", f"--uid-max={base + uids - 1}", "--network-allow=egress"
    )


def test_allow_and_deny_lists_hold_and_are_shown(internet: dict[str, int], tmp_path: Path) -> None:
    daemon = start(tmp_path, 4)
    try:
        only_a = created(daemon, {"mode": "egress", "allow_out": [A4, "2001:db8:33::1/128"]})
        not_b = created(daemon, {"mode": "egress", "deny_out": ["203.0.113.2/32", B6]})
        wide = created(daemon, {"allow_out": ["0.0.0.0/0"], "deny_out": [B4]})  # mode: egress
        plain = created(daemon, "egress")
        assert reached(daemon, only_a, internet) == {A4, A6}
        assert reached(daemon, not_b, internet) == {A4, A6}
        assert reached(daemon, wide, internet) == {A4}  # no IPv6 allowed, B denied
        assert reached(daemon, plain, internet) == {A4, B4, A6, B6}
        listed = {
            s["remote_id"]: s["network"] for s in daemon.json("GET", "/sandboxes")["sandboxes"]
        }
        assert listed[only_a] == {
            "mode": "egress",
            "allow_out": ["203.0.113.1/32", "2001:db8:33::1/128"],
            "deny_out": [],
        }
        assert listed[plain] == {"mode": "egress", "allow_out": None, "deny_out": []}
        assert daemon.json("GET", f"/sandboxes/{wide}/network") == {
            "mode": "egress",
            "allow_out": ["0.0.0.0/0"],
            "deny_out": ["203.0.113.2/32"],
        }
    finally:
        stop_daemon(daemon)


@pytest.mark.parametrize(
    "entry",
    ["127.0.0.1", "169.254.169.254", "10.1.2.0/24", "fd00::1", "10.200.0.1", "::1"],
)
def test_an_allow_entry_the_operator_denies_is_a_400_naming_it(entry: str, tmp_path: Path) -> None:
    daemon = start(tmp_path, 2)
    try:
        status, body = create(daemon, {"mode": "egress", "allow_out": [entry]})
        assert status == 400, body
        assert entry.split("/")[0] in json.dumps(body)
        status, body = create(daemon, {"mode": "egress", "allow_out": ["exa_mple.com"]})
        assert status == 400 and "exa_mple.com" in json.dumps(body)
    finally:
        stop_daemon(daemon)


def test_a_policy_replaced_at_run_time_holds_for_the_next_connection(
    internet: dict[str, int], tmp_path: Path
) -> None:
    daemon = start(tmp_path, 2)
    try:
        rid = created(daemon, {"mode": "egress", "allow_out": [A4]})
        assert reached(daemon, rid, internet) == {A4}
        status, body = daemon.call(
            "PUT", f"/sandboxes/{rid}/network", {"allow_out": [B4, B6], "deny_out": []}
        )
        assert status == 200, body
        assert json.loads(body)["allow_out"] == ["203.0.113.2/32", "2001:db8:33::2/128"]
        assert reached(daemon, rid, internet) == {B4, B6}
        status, body = daemon.call("PUT", f"/sandboxes/{rid}/network", {"allow_out": ["::1"]})
        assert status == 400 and "::1" in body.decode()
        assert reached(daemon, rid, internet) == {B4, B6}  # the refused change changed nothing
        assert daemon.call("PUT", f"/sandboxes/{rid}/network", {})[0] == 200
        assert reached(daemon, rid, internet) == set(internet)
    finally:
        stop_daemon(daemon)


def test_a_slots_next_sandbox_inherits_nothing_even_after_a_sigkill(
    internet: dict[str, int], tmp_path: Path
) -> None:
    first = start(tmp_path, 1)  # one uid, one slot: every sandbox takes slot 0
    try:
        rid = created(first, {"mode": "egress", "deny_out": ["0.0.0.0/0", "::/0"]})
        assert reached(first, rid, internet) == set()
        first.call("DELETE", f"/sandboxes/{rid}")
        rid = created(first, "egress")
        assert reached(first, rid, internet) == set(internet)
        first.call("PUT", f"/sandboxes/{rid}/network", {"deny_out": ["0.0.0.0/0", "::/0"]})
        assert reached(first, rid, internet) == set()
        first.process.kill()
        first.process.wait()
        second = start(tmp_path, 1)
        try:
            rid = created(second, "egress")
            assert reached(second, rid, internet) == set(internet)
        finally:
            stop_daemon(second)
    finally:
        stop_daemon(first)
