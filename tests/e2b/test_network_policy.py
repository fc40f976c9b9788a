"""E2B's ``network`` options in the front (docs/e2b.rst, "Networking"): the policy each body
becomes, under E2B's reading (``allowOut`` names exceptions to ``denyOut``), and what is
refused; on the in-memory harness with a recording egress mode. Under a daemon as root, with
the unmodified SDK and a kernel enforcing it: ``tests/kernel/test_egress_policy_e2b.py``.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from sandboxd.isolation.network.egress_policy import EgressPolicy, parse_list
from sandboxd.isolation.network.modes import HostNetwork, NetworkMode, NoNetwork
from tests.e2b.memory import Memory, memory_front
from tests.e2b.test_networking import with_policy
from tests.unit.test_unit_manager_egress import PolicedMode

EVERYTHING = ["0.0.0.0/0", "::/0"]


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[tuple[Memory, PolicedMode]]:
    for front in memory_front(str(tmp_path)):
        mode = PolicedMode()
        modes: dict[str, NetworkMode] = {"none": NoNetwork(), "egress": mode, "host": HostNetwork()}
        with_policy(front, modes, "none", ("none", "egress", "host"))
        yield front, mode


def policy(allow: list[str], deny: list[str]) -> EgressPolicy:
    return EgressPolicy(parse_list("a", allow)[0], parse_list("d", deny)[0], allow_wins=True)


def named(base: EgressPolicy, allow: tuple[str, ...] = (), deny: tuple[str, ...] = ()) -> Any:
    return attrs.evolve(base, allow_names=allow, deny_names=deny)


@pytest.mark.parametrize(
    ("body", "mode", "wanted"),
    [
        ({"network": {"allowOut": ["192.0.2.1"], "denyOut": ["0.0.0.0/0"]}}, "egress",
         policy(["192.0.2.1"], EVERYTHING)),
        ({"network": {"denyOut": ["192.0.2.0/24"], "dnsServers": []}}, "egress",
         policy([], ["192.0.2.0/24"])),
        ({"network": {"allowOut": ["192.0.2.1"], "rules": {}}}, "egress", None),
        ({"allow_internet_access": False, "network": {"allowOut": ["192.0.2.1"]}}, "egress",
         policy(["192.0.2.1"], EVERYTHING)),
        ({"allow_internet_access": False, "network": {"denyOut": ["192.0.2.1"]}}, "none", None),
        ({"network": None, "allow_internet_access": True}, "egress", None),
        ({"network": {"allowOut": ["API.example.com"], "denyOut": ["0.0.0.0/0"]}}, "egress",
         named(policy([], EVERYTHING), allow=("api.example.com",))),
        ({"allow_internet_access": False, "network": {"allowOut": ["*.example.com"]}}, "egress",
         named(policy([], EVERYTHING), allow=("*.example.com",))),
        ({"network": {"denyOut": ["bad.example", "192.0.2.9"]}}, "egress",
         named(policy([], ["192.0.2.9"]), deny=("bad.example",))),
    ],
)  # fmt: skip
def test_bodies_become_policies(
    memory: tuple[Memory, PolicedMode], body: dict[str, Any], mode: str, wanted: Any
) -> None:
    front, egress = memory
    entry = front.create(**body)
    assert entry.sandbox.network == mode
    assert egress.staged.get(entry.sandbox.rid) == wanted


@pytest.mark.parametrize(
    ("network", "message"),
    [
        ([], "network: must be an object"),
        ({"maskRequestHost": "x"}, "network.maskRequestHost: not supported"),
        ({"egressProxy": {"address": "x"}}, "network.egressProxy.address: 'x' is not HOST:PORT"),
        ({"egressProxy": {"address": "proxy.example:1080"}}, "a host name is not supported"),
        (
            {"egressProxy": {"address": "203.0.113.80:1080", "tls": {"caCert": "x"}}},
            "network.egressProxy.tls.caCert: holds no PEM certificate",
        ),
        ({"allowPublicTraffic": "no"}, "network.allowPublicTraffic: must be true or false"),
        ({"allowOut": ["exa mple.com"], "denyOut": ["0.0.0.0/0"]}, "'exa mple.com' is not an"),
        ({"denyOut": "0.0.0.0/0"}, "network.denyOut: must be a list"),
        ({"allowOut": ["127.0.0.1"], "denyOut": ["0.0.0.0/0"]}, "127.0.0.1/32 is inside"),
    ],
)
def test_what_cannot_be_honoured_is_a_400(
    memory: tuple[Memory, PolicedMode], network: Any, message: str
) -> None:
    front, _ = memory
    reply = front.control("POST", "/v2/sandboxes", {"templateID": "base", "network": network})
    assert reply.status == 400 and message in reply.json()["message"]
    reply = front.control("POST", "/v2/sandboxes", {"allow_internet_access": "yes"})
    assert reply.status == 400 and "must be true or false" in reply.json()["message"]


def test_update_network_replaces_the_lists(memory: tuple[Memory, PolicedMode]) -> None:
    front, egress = memory
    rid = front.create(network={"denyOut": ["192.0.2.0/24"]}).id
    path = f"/sandboxes/{rid}/network"
    body = {"allowOut": ["192.0.2.1"], "denyOut": ["0.0.0.0/0"]}
    assert front.control("PUT", path, body).status == 204
    assert egress.policies[rid] == policy(["192.0.2.1"], EVERYTHING)
    assert front.control("GET", f"/sandboxes/{rid}").json()["network"] == {
        "allowOut": ["192.0.2.1/32"],
        "denyOut": ["0.0.0.0/0", "::/0"],
    }
    assert front.control("PUT", path, {}).status == 204  # omitted fields clear
    assert egress.policies[rid] == policy([], [])
    assert "network" not in front.control("GET", f"/sandboxes/{rid}").json()
    assert front.control("PUT", path, {"allow_internet_access": False}).status == 204
    assert egress.policies[rid] == policy([], EVERYTHING)
    reply = front.control("PUT", path, {"allowOut": ["127.0.0.1"], "denyOut": ["0.0.0.0/0"]})
    assert reply.status == 400 and "127.0.0.1/32 is inside" in reply.json()["message"]
    offline = front.create(allow_internet_access=False).id
    reply = front.control("PUT", f"/sandboxes/{offline}/network", {"denyOut": ["192.0.2.1"]})
    assert reply.status == 400 and "need mode egress, not none" in reply.json()["message"]


SECRET = "Bearer e2b-s3cr3t"


def test_static_header_rules_map_and_are_shown_without_their_values(
    memory: tuple[Memory, PolicedMode],
) -> None:
    front, egress = memory
    rules = {
        "API.example.com": [
            {"transform": {"headers": {"Authorization": "old"}}},
            {"transform": {"headers": {"Authorization": SECRET}}},
            {},
        ]
    }
    entry = front.create(network={"allowOut": ["api.example.com"], "rules": rules})
    staged = egress.staged[entry.sandbox.rid]
    assert staged.rules[0].pattern == "api.example.com"
    assert staged.rules[0].headers == (("Authorization", SECRET),)
    detail = front.control("GET", f"/sandboxes/{entry.id}").json()
    assert detail["network"]["rules"] == {
        "api.example.com": [{"transform": {"headers": {"Authorization": "***"}}}]
    }
    assert SECRET not in str(detail)
    path = f"/sandboxes/{entry.id}/network"
    assert (
        front.control(
            "PUT",
            path,
            {"rules": {"b.example": [{"transform": {}}, {"transform": {"headers": {"X": "1"}}}]}},
        ).status
        == 204
    )
    assert egress.policies[entry.sandbox.rid].rules[0].pattern == "b.example"


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([], "network.rules: must be an object"),
        ({"a.example": {}}, "network.rules.a.example: must be a list"),
        ({"a.example": [{"x": 1}]}, 'a rule is {"transform"'),
        ({"a.example": [{"transform": {"body": "x"}}]}, "a transform sets headers alone"),
        (
            {"a.example": [{"transform": {"headers": {"A": "${e2b.identity.tokens['x']}"}}}]},
            "workload identity tokens",
        ),
        ({"a.example": [{"transform": {"headers": {"Host": "b"}}}]}, "Host cannot be set"),
        ({"10.0.0.1": []}, "is not a host name"),
    ],
)
def test_rules_that_cannot_be_honoured_are_a_400(
    memory: tuple[Memory, PolicedMode], rules: Any, message: str
) -> None:
    front, _ = memory
    reply = front.control(
        "POST", "/v2/sandboxes", {"templateID": "base", "network": {"rules": rules}}
    )
    assert reply.status == 400 and message in reply.json()["message"]


PROXY_PASSWORD = "pr0xy-s3cret"


def test_an_egress_proxy_is_the_policys_own_socks5_shown_without_its_password(
    memory: tuple[Memory, PolicedMode],
) -> None:
    front, egress = memory
    proxy = {"address": "203.0.113.80:1080", "username": "me", "password": PROXY_PASSWORD}
    entry = front.create(network={"egressProxy": {**proxy, "tls": {"enabled": False}}})
    assert entry.sandbox.network == "egress"  # (a proxy alone asks for the mode that has one)
    socks = egress.staged[entry.sandbox.rid].socks5
    assert socks is not None and str(socks.address) == "203.0.113.80:1080"
    assert (socks.user, socks.password) == (b"me", PROXY_PASSWORD.encode())
    assert PROXY_PASSWORD not in repr(egress.staged[entry.sandbox.rid])
    detail = front.control("GET", f"/sandboxes/{entry.id}").json()
    assert detail["network"]["egressProxy"] == {"address": "203.0.113.80:1080", "username": "me"}
    assert PROXY_PASSWORD not in str(detail)
    path = f"/sandboxes/{entry.id}/network"
    assert (
        front.control("PUT", path, {"egressProxy": {"address": "[2001:db8::1]:1080"}}).status == 204
    )
    assert egress.policies[entry.sandbox.rid].to_json()["socks5"] == {
        "address": "[2001:db8::1]:1080"
    }
    assert front.control("PUT", path, {}).status == 204  # omitted: tunneled no more
    assert egress.policies[entry.sandbox.rid].socks5 is None
