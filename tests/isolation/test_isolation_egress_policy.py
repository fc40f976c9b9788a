"""Per-sandbox egress policies: parsing, the operator's checks, the nft script of a slot, and
the egress mode applying, replacing and clearing them (with the host fakes of
``test_isolation_egress``); the real kernel is exercised in ``tests/kernel/test_egress_policy.py``.
"""

import ipaddress
import socket
from pathlib import Path

import pytest

from sandboxd.isolation.network.egress import EgressNetwork
from sandboxd.isolation.network.egress_policy import (
    OPEN,
    EgressPolicy,
    PolicyHolder,
    check_allowed,
    is_host_address,
    parse_policy,
    policy_script,
)
from tests.isolation.test_isolation_egress import Host, plan


def nets(*texts: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(t) for t in texts)


def test_lists_parse_to_networks_without_duplicates() -> None:
    policy = parse_policy(["192.0.2.1", " 192.0.2.1/32", "2001:db8::/32"], None)
    assert policy == EgressPolicy(nets("192.0.2.1/32", "2001:db8::/32"), ())
    assert parse_policy(None, []) == OPEN and OPEN.empty
    assert not parse_policy([], None).empty  # an empty allow_out allows nothing
    assert parse_policy(None, ["198.51.100.7"]).to_json() == {
        "allow_out": None,
        "deny_out": ["198.51.100.7/32"],
    }


