"""The egress network mode against the real kernel: the sandbox reaches "the internet" and
nothing else (as root; every namespace, veth, table and sysctl made or changed is put back).

The test builds its own world: a namespace ``inet`` behind a veth, holding a server on
198.51.100.1 (and 2001:db8:51::1, and 203.0.113.7 for a configured extra deny range), a
namespace ``meta`` holding a server on 169.254.169.254 behind another veth (a cloud metadata
service), and two sandbox stand-ins (namespaces of :class:`Scene`'s own) attached by
:class:`Egress`. Each refusal is shown to be the layer's doing: with the table removed (veths
and forwarding unchanged), or the extra range not configured, the same connection succeeds.
"""

import ipaddress
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from attrs import define, evolve

from sandboxd.isolation.network import rtnl
from sandboxd.isolation.network.egress_host import FORWARDING_V4, FORWARDING_V6, Egress, EgressError
from sandboxd.isolation.network.egress_plan import EgressPlan, parse_networks
from tests.kernel.netns_helpers import Scene, Server, connect, scene, sh

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and nftables need root"),
    pytest.mark.skipif(
        subprocess.run(
            ["sh", "-c", "command -v nft && command -v ip"], capture_output=True
        ).returncode
        != 0,
        reason="needs nft (nftables) and ip (iproute2)",
    ),
]

INET4 = "198.51.100.1"
INET6 = "2001:db8:51::1"
DENIED_EXTRA = "203.0.113.7"
METADATA = "169.254.169.254"
HOST_ON_INET4 = "198.51.100.254"


@define
class World:
    scene: Scene
    egress: Egress
    inet: str
    a: str
    b: str
    servers: dict[str, Server]
    found: dict[str, str]

    def reload(self, plan: EgressPlan | None = None) -> None:
        """Load the (given, else the egress's own) ruleset again."""
        policy = "drop" if "0" in self.found.values() else "accept"
        self.egress.run(["nft", "-f", "-"], (plan or self.egress.plan).ruleset(policy))

    @contextmanager
    def protection_off(self) -> Iterator[None]:
        """Without the table (veths, routes and forwarding as they are): the layer off."""
        sh("nft", "delete", "table", "inet", self.egress.plan.table)
        try:
            yield
        finally:
            self.reload()


def read(path: str) -> str:
    return Path(path).read_text().strip()


def sysctls_found() -> dict[str, str]:
    return {path: read(path) for path in (FORWARDING_V4, FORWARDING_V6)}


def table_exists(table: str) -> bool:
    return (
        subprocess.run(["nft", "list", "table", "inet", table], capture_output=True).returncode == 0
    )


def make_egress(tmp: Path, tag: str, deny: str = DENIED_EXTRA + "/24", v6: bool = True) -> Egress:
    plan = EgressPlan(
        ipaddress.IPv4Network("10.250.0.0/24"),
        ipaddress.IPv6Network("fd53:7465:7374::/120") if v6 else None,
        parse_networks(deny),
        table=f"sandboxd_t{tag}",
        prefix=f"egs{tag}x",
    )
    return Egress(plan, state_file=str(tmp / "egress-found"), lock_file=str(tmp / "egress.lock"))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    found = sysctls_found()
    tmp = tmp_path_factory.mktemp("egress")
    with scene() as s:
        egress = make_egress(tmp, s.tag)
        try:
            inet = s.netns("inet")
            s.wire(
                "i",
                inet,
                [f"{HOST_ON_INET4}/24", "2001:db8:51::fe/64"],
                [f"{INET4}/24", f"{INET6}/64", f"{DENIED_EXTRA}/32"],
            )
            sh("ip", "route", "add", f"{DENIED_EXTRA}/32", "via", INET4)
            meta = s.netns("meta")
            s.wire("m", meta, ["169.254.0.1/16"], [f"{METADATA}/16"])
            # It answers whoever asks (without masquerading, the sandbox's own address).
            sh("nsenter", f"--net={meta}", "ip", "route", "add", "default", "via", "169.254.0.1")
            a, b = s.netns("a"), s.netns("b")
            egress.start()
            egress.attach(a, 0)
            egress.attach(b, 1)
            b_addrs = egress.plan.addresses(1)
            gateway = str(egress.plan.addresses(0).host4)
            servers = {
                "inet4": s.serve(inet, INET4, "inet4"),
                "inet6": s.serve(inet, INET6, "inet6"),
                "extra": s.serve(inet, DENIED_EXTRA, "extra"),
                "metadata": s.serve(meta, METADATA, "metadata"),
                "loopback": s.serve(None, "127.0.0.1", "loopback"),
                "gateway": s.serve(None, gateway, "gateway"),
                "host": s.serve(None, HOST_ON_INET4, "host"),
                "sandbox4": s.serve(b, str(b_addrs.sandbox4), "sandbox4"),
                "sandbox6": s.serve(b, str(b_addrs.sandbox6), "sandbox6"),
            }
            yield World(s, egress, inet, a, b, servers, found)
        finally:
            egress.stop()
    assert sysctls_found() == found, "forwarding sysctls not restored"
    assert not table_exists(egress.plan.table)
    assert not [n for n in os.listdir("/sys/class/net") if n.startswith(egress.plan.prefix)]


