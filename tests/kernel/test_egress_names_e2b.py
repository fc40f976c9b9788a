"""Egress by name through the E2B SDK (docs/e2b.rst, "Networking"): the unmodified ``e2b``
package creates a sandbox with ``network={"allow_out": [names], "deny_out": [all traffic]}``,
as E2B's own documentation shows, and changes it with ``update_network``; commands in it try
the names of ``test_egress_names``'s "internet" (its servers, CA and DNS server).
"""

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b.sandbox.network import ALL_TRAFFIC

from tests.e2b.conftest import E2BDaemon, point_sdk_at, running_front
from tests.kernel.names_internet import NamesCA
from tests.kernel.test_egress_names import (  # noqa: F401 (fixture)
    A4,
    B4,
    DNS4,
    FETCH,
    Internet,
    internet,
)

pytestmark = [pytest.mark.kernel]


@pytest.fixture
def front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[E2BDaemon]:
    with running_front(tmp_path, "--network-allow=none,egress", f"--egress-dns={DNS4}") as started:
        yield point_sdk_at(monkeypatch, started)


def fetch(sbx: Sandbox, ca: NamesCA, name: str, address: str) -> str:
    argv = ["python3", "-c", FETCH, "https", name, address, "443", ca.pem]
    return sbx.commands.run(shlex.join(argv)).stdout.strip()


def test_names_in_allow_out_are_the_only_way_out(
    front: E2BDaemon,
    internet: Internet,  # noqa: F811
) -> None:
    ca = internet.ca
    sbx = Sandbox.create(
        timeout=120, network={"allow_out": ["*.good.example"], "deny_out": [ALL_TRAFFIC]}
    )
    try:
        assert fetch(sbx, ca, "api.good.example", B4) == "ok b api.good.example"
        assert fetch(sbx, ca, "good.example", A4).startswith("refused")  # not below itself
        assert fetch(sbx, ca, "other.example", A4).startswith("refused")
        assert sbx.get_info().network == {
            "allow_out": ["*.good.example"],
            "deny_out": ["0.0.0.0/0", "::/0"],
        }
        sbx.update_network({"allow_out": ["good.example"], "deny_out": [ALL_TRAFFIC]})
        assert fetch(sbx, ca, "good.example", A4) == "ok a good.example"
        assert fetch(sbx, ca, "api.good.example", B4).startswith("refused")
    finally:
        sbx.kill()
