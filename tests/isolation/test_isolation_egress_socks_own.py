"""A sandbox's own SOCKS5 proxy, without a kernel: the object both fronts send, the
operator's checks of its address, the slot's nft script that sends all its TCP to the egress
proxy, and the proxy choosing that SOCKS5 proxy over the operator's. The real thing (the
unmodified E2B SDK, nftables, a real SOCKS5 server): ``tests/kernel/test_egress_socks_own.py``.
"""

import ipaddress
from pathlib import Path
from typing import Any

import attrs
import pytest

from sandboxd.isolation.network.egress import EgressNetwork
from sandboxd.isolation.network.egress_policy import (
    EgressPolicy,
    check_allowed,
    parse_policy,
    policy_script,
)
from sandboxd.isolation.network.egress_socks import SocksAddress, SocksUpstream
from sandboxd.isolation.network.egress_socks_own import own_socks_json, parse_own_socks
from tests.isolation.test_isolation_egress import Host, plan
from tests.isolation.test_isolation_egress_proxy import GOOD, Listener
from tests.isolation.test_isolation_egress_socks import SOCKS, redirected, socks_proxy

OWN = {"address": "203.0.113.80:1080", "username": "me", "password": "pr0xy-s3cret"}
REJECT = "reject with icmpx type admin-prohibited"


def never_host(address: object) -> bool:
    return False


def test_the_object_parses_to_an_upstream_shown_without_its_password() -> None:
    upstream = parse_own_socks({**OWN, "tls": False}, "socks5")
    assert upstream == SocksUpstream(SocksAddress("203.0.113.80", 1080), b"me", b"pr0xy-s3cret")
    assert "pr0xy-s3cret" not in repr(upstream)
    assert own_socks_json(upstream) == {"address": "203.0.113.80:1080", "username": "me"}
    bare = parse_own_socks({"address": "[2001:db8::80]:1080", "tls": {"enabled": False}}, "p")
    assert own_socks_json(bare) == {"address": "[2001:db8::80]:1080"}
    assert parse_own_socks({"address": "192.0.2.1:1", "username": "u"}, "p").password is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("203.0.113.80:1080", "p: must be an object with an address"),
        ({"address": "203.0.113.80:1080", "user": "x"}, "p: unknown field 'user'"),
        ({}, "p.address: must be a string, ADDRESS:PORT"),
        ({"address": "203.0.113.80"}, "p.address: '203.0.113.80' is not HOST:PORT"),
        ({"address": "proxy.example:1080"}, "a host name is not supported"),
        ({**OWN, "username": 7}, "p.username: must be a string"),
        ({**OWN, "password": "x" * 256}, "p.password: must be 1 to 255 bytes"),
        ({**OWN, "username": ""}, "p.username: must be 1 to 255 bytes"),
        ({"address": "192.0.2.1:1", "password": "x"}, "p.password: needs a username"),
        ({**OWN, "tls": {"serverName": "x"}}, "p.tls: unknown field 'serverName'"),
        ({**OWN, "tls": "yes"}, "p.tls: must be true, false or an object"),
    ],
)
def test_what_cannot_be_honoured_is_named_never_the_password(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        parse_own_socks(value, "p")
    assert "pr0xy-s3cret" not in str(caught.value) and "x" * 256 not in str(caught.value)


def test_a_policy_with_a_proxy_is_not_empty_and_shows_it() -> None:
    policy = parse_policy(None, None, None, OWN)
    assert not policy.empty and not policy.by_name
    assert policy.to_json() == {
        "allow_out": None,
        "deny_out": [],
        "socks5": {"address": "203.0.113.80:1080", "username": "me"},
    }
    with pytest.raises(ValueError, match="socks5: unknown field"):
        parse_policy(None, None, None, {"x": 1})


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("127.0.0.1:1080", "address 127.0.0.1 is inside 127.0.0.0/8, which the operator denies"),
        ("169.254.169.254:80", "inside 169.254.0.0/16"),
        ("10.1.2.3:1080", "inside 10.0.0.0/8"),
        ("[::1]:1080", "inside ::/127"),
        ("[::ffff:127.0.0.1]:1080", "::ffff:7f00:1 is inside ::ffff:0:0/96"),
    ],
)
def test_a_proxy_in_a_range_the_operator_denies_is_refused(address: str, message: str) -> None:
    p = plan(deny=(ipaddress.ip_network("10.0.0.0/8"),))
    policy = parse_policy(None, None, None, {"address": address})
    with pytest.raises(ValueError, match=message):
        check_allowed(p, policy, 10, never_host)