@pytest.mark.parametrize(
    ("allow", "deny", "message"),
    [
        ("192.0.2.1", None, "allow_out: must be a list"),
        (None, [1], "deny_out: must be a list"),
        (["example..com"], None, "'example..com' is not an address, CIDR or host name"),
        (None, ["*.x"], "'\\*.x' is not an address, CIDR or host name"),
    ],
)
def test_bad_lists_are_named(allow: object, deny: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_policy(allow, deny)


def never_host(address: object) -> bool:
    return False


@pytest.mark.parametrize(
    ("entry", "inside"),
    [
        ("127.0.0.1", "127.0.0.0/8"),
        ("169.254.169.254", "169.254.0.0/16"),
        ("10.200.0.0/24", "10.200.0.0/16"),  # the pool (POOL4 of the fakes)
        ("192.0.2.0/25", "192.0.2.0/24"),  # the operator's own range
        ("fe80::1", "fe80::/10"),
    ],
)
def test_allow_entries_inside_denied_ranges_are_refused(entry: str, inside: str) -> None:
    p = plan(deny=nets("192.0.2.0/24"))
    with pytest.raises(ValueError, match=f"{entry.split('/')[0]}.* inside {inside}"):
        check_allowed(p, parse_policy([entry], None), 10, never_host)


def test_wider_entries_denials_and_bounds() -> None:
    p = plan(deny=nets("192.0.2.0/24"))
    wide = parse_policy(["0.0.0.0/0", "::/0"], ["127.0.0.1", "192.0.2.0/24"])
    check_allowed(p, wide, 10, never_host)  # the operator's ranges stay denied inside
    with pytest.raises(ValueError, match="deny_out: 3 entries, at most 2"):
        check_allowed(p, parse_policy(None, ["1.1.1.1", "1.1.1.2", "1.1.1.3"]), 2, never_host)
    with pytest.raises(ValueError, match=r"198\.51\.100\.9 is an address of the host"):
        check_allowed(p, parse_policy(["198.51.100.9"], None), 10, lambda a: True)


def test_host_addresses_are_those_that_can_be_bound() -> None:
    assert is_host_address(ipaddress.ip_address("127.0.0.1"))
    assert not is_host_address(ipaddress.ip_address("192.0.2.77"))
    if socket.has_ipv6:
        assert not is_host_address(ipaddress.ip_address("2001:db8::77"))


def test_the_script_replaces_the_slots_chain_in_one_go() -> None:
    p = plan()
    script = policy_script(
        p, 3, parse_policy(["192.0.2.0/25", "192.0.2.128/25"], ["192.0.2.7", "2001:db8::1"])
    )
    assert script.splitlines() == [
        "add chain inet sandboxd policy3",
        "flush chain inet sandboxd policy3",
        'add element inet sandboxd policies { "sbx3" : jump policy3 }',
        'add element inet sandboxd proxied { "sbx3" }',  # (added to be deleted: never an error)
        'add element inet sandboxd tunneled { "sbx3" }',
        'delete element inet sandboxd tunneled { "sbx3" }',  # no SOCKS5 proxy of its own
        'delete element inet sandboxd proxied { "sbx3" }',  # no names: not proxied
        "add rule inet sandboxd policy3 ip daddr { 192.0.2.7/32 }"
        " reject with icmpx type admin-prohibited",
        "add rule inet sandboxd policy3 ip daddr != { 192.0.2.0/24 }"
        " reject with icmpx type admin-prohibited",
        "add rule inet sandboxd policy3 ip6 daddr { 2001:db8::1/128 }"
        " reject with icmpx type admin-prohibited",
        "add rule inet sandboxd policy3 meta nfproto ipv6 reject with icmpx type admin-prohibited",
    ]
    assert len(policy_script(p, 0, OPEN).splitlines()) == 7  # emptied: nothing rejected
    assert "iifname vmap @policies" in p.ruleset("drop")


def test_the_mode_applies_replaces_and_clears_a_sandboxs_policy(tmp_path: Path) -> None:
    host = Host()
    mode = EgressNetwork(host.egress(tmp_path), capacity=1, policy_entries_max=4)
    assert isinstance(mode, PolicyHolder)
    mode.prepare()
    strict = parse_policy(["198.51.100.1"], None)
    mode.check_policy(strict)
    with pytest.raises(ValueError, match="inside"):
        mode.check_policy(parse_policy(["127.0.0.1"], None))
    mode.stage_policy("gone", strict)
    mode.stage_policy("gone", None)  # its create failed before its attach
    mode.stage_policy("a", strict)
    mode.attach("a", "/ns/a")
    assert mode.policy("a") == strict
    assert "jump policy0" in host.nft_inputs()[-1] and "198.51.100.1/32" in host.nft_inputs()[-1]
    mode.set_policy("a", OPEN)
    assert mode.policy("a") == OPEN
    host.fail = "policy0"
    with pytest.raises(OSError, match="egress policy"):
        mode.set_policy("a", strict)
    assert mode.policy("a") == OPEN  # the previous one stays
    host.fail = None
    calls = len(host.calls)
    mode.detach("a", "/ns/a")  # an open policy: nothing to clear
    assert not any("policy0" in stdin for _, stdin in host.calls[calls:])
    mode.attach("b", "/ns/b")  # no policy asked for, nothing stale: no nft run for it
    assert mode.policy("b") == OPEN
    mode.set_policy("b", strict)
    mode.detach("b", "/ns/b")
    assert host.nft_inputs()[-1].splitlines()[-1].startswith("delete element")  # emptied
    mode.close()


def test_a_policy_that_cannot_be_cleared_is_cleared_by_the_slots_next_attach(
    tmp_path: Path,
) -> None:
    host = Host()
    mode = EgressNetwork(host.egress(tmp_path), capacity=1)
    mode.prepare()
    mode.stage_policy("a", parse_policy(None, ["0.0.0.0/0"]))
    mode.attach("a", "/ns/a")
    host.fail = "policy0"
    mode.detach("a", "/ns/a")  # logged; the slot is marked
    with pytest.raises(OSError, match="egress policy"):
        mode.attach("b", "/ns/b")  # still refused: the create fails rather than inherit
    mode.detach("b", "/ns/b")
    host.fail = None
    mode.attach("c", "/ns/c")
    assert host.nft_inputs()[-1].splitlines()[-1].startswith("delete element")
    mode.close()


def test_e2bs_reading_lets_the_exceptions_through_first() -> None:
    e2b = EgressPolicy(nets("192.0.2.1", "2001:db8::1"), nets("0.0.0.0/0", "::/0"), True)
    assert policy_script(plan(), 0, e2b).splitlines()[7:] == [
        "add rule inet sandboxd policy0 ip daddr { 192.0.2.1/32 } return",
        "add rule inet sandboxd policy0 ip6 daddr { 2001:db8::1/128 } return",
        "add rule inet sandboxd policy0 ip daddr { 0.0.0.0/0 }"
        " reject with icmpx type admin-prohibited",
        "add rule inet sandboxd policy0 ip6 daddr { ::/0 } reject with icmpx type admin-prohibited",
    ]
    assert e2b.to_json()["allow_wins"] is True and not e2b.empty
    assert EgressPolicy(nets("192.0.2.1"), (), True).empty  # exceptions to nothing
    v4_only = EgressPolicy(nets("192.0.2.1"), nets("0.0.0.0/0"), True)
    assert "ip6" not in policy_script(plan(), 0, v4_only)
