"""The E2B SDK's ``network=`` options on a real daemon as root (docs/e2b.rst, "Networking"):
the unmodified ``e2b`` package creates sandboxes with ``allow_out``/``deny_out`` under E2B's
reading (``allow_out`` names exceptions to ``deny_out``), updates them with
``update_network``, and is refused what sandboxd cannot honour; commands in the sandboxes try
to reach the test's own "internet" (``test_egress_policy``'s).
"""

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b.sandbox.network import ALL_TRAFFIC

from tests.e2b.conftest import E2BDaemon, point_sdk_at, running_front
from tests.kernel.test_egress_daemon import CONNECT
from tests.kernel.test_egress_policy import A4, A6, B4, B6, internet  # noqa: F401 (fixture)

pytestmark = [pytest.mark.kernel]


@pytest.fixture
def front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[E2BDaemon]:
    with running_front(tmp_path, "--network-allow=none,egress") as started:
        yield point_sdk_at(monkeypatch, started)


def reached(sbx: Sandbox, ports: dict[str, int]) -> set[str]:
    found = set()
    for address, port in ports.items():
        run = sbx.commands.run(f"python3 -c {shlex.quote(CONNECT)} {address} {port}")
        if run.stdout.startswith("ok "):
            found.add(address)
    return found


def test_allow_out_names_exceptions_to_deny_out(
    front: E2BDaemon,
    internet: dict[str, int],  # noqa: F811
) -> None:
    only_a = Sandbox.create(timeout=120, network={"allow_out": [A4], "deny_out": [ALL_TRAFFIC]})
    not_b = Sandbox.create(timeout=120, network={"deny_out": [B4, B6]})
    allow_alone = Sandbox.create(timeout=120, network={"allow_out": [A4]})  # restricts nothing
    try:
        assert reached(only_a, internet) == {A4}  # all traffic: IPv6 too
        assert reached(not_b, internet) == {A4, A6}
        assert reached(allow_alone, internet) == set(internet)
        assert only_a.get_info().network == {
            "allow_out": ["203.0.113.1/32"],
            "deny_out": ["0.0.0.0/0", "::/0"],
        }
        only_a.update_network({"allow_out": [B4, A6], "deny_out": [ALL_TRAFFIC]})
        assert reached(only_a, internet) == {B4, A6}
        only_a.update_network({})  # omitted fields are cleared
        assert reached(only_a, internet) == set(internet)
        only_a.update_network({"allow_internet_access": False})
        assert reached(only_a, internet) == set()
    finally:
        for sbx in (only_a, not_b, allow_alone):
            sbx.kill()


def test_no_internet_with_exceptions_and_what_is_refused(
    front: E2BDaemon,
    internet: dict[str, int],  # noqa: F811
) -> None:
    sbx = Sandbox.create(timeout=120, allow_internet_access=False, network={"allow_out": [B4]})
    try:
        assert reached(sbx, internet) == {B4}
    finally:
        sbx.kill()
    offline = Sandbox.create(timeout=120, allow_internet_access=False)  # the none mode
    try:
        assert reached(offline, internet) == set()
        with pytest.raises(Exception, match="need mode egress, not none"):
            offline.update_network({"deny_out": [B4]})
    finally:
        offline.kill()
    for network, named in (
        (
            {"allow_out": ["169.254.169.254"], "deny_out": [ALL_TRAFFIC]},
            "169.254.169.254/32 is inside",
        ),
        (
            {"allow_out": ["exa_mple.com"], "deny_out": [ALL_TRAFFIC]},
            "'exa_mple.com' is not an address, CIDR or host name",
        ),
        (
            {"rules": {"api.example.com": [{"transform": {"headers": {"Host": "b"}}}]}},
            "Host cannot be set by a rule",
        ),
    ):
        with pytest.raises(Exception, match=named):
            Sandbox.create(timeout=120, network=network)  # type: ignore[arg-type]
