"""Header rules through the E2B SDK (docs/e2b.rst, "Networking"): the unmodified ``e2b``
package creates a sandbox with ``network={"allow_out": [...], "deny_out": [all traffic],
"rules": {host: [{"transform": {"headers": {...}}}]}}``, as E2B's documentation shows, and
changes the value with ``update_network``; a command in the sandbox talks to the upstream of
``test_egress_rules``'s "internet", which records what it got.
"""

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox
from e2b.sandbox.network import ALL_TRAFFIC

from tests.e2b.conftest import E2BDaemon, point_sdk_at, running_front
from tests.kernel.test_egress_rules import (
    A4,
    API,
    CLIENT,
    DNS4,
    SECRET,
    HeaderRecorder,
    auth_of,
    rules_internet,
)

pytestmark = [pytest.mark.kernel]


@pytest.fixture
def recorder() -> Iterator[HeaderRecorder]:
    with rules_internet() as (started, _):
        yield started


@pytest.fixture
def front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorder: HeaderRecorder
) -> Iterator[E2BDaemon]:
    with running_front(tmp_path, "--network-allow=none,egress", f"--egress-dns={DNS4}") as started:
        yield point_sdk_at(monkeypatch, started)


def talk(sbx: Sandbox, requests: list[dict[str, Any]]) -> list[Any]:
    argv = ["python3", "-c", CLIENT, A4, "80", json.dumps(requests), "no"]
    return list(json.loads(sbx.commands.run(shlex.join(argv)).stdout))


def test_a_static_transform_sets_the_header_and_update_network_changes_it(
    front: E2BDaemon, recorder: HeaderRecorder
) -> None:
    def rules(value: str) -> Any:
        return {API: [{"transform": {"headers": {"Authorization": value}}}]}

    sbx = Sandbox.create(
        timeout=120,
        network={"allow_out": [API], "deny_out": [ALL_TRAFFIC], "rules": rules(SECRET)},
    )
    try:
        answers = talk(sbx, [{"host": API}, {"host": API, "headers": {"Authorization": "mine"}}])
        assert [answer["n"] for answer in answers] == [1, 2]
        assert [auth_of(seen) for seen in recorder.seen] == [[SECRET]] * 2
        assert sbx.get_info().network == {
            "allow_out": [API],
            "deny_out": ["0.0.0.0/0", "::/0"],
            "rules": rules("***"),
        }
        sbx.update_network(
            {"allow_out": [API], "deny_out": [ALL_TRAFFIC], "rules": rules("Bearer other")}
        )
        assert talk(sbx, [{"host": API}])[0]["n"] == 1
        assert auth_of(recorder.seen[-1]) == ["Bearer other"]
    finally:
        sbx.kill()
