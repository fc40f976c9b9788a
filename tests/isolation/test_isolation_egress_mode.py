"""The egress network mode and its configuration: offered by default or by name, the slots,
the nameservers let through, the denied ranges' defaults, with the programs and sysctls
recorded (the host fakes of ``test_isolation_egress``); the real kernel is exercised in
``tests/kernel/test_egress*.py``.
"""

import ipaddress
import json
from pathlib import Path

import pytest

from sandboxd.config import Config, ConfigError
from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.network import egress as egress_module
from sandboxd.isolation.network import egress_host
from sandboxd.isolation.network.egress import EgressNetwork, network_mode, unreachable_nameservers
from sandboxd.isolation.network.egress_host import FORWARDING_V4, FORWARDING_V6
from sandboxd.isolation.network.modes import NetworkUnavailable
from tests.isolation.test_isolation_egress import Host, plan


def test_the_mode_hands_out_slots_oldest_freed_first(tmp_path: Path) -> None:
    host = Host()
    mode = EgressNetwork(host.egress(tmp_path), capacity=3)
    mode.close()  # not started: nothing to do
    host.links.add("sbx7")  # a predecessor's
    mode.prepare()
    assert "sbx7" not in host.links
    for rid in ("a", "b", "c"):
        mode.attach(rid, f"/ns/{rid}")
    with pytest.raises(OSError, match="every slot"):
        mode.attach("d", "/ns/d")
    mode.detach("a", "/ns/a")
    mode.detach("zz", "/ns/zz")  # unknown (a predecessor's): nothing
    host.fail = "/ns/e"
    with pytest.raises(OSError, match="egress"):
        mode.attach("e", "/ns/e")
    host.fail = None
    mode.attach("f", "/ns/f")
    assert mode._slots == {"b": 1, "c": 2, "f": 0}
    mode.close()
    assert host.sysctls[FORWARDING_V4] == "0"


def test_prepare_names_the_layer_when_the_host_refuses(tmp_path: Path) -> None:
    host = Host()
    host.fail = "table"
    mode = EgressNetwork(host.egress(tmp_path), capacity=3)
    with pytest.raises(IsolationUnavailable, match="network mode egress"):
        mode.prepare()
    mode.close()


def test_unreachable_nameservers_are_found() -> None:
    conf = (
        "# c\nnameserver 127.0.0.53\nnameserver fe80::1%eth0\nnameserver x\nnameserver 192.0.2.1\n"
    )
    assert unreachable_nameservers(plan(), conf) == ["127.0.0.53", "fe80::1%eth0"]


def config(**env: str) -> Config:
    return Config.load({f"SANDBOXD_{k.upper()}": v for k, v in env.items()})


def test_network_mode_offered_by_default_unless_left_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    default = network_mode(config())
    assert isinstance(default, EgressNetwork) and default.lazy  # starts at its first create
    assert network_mode(config(network_allow="none,host")) is None
    mode = network_mode(config(network_allow="none,egress"))
    assert isinstance(mode, EgressNetwork) and mode.capacity == 2000 and not mode.lazy
    named = network_mode(config(network="egress"))
    assert isinstance(named, EgressNetwork) and not named.lazy
    with pytest.raises(IsolationUnavailable, match="SANDBOXD_EGRESS_POOL"):
        network_mode(config(network="egress", egress_pool="10.0.0.0/24"))
    monkeypatch.setattr(egress_module, "IPV6_SYSCTLS", "/nonexistent")
    with pytest.raises(IsolationUnavailable, match="SANDBOXD_EGRESS_POOL6=none"):
        network_mode(config(network="egress"))
    ipv4_only = network_mode(config())  # offered by default: IPv4 alone, as nothing was set
    assert ipv4_only is not None and ipv4_only.egress.plan.pool6 is None
    with pytest.raises(IsolationUnavailable, match="SANDBOXD_EGRESS_POOL6=none"):
        network_mode(config(egress_pool6="fd00:1::/64"))  # set, so not silently dropped
    assert network_mode(config(network="egress", egress_pool6="none")) is not None
    monkeypatch.setattr(egress_module.shutil, "which", lambda name: None)  # type: ignore[attr-defined]
    with pytest.raises(IsolationUnavailable, match="nftables"):
        network_mode(config(network="egress", egress_pool6="none"))
    with pytest.raises(IsolationUnavailable, match="nftables"):
        network_mode(config(egress_pool6="none"))


