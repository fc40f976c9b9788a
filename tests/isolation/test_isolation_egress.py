"""The egress layer's plan and its host-side logic, with the programs and sysctls recorded.

The real kernel (veths, nftables, forwarding) is exercised in ``tests/kernel/test_egress*.py``;
here every branch of the logic runs without root: a recording runner stands for ``ip``/``nft``.
"""

import ipaddress
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sandboxd.isolation.network import egress as egress_module
from sandboxd.isolation.network import egress_host
from sandboxd.isolation.network.egress_host import (
    FORWARDING_V4,
    FORWARDING_V6,
    Egress,
    EgressError,
    run_program,
)
from sandboxd.isolation.network.egress_plan import (
    EgressConfigError,
    EgressPlan,
    parse_networks,
    parse_pool4,
    parse_pool6,
)

POOL4 = ipaddress.IPv4Network("10.200.0.0/16")
POOL6 = ipaddress.IPv6Network("fd53:616e:6462:6f78::/64")


def plan(**kw: Any) -> EgressPlan:
    return EgressPlan(kw.pop("pool4", POOL4), kw.pop("pool6", POOL6), **kw)


class Host:
    """Records programs run; sysctls, links and files as plain values."""

    def __init__(self, forwarding: str = "0") -> None:
        self.calls: list[tuple[list[str], str]] = []
        self.sysctls = {FORWARDING_V4: forwarding, FORWARDING_V6: forwarding}
        self.links: set[str] = set()
        self.fail: str | None = None
        self.operstate_after = 0
        self.now = 0.0

    def run(self, argv: Sequence[str], stdin: str) -> str:
        self.calls.append((list(argv), stdin))
        if self.fail is not None and self.fail in " ".join(argv) + stdin:
            raise EgressError(f"{argv[0]}: refused")
        if argv[:2] == ["ip", "-json"]:
            return json.dumps([{"ifname": name} for name in sorted(self.links)])
        if argv[:3] == ["ip", "link", "del"]:
            self.links.discard(argv[3])
        return ""

    def wire(self, p: EgressPlan, slot: int, netns: str) -> None:
        self.calls.append((["wire", str(slot), netns], ""))
        self.links.add(p.ifname(slot))
        if self.fail is not None and self.fail in netns:
            raise OSError(17, "File exists")

    def read(self, path: str) -> str:
        if path.endswith("/operstate"):
            self.operstate_after -= 1
            return "up" if self.operstate_after < 0 else "down"
        if path == egress_module.RESOLV_CONF:
            return "nameserver 127.0.0.53\nnameserver 192.0.2.53\n"
        return self.sysctls[path]

    def write(self, path: str, value: str) -> None:
        self.sysctls[path] = value

    def exists(self, path: str) -> bool:
        return path.rsplit("/", 1)[1] in self.links

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def egress(self, tmp: Path, p: EgressPlan | None = None) -> Egress:
        return Egress(
            p or plan(),
            state_file=str(tmp / "found.json"),
            lock_file=str(tmp / "lock"),
            run=self.run,
            read=self.read,
            write=self.write,
            clock=lambda: self.now,
            sleep=self.sleep,
            exists=self.exists,
            wire=self.wire,
        )

    def nft_inputs(self) -> list[str]:
        return [stdin for argv, stdin in self.calls if argv[0] == "nft"]


# The plan


def test_pools_and_ranges_parse_or_say_why() -> None:
    assert parse_pool4(" 10.1.0.0/24 ") == ipaddress.IPv4Network("10.1.0.0/24")
    assert parse_pool6("none") is None and parse_pool6("") is None and parse_pool6("OFF") is None
    assert parse_pool6("fd00::/120") == ipaddress.IPv6Network("fd00::/120")
    assert parse_networks("203.0.113.0/24, 2001:db8::/32 10.0.0.1") == (
        ipaddress.IPv4Network("203.0.113.0/24"),
        ipaddress.IPv6Network("2001:db8::/32"),
        ipaddress.IPv4Network("10.0.0.1/32"),
    )
    assert parse_networks("") == ()
    for bad, parse in [
        ("10.0.0.0/33", parse_pool4),
        ("fd00::/64", parse_pool4),
        ("10.0.0.1/32", parse_pool4),
        ("10.0.0.0/24", parse_pool6),
        ("fd00::1/128", parse_pool6),
        ("nonsense", parse_networks),
    ]:
        with pytest.raises(EgressConfigError):
            parse(bad)


