"""``allow_internet_access`` in the E2B front: the network mode each answer picks.

The front's choice runs on the in-memory harness with the replica's network policy swapped
for the one under test (the harness has no namespaces, so each sandbox records the mode it
was given); the real modes, under a daemon as root, are in ``tests/kernel/test_egress_default.py``.
"""

from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from sandboxd.isolation.network.modes import HostNetwork, NetworkMode, NetworkPolicy, NoNetwork
from tests.e2b.memory import Memory, memory_front

LEFT_OUT = {"egress": "SANDBOXD_NETWORK_ALLOW=none,host leaves it out"}


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    yield from memory_front(str(tmp_path))


def with_policy(
    memory: Memory, modes: dict[str, NetworkMode], default: str, allowed: tuple[str, ...]
) -> None:
    """The replica's network policy becomes ``modes`` (as start-up would have chosen it)."""
    policy = NetworkPolicy.choose(modes, default, allowed, LEFT_OUT)
    isolation = memory.manager.isolation
    namespaces = attrs.evolve(isolation.namespaces, network=policy)
    memory.manager.isolation = attrs.evolve(isolation, namespaces=namespaces)


@attrs.frozen
class Egress(HostNetwork):
    name: str = "egress"


def network_of(memory: Memory, **body: object) -> str:
    entry = memory.create(**body)
    return memory.manager.sandboxes[entry.id].network


def refusal(memory: Memory, **body: object) -> tuple[int, str]:
    reply = memory.control("POST", "/sandboxes", {"templateID": "base", **body})
    return reply.status, reply.json()["message"]


def test_internet_access_is_egress_where_it_is_offered(memory: Memory) -> None:
    modes: dict[str, NetworkMode] = {"none": NoNetwork(), "egress": Egress(), "host": HostNetwork()}
    with_policy(memory, modes, "none", ("none", "egress", "host"))
    assert network_of(memory) == "egress"  # E2B's default: allowed
    assert network_of(memory, allow_internet_access=True) == "egress"
    assert network_of(memory, allow_internet_access=None) == "egress"
    assert network_of(memory, allow_internet_access=False) == "none"
    told = {
        s["sandboxID"]: s["allowInternetAccess"]
        for s in memory.control("GET", "/v2/sandboxes").json()
    }
    assert sorted(told.values()) == [False, True, True, True]
    for rid, sandbox in memory.manager.sandboxes.items():
        assert told[rid] == (sandbox.network == "egress")
        assert memory.control("GET", f"/sandboxes/{rid}").json()["allowInternetAccess"] is told[rid]


def test_internet_access_is_the_hosts_network_where_that_is_the_default(memory: Memory) -> None:
    assert memory.manager.isolation.namespaces.network.default == "host"  # no namespaces
    assert network_of(memory) == "host"


def test_internet_access_without_egress_is_refused_naming_the_setting(memory: Memory) -> None:
    modes: dict[str, NetworkMode] = {"none": NoNetwork(), "host": HostNetwork()}
    with_policy(memory, modes, "none", ("none", "host"))
    status, message = refusal(memory)
    assert status == 400
    assert message == (
        "allow_internet_access: network mode egress is not offered by this replica"
        " (SANDBOXD_NETWORK_ALLOW=none,host leaves it out); allow_internet_access=False"
        " creates a sandbox without network"
    )
    assert network_of(memory, allow_internet_access=False) == "none"
    assert memory.manager.isolation.uids.free == 9  # the refused create took nothing


def test_internet_access_offered_but_not_allowed_is_refused(memory: Memory) -> None:
    modes: dict[str, NetworkMode] = {"none": NoNetwork(), "egress": Egress(), "host": HostNetwork()}
    with_policy(memory, modes, "none", ("none",))
    status, message = refusal(memory, allow_internet_access=True)
    assert status == 400 and "SANDBOXD_NETWORK_ALLOW=none" in message, message


def test_internet_access_must_be_a_boolean(memory: Memory) -> None:
    assert refusal(memory, allow_internet_access="yes") == (
        400,
        "allow_internet_access: must be true or false",
    )