def test_the_hosts_nameservers_are_let_through_for_dns(tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 10.96.0.10\nnameserver 127.0.0.53\n")
    mode = network_mode(config(resolv_conf=str(resolv)))
    assert mode is not None and mode.resolv_conf == str(resolv)
    assert mode.egress.plan.dns == (ipaddress.ip_address("10.96.0.10"),)
    missing = network_mode(config(resolv_conf=str(tmp_path / "none")))
    assert missing is not None and missing.egress.plan.dns == ()


def test_private_ranges_are_denied_by_default_and_settable() -> None:
    deny4, deny6 = plan(deny=config().egress_deny).denied()
    for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"):
        assert net in deny4
    assert "fc00::/7" in deny6
    assert config(egress_deny="").egress_deny == ()
    assert "192.168.0.0/16" not in plan(deny=config(egress_deny="").egress_deny).denied()[0]


def test_dns_goes_to_the_nameservers_never_to_the_host_or_the_pool() -> None:
    conf = "".join(
        f"nameserver {a}\n"
        for a in (
            "10.96.0.10",
            "10.96.0.10",
            "127.0.0.53",
            "0.0.0.0",
            "::1",
            "fe80::1%eth0",
            "::ffff:10.0.0.1",
            "ff02::1",
            "10.200.0.1",
            "fd53:616e:6462:6f78::1",
            "169.254.169.254",
            "fd00::53",
            "bogus",
        )
    )
    p = plan(deny=config().egress_deny).with_nameservers(conf + "search x\nnameserver\n")
    assert [str(a) for a in p.dns] == ["10.96.0.10", "169.254.169.254", "fd00::53"]
    rules = p.ruleset("drop").split("chain from_sandbox")[1]
    dns4 = "ip daddr { 10.96.0.10, 169.254.169.254 } meta l4proto { tcp, udp } th dport 53 accept"
    dns6 = "ip6 daddr { fd00::53 } meta l4proto { tcp, udp } th dport 53 accept"
    assert rules.index(dns4) < rules.index(dns6) < rules.index("@deny4")
    assert "dport 53" not in plan().ruleset("drop")
    assert unreachable_nameservers(p, conf) == [
        "127.0.0.53",
        "0.0.0.0",
        "::1",
        "fe80::1%eth0",
        "::ffff:10.0.0.1",
        "ff02::1",
        "10.200.0.1",
        "fd53:616e:6462:6f78::1",
    ]


def test_offered_by_default_the_layer_lives_only_while_an_egress_sandbox_does(
    tmp_path: Path,
) -> None:
    host = Host(forwarding="0")
    mode = EgressNetwork(host.egress(tmp_path), capacity=3, lazy=True)
    mode.prepare()
    assert host.calls == [] and host.sysctls[FORWARDING_V4] == "0"  # nothing at start-up
    mode.attach("a", "/ns/a")
    mode.attach("b", "/ns/b")
    assert host.sysctls[FORWARDING_V4] == "1" and len(host.nft_inputs()) == 2  # started once
    mode.detach("a", "/ns/a")
    assert host.sysctls[FORWARDING_V4] == "1"
    mode.detach("b", "/ns/b")
    assert host.sysctls[FORWARDING_V4] == "0"  # the last one gone: the host as found
    assert host.nft_inputs()[-1].endswith("delete table inet sandboxd\n")
    mode.close()  # stopped already: nothing more
    host.fail = "/ns/c"
    with pytest.raises(OSError, match="egress"):
        mode.attach("c", "/ns/c")
    assert host.sysctls[FORWARDING_V4] == "0"  # a failed first attach leaves nothing
    host.fail = None
    mode.attach("d", "/ns/d")
    host.fail = "link show"  # the stop fails: a warning, the kill goes on
    mode.detach("d", "/ns/d")
    assert mode._slots == {}


def test_a_first_egress_create_that_cannot_start_the_layer_says_why(tmp_path: Path) -> None:
    owner = Host().egress(tmp_path)
    owner.start()
    host = Host(forwarding="0")
    mode = EgressNetwork(host.egress(tmp_path), capacity=3, lazy=True)
    with pytest.raises(NetworkUnavailable) as refused:
        mode.attach("a", "/ns/a")
    assert "another sandboxd owns the egress network" in str(refused.value)
    assert "SANDBOXD_NETWORK_ALLOW" in str(refused.value)
    assert host.sysctls[FORWARDING_V4] == "0" and mode._slots == {}
    owner.stop()
    mode.attach("a", "/ns/a")  # the lock is free now: the next create starts it
    mode.close()


def test_an_unreadable_resolv_conf_warns_of_nothing(tmp_path: Path) -> None:
    host = Host()
    egress = host.egress(tmp_path)
    egress.read = egress_host.read_sysctl  # the real file: missing (FileNotFoundError)
    mode = EgressNetwork(egress, capacity=3, lazy=True, resolv_conf=str(tmp_path / "none"))
    mode.prepare()
    assert host.calls == []
    assert egress_module.read_text(str(tmp_path / "none")) == ""


def test_bad_egress_settings_name_their_variable() -> None:
    for name, value in [
        ("egress_pool", "fd00::/64"),
        ("egress_pool6", "10.0.0.0/8"),
        ("egress_deny", "10.0.0.0/99"),
    ]:
        with pytest.raises(ConfigError, match=f"SANDBOXD_{name.upper()}"):
            config(**{name: value})
    shown = config(egress_deny="203.0.113.0/24").redacted()
    assert shown["SANDBOXD_EGRESS_DENY"] == (ipaddress.IPv4Network("203.0.113.0/24"),)


def test_offered_by_default_a_crashed_predecessors_layer_is_removed_at_start_up(
    tmp_path: Path,
) -> None:
    host = Host(forwarding="1")  # the predecessor turned it on, then died
    (tmp_path / "found.json").write_text(json.dumps({FORWARDING_V4: "0", FORWARDING_V6: "0"}))
    mode = EgressNetwork(host.egress(tmp_path), capacity=3, lazy=True)
    mode.prepare()
    assert host.sysctls == {FORWARDING_V4: "0", FORWARDING_V6: "0"}
    assert host.nft_inputs()[-1].endswith("delete table inet sandboxd\n")
    assert not (tmp_path / "found.json").exists() and not mode._started
    owner = Host(forwarding="1").egress(tmp_path)  # a live owner's layer stays
    owner.start()
    calls = len(host.calls)
    mode.prepare()
    assert len(host.calls) == calls and host.sysctls[FORWARDING_V4] == "0"
    assert (tmp_path / "found.json").exists()
    owner.stop()