def test_slots_addresses_and_names() -> None:
    p = plan(pool4=ipaddress.IPv4Network("10.9.0.0/24"), pool6=ipaddress.IPv6Network("fd00::/124"))
    assert p.slots == 8  # the IPv6 pool is the smaller here
    a = p.addresses(3)
    assert (str(a.host4), str(a.sandbox4)) == ("10.9.0.6", "10.9.0.7")
    assert (str(a.host6), str(a.sandbox6)) == ("fd00::6", "fd00::7")
    with pytest.raises(ValueError):
        p.addresses(8)
    assert p.ifname(12) == "sbx12" and p.slot_of("sbx12") == 12
    assert [p.slot_of(n) for n in ("sbx012", "sbxa", "eth0", "sbx")] == [None] * 4
    v4 = plan(pool6=None)
    assert v4.slots == POOL4.num_addresses // 2
    assert v4.addresses(0).host6 is None


def test_the_plan_checks_its_size_and_names() -> None:
    plan().check(2000)
    with pytest.raises(EgressConfigError, match="slots"):
        plan(pool4=ipaddress.IPv4Network("10.0.0.0/28")).check(20)
    with pytest.raises(EgressConfigError, match="too long"):
        plan(prefix="a_long_prefix").check(2000)
    with pytest.raises(EgressConfigError, match="identifiers"):
        plan(prefix="s-x").check(10)


def test_denied_ranges_always_hold_loopback_link_local_and_the_pools() -> None:
    deny4, deny6 = plan(deny=parse_networks("203.0.113.0/24 2001:db8::/32")).denied()
    for net in ("127.0.0.0/8", "169.254.0.0/16", "10.200.0.0/16", "203.0.113.0/24"):
        assert net in deny4
    for net in ("fe80::/10", "::/127", str(POOL6), "2001:db8::/32"):
        assert net in deny6
    assert str(POOL6) not in plan(pool6=None).denied()[1]


def test_the_ruleset_replaces_the_table_atomically() -> None:
    text = plan().ruleset("drop")
    assert text.startswith("table inet sandboxd\ndelete table inet sandboxd\n")
    assert "policy drop;" in text and "ip6 saddr fd53:616e:6462:6f78::/64" in text
    assert "ip6 saddr" not in plan(pool6=None).ruleset("accept").split("postrouting")[1]
    with pytest.raises(ValueError):
        plan().ruleset("maybe")
    assert plan().resolv_conf(["192.0.2.53", "2001:db8::53"]) == (
        "nameserver 192.0.2.53\nnameserver 2001:db8::53\n"
    )


# The host side


def test_start_turns_forwarding_on_remembers_it_and_stop_puts_it_back(tmp_path: Path) -> None:
    host = Host(forwarding="0")
    host.links = {"sbx4", "eth0"}  # a predecessor's veth
    e = host.egress(tmp_path)
    assert e.start() == [4]
    assert host.sysctls == {FORWARDING_V4: "1", FORWARDING_V6: "1"}
    assert json.loads((tmp_path / "found.json").read_text()) == {
        FORWARDING_V4: "0",
        FORWARDING_V6: "0",
    }
    assert "policy drop;" in host.nft_inputs()[-1]
    assert host.links == {"eth0"}
    e.stop()
    assert host.sysctls == {FORWARDING_V4: "0", FORWARDING_V6: "0"}
    assert not (tmp_path / "found.json").exists()
    assert host.nft_inputs()[-1].endswith("delete table inet sandboxd\n")
    e.start()  # the lock was released
    e.stop()


def test_forwarding_found_on_is_left_alone(tmp_path: Path) -> None:
    host = Host(forwarding="1")
    e = host.egress(tmp_path)
    e.start()
    assert "policy accept;" in host.nft_inputs()[-1]
    e.stop()
    assert host.sysctls == {FORWARDING_V4: "1", FORWARDING_V6: "1"}