def test_a_proxy_at_the_hosts_own_address_is_refused_another_is_fine() -> None:
    policy = parse_policy(None, None, None, OWN)
    with pytest.raises(ValueError, match=r"203\.0\.113\.80 is an address of the host itself"):
        check_allowed(plan(), policy, 10, lambda address: True)
    check_allowed(plan(), policy, 10, never_host)


def test_the_script_sends_all_its_tcp_to_the_proxy_and_forwards_none(tmp_path: Path) -> None:
    dns = (ipaddress.ip_address("10.96.0.10"), ipaddress.ip_address("2001:db8::53"))
    p = plan(proxy_port=4711, dns=dns)
    policy = parse_policy(["192.0.2.0/24"], None, None, OWN)
    script = policy_script(p, 2, policy).splitlines()
    assert script[3:] == [
        'add element inet sandboxd proxied { "sbx2" }',  # (its redirected TCP is accepted)
        'add element inet sandboxd tunneled { "sbx2" }',
        "add chain inet sandboxd proxy_redirect"
        " { type nat hook prerouting priority -100; policy accept; }",
        "flush chain inet sandboxd proxy_redirect",
        "add rule inet sandboxd proxy_redirect iifname @tunneled"
        " ip daddr { 10.96.0.10 } tcp dport 53 accept",
        "add rule inet sandboxd proxy_redirect iifname @tunneled"
        " ip6 daddr { 2001:db8::53 } tcp dport 53 accept",
        "add rule inet sandboxd proxy_redirect iifname @tunneled meta l4proto tcp"
        " redirect to :4711",
        "add rule inet sandboxd proxy_redirect iifname @proxied tcp dport { 80, 443 }"
        " redirect to :4711",
        f"add rule inet sandboxd policy2 meta l4proto tcp {REJECT}",  # never forwarded
        f"add rule inet sandboxd policy2 ip daddr != {{ 192.0.2.0/24 }} {REJECT}",
        f"add rule inet sandboxd policy2 meta nfproto ipv6 {REJECT}",
    ]
    assert "set tunneled { type ifname; }" in p.ruleset("drop")
    by_name = policy_script(p, 2, GOOD).splitlines()
    assert 'delete element inet sandboxd tunneled { "sbx2" }' in by_name
    assert not any("delete element inet sandboxd proxied" in line for line in by_name)
    with pytest.raises(ValueError, match="a SOCKS5 proxy in a policy need the egress proxy"):
        policy_script(plan(), 2, policy)
    mode = EgressNetwork(Host().egress(tmp_path), capacity=2)
    with pytest.raises(ValueError, match="SOCKS5 proxy of the sandbox's own needs the egress"):
        mode.check_policy(policy)
    mode.proxy = Listener()
    mode.check_policy(policy)


OWN_POLICY = EgressPolicy(socks5=SocksUpstream(SocksAddress("203.0.113.80", 1080)))


def test_the_sandboxs_own_proxy_wins_over_the_operators() -> None:
    proxy, reactor = socks_proxy(OWN_POLICY)  # the operator's: SOCKS (192.0.2.80)
    assert proxy.upstream_for(OWN_POLICY) == OWN_POLICY.socks5
    assert proxy.upstream_for(EgressPolicy()) == SocksUpstream(SOCKS)
    redirected(proxy, "203.0.113.1", 22)
    assert reactor.tcpClients[-1][:2] == ("203.0.113.80", 1080)


def test_without_the_operators_its_own_is_the_only_way_out() -> None:
    proxy, reactor = socks_proxy(attrs.evolve(GOOD, socks5=OWN_POLICY.socks5))
    proxy.socks = None
    _, transport = redirected(proxy, "203.0.113.1", 22)  # judged by address: names only
    assert transport.aborted and proxy.refused == {("a", "not_allowed"): 1}
    side, transport = redirected(proxy, "203.0.113.1", 443)
    side.dataReceived(b"GET / HTTP/1.1\r\nHost: good.example\r\n\r\n")  # its name is read
    assert reactor.tcpClients[-1][:2] == ("203.0.113.80", 1080)  # never direct
    assert len(reactor.tcpClients) == 1