def reach(world: World, name: str, netns: str | None = None) -> str:
    server = world.servers[name]
    return connect(world.a if netns is None else netns, server.address, server.port)


@pytest.mark.parametrize("name", ["inet4", "inet6"])
def test_the_sandbox_reaches_the_outside_world(world: World, name: str) -> None:
    assert reach(world, name) == name


@pytest.mark.parametrize("name", ["gateway", "host", "sandbox4", "sandbox6", "metadata"])
def test_refused_with_the_layer_and_reached_without(world: World, name: str) -> None:
    refused = reach(world, name)
    assert refused.startswith("refused:"), refused
    with world.protection_off():
        assert reach(world, name) == name
    assert reach(world, name) == refused


def test_a_configured_extra_range_is_refused(world: World) -> None:
    refused = reach(world, "extra")
    assert refused.startswith("refused:"), refused
    world.reload(evolve(world.egress.plan, deny=()))
    try:
        assert reach(world, "extra") == "extra"
    finally:
        world.reload()


def test_host_loopback_is_the_sandbox_own(world: World) -> None:
    server = world.servers["loopback"]
    assert connect(None, server.address, server.port) == "loopback"  # host network: reached
    assert connect(world.a, server.address, server.port).startswith("refused:")


def test_the_host_cannot_open_connections_into_a_sandbox(world: World) -> None:
    server = world.servers["sandbox4"]
    refused = connect(None, server.address, server.port)
    assert refused.startswith("refused:"), refused
    with world.protection_off():
        assert connect(None, server.address, server.port) == "sandbox4"


def test_nothing_else_is_forwarded_because_forwarding_was_turned_on(world: World) -> None:
    if "0" not in world.found.values():
        pytest.skip("forwarding was already on here: the table leaves others' forwarding alone")
    inet = world.inet
    sh("nsenter", f"--net={inet}", "ip", "route", "add", "169.254.0.0/16", "via", HOST_ON_INET4)
    server = world.servers["metadata"]
    assert connect(inet, server.address, server.port, timeout=1.0) == "timeout"
    with world.protection_off():
        assert connect(inet, server.address, server.port) == "metadata"


def test_a_second_daemon_cannot_take_the_layer(world: World, tmp_path: Path) -> None:
    other = Egress(
        world.egress.plan, state_file=str(tmp_path / "f"), lock_file=world.egress.lock_file
    )
    with pytest.raises(EgressError, match="another sandboxd"):
        other.start()
    assert table_exists(world.egress.plan.table)


def test_a_crashed_predecessor_is_reclaimed(tmp_path: Path) -> None:
    found = sysctls_found()
    with scene() as s:
        # Not the module's world: a table and veths of its own (and IPv4 only).
        first = make_egress(tmp_path, f"{s.tag}c", v6=False)
        sandbox = s.netns("c")
        first.start()
        try:
            first.attach(sandbox, 5)
            first._unlock()  # the process died: its lock went with it, nothing else did
            second = make_egress(tmp_path, f"{s.tag}c", v6=False)
            assert second.start() == [5]
            try:
                assert not os.path.exists(f"/sys/class/net/{first.plan.ifname(5)}")
                second.attach(sandbox, 5)
                second.detach(5)
                assert second.links() == []
            finally:
                second.stop()
        finally:
            first.stop()
    assert sysctls_found() == found
    assert not table_exists(first.plan.table)


def test_rtnetlink_refusals_carry_the_kernel_errno(world: World) -> None:
    here = rtnl.open_here()
    fd = os.open(world.b, os.O_RDONLY)
    try:
        with pytest.raises(FileExistsError):  # the slot's veth is there already
            here.add_veth(world.egress.plan.ifname(1), "eth9", fd)
    finally:
        here.close()
        os.close(fd)
    with open("/dev/null") as not_a_namespace, pytest.raises(OSError, match="setns"):
        rtnl.socket_in(not_a_namespace.fileno())