def test_a_crashed_predecessors_found_values_are_the_ones_restored(tmp_path: Path) -> None:
    host = Host(forwarding="1")  # the predecessor turned it on, then died
    (tmp_path / "found.json").write_text(json.dumps({FORWARDING_V4: "0"}))
    host.sysctls[FORWARDING_V6] = "0"  # it had no IPv6 pool; this daemon has one
    e = host.egress(tmp_path)
    e.start()
    assert "policy drop;" in host.nft_inputs()[-1]
    assert json.loads((tmp_path / "found.json").read_text()) == {
        FORWARDING_V4: "0",
        FORWARDING_V6: "0",
    }
    assert e._found_sysctls()[FORWARDING_V6] == "0"  # read from the file, not the host, now
    e.stop()
    assert host.sysctls == {FORWARDING_V4: "0", FORWARDING_V6: "0"}


def test_a_refused_ruleset_leaves_nothing(tmp_path: Path) -> None:
    host = Host(forwarding="0")
    host.fail = "chain prerouting"
    e = host.egress(tmp_path)
    with pytest.raises(EgressError):
        e.start()
    assert host.sysctls == {FORWARDING_V4: "0", FORWARDING_V6: "0"}
    host.fail = None
    e.start()  # not locked any more
    e.stop()


def test_a_second_owner_is_refused(tmp_path: Path) -> None:
    first, second = Host().egress(tmp_path), Host().egress(tmp_path)
    first.start()
    with pytest.raises(EgressError, match="another sandboxd"):
        second.start()
    first.stop()


def test_attach_waits_for_the_link_and_cleans_up_a_failure(tmp_path: Path) -> None:
    host = Host()
    e = host.egress(tmp_path)
    host.links.add("sbx2")  # a lingering veth of the slot's previous sandbox
    host.operstate_after = 3
    e.attach("/ns/a", 2)
    assert [argv[:3] for argv, _ in host.calls] == [["ip", "link", "del"], ["wire", "2", "/ns/a"]]
    assert host.now > 0  # it waited for the link watcher
    host.operstate_after = 10**9
    e.attach("/ns/b", 3)  # never up: a warning, not a failure
    assert host.now > egress_host.UP_WAIT
    host.fail = "/ns/c"
    with pytest.raises(EgressError, match="File exists"):
        e.attach("/ns/c", 5)
    assert "sbx5" not in host.links
    with pytest.raises(ValueError):
        e.attach("relative/net", 6)
    assert e.links() == [2, 3]
    e.detach(2)
    e.detach(2)  # gone: no error
    assert e.links() == [3]


def test_a_link_the_kernel_deleted_meanwhile_is_no_error(tmp_path: Path) -> None:
    host = Host()
    e = host.egress(tmp_path)
    host.links.add("sbx1")
    real_run = host.run

    def racing(argv: Sequence[str], stdin: str) -> str:
        if argv[:3] == ["ip", "link", "del"]:
            host.links.discard(argv[3])
            raise EgressError("Cannot find device")
        return real_run(argv, stdin)

    e.run = racing
    e.detach(1)
    host.links.add("sbx1")
    host.fail = "link del"
    e.run = host.run
    with pytest.raises(EgressError):
        e.detach(1)


def test_the_sysctl_files_are_read_trimmed_and_written_as_given(tmp_path: Path) -> None:
    """The daemon's own reads and writes of ``/proc/sys`` (a file here: this host forwards
    already, so only a guest whose forwarding is off writes the real one)."""
    knob = tmp_path / "forwarding"
    knob.write_text("0\n")
    assert egress_host.read_sysctl(str(knob)) == "0"
    egress_host.write_sysctl(str(knob), "1")
    assert knob.read_text() == "1" and egress_host.read_sysctl(str(knob)) == "1"


def test_run_program_returns_stdout_or_says_why() -> None:
    assert run_program(["cat"], "hello") == "hello"
    with pytest.raises(EgressError, match="nope"):
        run_program(["sh", "-c", "echo nope >&2; exit 3"], "")
    with pytest.raises(EgressError, match="1"):
        run_program(["false"], "")
    with pytest.raises(EgressError):
        run_program(["/nonexistent/program"], "")
