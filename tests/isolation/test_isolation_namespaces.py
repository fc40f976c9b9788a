"""The namespace layer's logic without root: settings, network policy, argv layouts, pins.

The kernel side (the helper's and the shell chain's namespaces made and entered for real, the
attacks) is in ``tests/kernel/test_namespaces*.py``; here the mount calls and the runner are
recording stand-ins.
"""

import ctypes
import errno
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from attrs import define, evolve, field
from twisted.internet.task import Clock

from sandboxd.config import Config, ConfigError
from sandboxd.isolation.base import Identity, IsolationUnavailable
from sandboxd.isolation.namespaces.creators import HelperCreator
from sandboxd.isolation.namespaces.kinds import ALL, parse_namespaces
from sandboxd.isolation.namespaces.mounts import MountCalls, is_mount_point, re_octal
from sandboxd.isolation.namespaces.pins import (
    HOME_VIEW,
    Namespaces,
    home_coverable,
    kept_directories,
)
from sandboxd.isolation.namespaces.shell import ShellCreator, ShellPrograms
from sandboxd.isolation.network.modes import (
    HostNetwork,
    NetworkPolicy,
    NoNetwork,
    find_egress,
    host_only,
    parse_mode,
    parse_modes,
)
from sandboxd.isolation.select import build_isolation
from tests.isolation.test_isolation_select import POOL, Machine, config

RID = "0123456789abcdef"


@define
class FakeMounts:
    calls: list[tuple[str, str]] = field(factory=list)
    stacked: dict[str, int] = field(factory=dict)
    refuse: bool = False

    def bind(self, source: str, target: str) -> None:
        if self.refuse:
            raise OSError(errno.EPERM, "Operation not permitted", target)
        self.calls.append(("bind", target))

    def make_private(self, target: str) -> None:
        self.calls.append(("private", target))

    def unmount_all(self, target: str) -> None:
        self.calls.append(("unmount", target))


@define
class Runner:
    """Records each argv; makes the pin files the helper would (exit ``code``)."""

    code: int = 0
    argvs: list[list[str]] = field(factory=list)

    def __call__(self, argv: Sequence[str]) -> tuple[int, str]:
        self.argvs.append(list(argv))
        if self.code == 0 and argv[1] == "namespaces":
            for kind, name in (("i", "ipc"), ("m", "mnt"), ("n", "net"), ("p", "pid")):
                if kind in argv[4]:
                    Path(argv[2], argv[3], name).touch()
        return self.code, "sandboxd-exec: unshare: Operation not permitted"


@define
class Egress:
    name: str = "egress"
    own_namespace: bool = True
    wired: list[tuple[str, str, str]] = field(factory=list)

    def prepare(self) -> None:
        self.wired.append(("prepare", "", ""))

    def close(self) -> None:
        self.wired.append(("close", "", ""))

    def attach(self, rid: str, netns: str) -> None:
        self.wired.append(("attach", rid, netns))

    def detach(self, rid: str, netns: str) -> None:
        self.wired.append(("detach", rid, netns))


NO_PID = frozenset(ALL) - {"pid"}
"""The layers these tests make (``pid``'s own are ``tests/isolation/test_isolation_pidns.py``)."""


def namespaces(tmp_path: Path, runner: Runner, egress: Egress | None = None) -> Namespaces:
    offered: dict[str, Any] = {"none": NoNetwork(), "host": HostNetwork()}
    if egress is not None:
        offered["egress"] = egress
    policy = NetworkPolicy.choose(offered, None, None, {})
    return Namespaces(
        kinds=NO_PID,
        nsroot=str(tmp_path / ".ns"),
        network=policy,
        creator=HelperCreator("/h/sandboxd-exec"),
        run=runner,
        mounts=FakeMounts(),  # type: ignore[arg-type]
    )


def test_settings_parse_and_refuse_in_one_line() -> None:
    assert parse_namespaces("all") == frozenset(ALL)
    assert parse_namespaces(" None ") == frozenset()
    assert parse_namespaces("ipc, net") == {"ipc", "net"}
    for bad in ("", "ipc,pid", "ipc,uts"):
        with pytest.raises(ValueError):
            parse_namespaces(bad)
    assert parse_modes("host, none,host") == ("host", "none")
    assert parse_mode("egress") == "egress"
    for bad in (",", "wifi"):
        with pytest.raises(ValueError):
            parse_modes(bad)
    with pytest.raises(ValueError, match="more than one"):
        parse_mode("none,host")
    with pytest.raises(ConfigError, match="SANDBOXD_NAMESPACES"):
        Config.load({"SANDBOXD_NAMESPACES": "pid"})
    with pytest.raises(ConfigError, match="SANDBOXD_NETWORK_ALLOW"):
        Config.load({"SANDBOXD_NETWORK_ALLOW": "wifi"})


def test_policy_defaults_to_the_strongest_allowed_and_names_refusals() -> None:
    offered: dict[str, Any] = {"none": NoNetwork(), "host": HostNetwork()}
    policy = NetworkPolicy.choose(offered, None, None, {})
    assert (policy.default, policy.allowed) == ("none", ("none", "host"))
    assert policy.capabilities() == ["network.none", "network.host"]
    assert policy.mode(None).name == "none" and policy.mode("host").name == "host"
    only_host = NetworkPolicy.choose(offered, None, ["host"], {})
    assert only_host.default == "host"
    for requested, message in [
        (3, "must be a string"),
        ("wifi", "is not one of"),
        ("egress", r"not offered by this replica \(not offered\)"),
        ("none", r"not allowed here \(SANDBOXD_NETWORK_ALLOW=host\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            only_host.mode(requested)
    why = {"egress": "its module is not installed"}
    with pytest.raises(IsolationUnavailable, match=r"NETWORK_ALLOW: .*egress.*not installed"):
        NetworkPolicy.choose(offered, None, ["egress"], why)
    with pytest.raises(IsolationUnavailable, match=r"SANDBOXD_NETWORK: .*egress.*not installed"):
        NetworkPolicy.choose(offered, "egress", ["host"], why)
    with pytest.raises(IsolationUnavailable, match="none is not in SANDBOXD_NETWORK_ALLOW"):
        NetworkPolicy.choose(offered, "none", ["host"], why)
    assert host_only().capabilities() == ["network.host"]
    for mode in (NoNetwork(), HostNetwork()):
        mode.attach(RID, "/x")
        mode.detach(RID, "/x")


def test_egress_is_offered_only_when_its_module_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert find_egress(None, "sandboxd_no_such_egress_module") is None
    (tmp_path / "fake_egress_plugin.py").write_text(
        "def network_mode(config):\n    return ('egress for', config)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert find_egress("cfg", "fake_egress_plugin") == ("egress for", "cfg")
    sys.modules.pop("fake_egress_plugin", None)


def test_kept_directories_are_the_tops_inside_shared_places() -> None:
    assert kept_directories(["/tmp", "/dev/shm"], ["/tmp/a/b/root", "/var/lib/x", "/tmp/a/t"]) == [
        "/tmp/a"
    ]
    assert kept_directories(["/tmp"], ["/tmp", "/tmpx/y"]) == []


def test_create_pins_enters_mount_last_and_removes(tmp_path: Path) -> None:
    runner = Runner()
    egress = Egress()
    ns = namespaces(tmp_path, runner, egress)
    os.makedirs(ns.nsroot)
    ns.create(RID, "/root/x/tmp", "/root/x/workspace", egress)
    pins = tmp_path / ".ns" / RID
    assert runner.argvs == [
        [
            "/h/sandboxd-exec",
            "namespaces",
            ns.nsroot,
            RID,
            "imn",
            "/root/x/tmp",
            "/root/x/workspace",
            str(64 << 20),
        ]
    ]
    assert egress.wired == [("attach", RID, str(pins / "net"))]
    assert ns.enter(RID, ["/h/sandboxd-exec", "sandbox", "1"]) == [
        "/h/sandboxd-exec",
        "enter",
        "3",
        str(pins / "ipc"),
        str(pins / "net"),
        str(pins / "mnt"),
        "/h/sandboxd-exec",
        "sandbox",
        "1",
    ]
    assert ns.leftovers() == [RID]
    assert ns.capabilities() == [
        "isolation.ipc",
        "isolation.mount",
        "isolation.net",
        "network.egress",
        "network.host",
        "network.none",
    ]
    ns.remove(RID)
    assert egress.wired[-1] == ("detach", RID, str(pins / "net"))
    assert not pins.exists() and ns.leftovers() == []
    assert ns.enter(RID, ["cmd"]) == ["cmd"]
    ns.remove(RID)  # twice: nothing left, no error


def test_a_sandbox_given_a_bundle_has_it_beside_its_pins(tmp_path: Path) -> None:
    ns = namespaces(tmp_path, Runner())
    os.makedirs(ns.nsroot)
    ns.create(RID, "/t", "/w", HostNetwork(), trust=b"HOST CAS\nDAEMON CA\n")
    bundle = tmp_path / ".ns" / RID / "ca-certificates.crt"  # (the helper binds it)
    assert bundle.read_bytes() == b"HOST CAS\nDAEMON CA\n"
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o644
    ns.create(RID + "1", "/t", "/w", HostNetwork())
    assert not (tmp_path / ".ns" / (RID + "1") / "ca-certificates.crt").exists()


def test_a_host_sandbox_gets_no_network_pin_and_a_refusal_is_an_oserror(tmp_path: Path) -> None:
    runner = Runner()
    ns = namespaces(tmp_path, runner)
    os.makedirs(ns.nsroot)
    ns.create(RID, "/t", "/w", HostNetwork())
    assert runner.argvs[0][4] == "im"
    assert [p.rsplit("/", 1)[1] for p in ns.enter(RID, ["x"])[3:5]] == ["ipc", "mnt"]
    ns.remove(RID)
    runner.code = 125
    with pytest.raises(OSError, match=r"exit 125.*Operation not permitted"):
        ns.create(RID, "/t", "/w", NoNetwork())
    ns.remove(RID)


def test_no_pin_root_yet_means_no_leftovers(tmp_path: Path) -> None:
    ns = namespaces(tmp_path, Runner())
    assert ns.nsroot and not os.path.exists(ns.nsroot)  # a first start: nothing made it yet
    assert ns.leftovers() == []


def test_recovery_detaches_whatever_wired_a_predecessor(tmp_path: Path) -> None:
    egress = Egress()
    ns = namespaces(tmp_path, Runner(), egress)
    (tmp_path / ".ns" / RID).mkdir(parents=True)
    (tmp_path / ".ns" / RID / "net").touch()
    (tmp_path / ".ns" / "not-a-rid").mkdir()
    assert ns.leftovers() == [RID]
    ns.remove(RID)
    assert egress.wired == [("detach", RID, str(tmp_path / ".ns" / RID / "net"))]
    assert not (tmp_path / ".ns" / RID).exists()


def test_prepare_binds_privately_probes_and_refuses_loudly(tmp_path: Path) -> None:
    runner = Runner()
    ns = namespaces(tmp_path, runner)
    ns.prepare()
    mounts = ns.mounts
    assert isinstance(mounts, FakeMounts)
    assert mounts.calls[:2] == [("bind", ns.nsroot), ("private", ns.nsroot)]
    assert runner.argvs[0][3] == "0" * 16 and not os.listdir(ns.nsroot)
    ns.close()
    assert not os.path.exists(ns.nsroot)
    ns.close()  # nothing left: no error
    runner.code = 125
    with pytest.raises(IsolationUnavailable, match=r"namespaces ipc, mount, net: .*exit 125"):
        ns.prepare()
    mounts.refuse = True
    with pytest.raises(IsolationUnavailable, match="cannot pin in"):
        ns.prepare()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    ns.keep = [str(shared)]
    with pytest.raises(IsolationUnavailable, match="writable by root alone"):
        ns.prepare()
    ns.keep = [HOME_VIEW]
    with pytest.raises(IsolationUnavailable, match="where each sandbox's workspace is mounted"):
        ns.prepare()


def test_the_workspace_is_seen_at_home_user_only_where_it_is_mounted(tmp_path: Path) -> None:
    ns = namespaces(tmp_path, Runner())
    ns.home_covered = lambda: True
    assert ns.workspace_view("/r/x/workspace") == HOME_VIEW == "/home/user"
    ns.home_covered = lambda: False  # no /home on this host: nothing to mount it in
    assert ns.workspace_view("/r/x/workspace") == "/r/x/workspace"
    ns.home_covered = lambda: True
    ns.kinds = frozenset({"ipc", "net"})  # the mount layer off by name
    assert ns.workspace_view("/r/x/workspace") == "/r/x/workspace"
    assert Namespaces().workspace_view("/w") == "/w"


def test_home_is_coverable_when_a_real_directory(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "home")
    assert home_coverable(str(tmp_path / "home"))
    assert not home_coverable(str(tmp_path / "link"))
    assert not home_coverable(str(tmp_path / "absent"))


def test_close_keeps_going_when_the_directory_is_busy(tmp_path: Path) -> None:
    ns = namespaces(tmp_path, Runner())
    (tmp_path / ".ns" / "left").mkdir(parents=True)
    ns.close()
    assert (tmp_path / ".ns").is_dir()


def test_everything_is_a_no_op_when_off(tmp_path: Path) -> None:
    ns = Namespaces()
    ns.prepare()
    ns.create(RID, "/t", "/w", HostNetwork())
    ns.remove(RID)
    ns.close()
    assert ns.leftovers() == [] and ns.capabilities() == ["network.host"]
    assert ns.enter(RID, ["cmd"]) == ["cmd"]


def test_shell_creator_layout() -> None:
    programs = ShellPrograms(sh="/bin/sh", unshare="/u", nsenter="/n", mount="/m", ip="/ip")
    creator = ShellCreator(programs)
    places = ("/r/x/tmp", "/r/x/workspace")
    argv = creator.argv("/r/.ns", RID, frozenset({"ipc", "net"}), places, 5, ["/tmp/a"])
    assert argv[2].endswith('exec "$@"') and "ipc net" in argv[2]
    assert argv[4:9] == [
        f"/r/.ns/{RID}",
        "/u",
        f"--ipc=/r/.ns/{RID}/ipc",
        f"--net=/r/.ns/{RID}/net",
        "--propagation=slave",
    ]
    assert argv[-9:] == [
        "/r/.ns",
        "/r/x/tmp",
        "/r/x/workspace",
        "5",
        "1",
        "1",
        "0",
        f"/r/.ns/{RID}",  # where its passwd and group are, when it has them
        "/tmp/a",
    ]
    pins = ["/p/ipc", "/p/net", "/p/mnt"]
    assert creator.enter(pins, ["c"]) == [
        "/n",
        "--ipc=/p/ipc",
        "--net=/p/net",
        "--mount=/p/mnt",
        "--",
        "c",
    ]
    found = ShellPrograms.find(lambda name: f"/bin/{name}")
    assert found.nsenter == "/bin/nsenter"


def test_mountinfo_names_are_unescaped(tmp_path: Path) -> None:
    assert re_octal(r"/a\040b\134c\01") == "/a b\\c\\01"
    info = tmp_path / "mountinfo"
    info.write_text("36 35 98:0 / /mnt\\040x rw - ext4 /dev/x rw\nshort line\n")
    assert is_mount_point("/mnt x", str(info))
    assert not is_mount_point("/mnt", str(info))


class FakeLibc:
    def __init__(self, results: list[tuple[int, int]]) -> None:
        self.results = results

    def _next(self) -> int:
        code, error = self.results.pop(0)
        ctypes.set_errno(error)
        return code

    def mount(self, *args: object) -> int:
        return self._next()

    def umount2(self, *args: object) -> int:
        return self._next()


def test_mount_calls_raise_the_kernels_errno() -> None:
    calls = MountCalls(FakeLibc([(0, 0), (-1, errno.EPERM)]))  # type: ignore[arg-type]
    calls.bind("/a", "/b")
    with pytest.raises(PermissionError):
        calls.make_private("/b")
    calls = MountCalls(FakeLibc([(0, 0), (0, 0), (-1, errno.EINVAL)]))  # type: ignore[arg-type]
    calls.unmount_all("/b")
    calls = MountCalls(FakeLibc([(-1, errno.EBUSY)]))  # type: ignore[arg-type]
    with pytest.raises(OSError, match="busy"):
        calls.unmount("/b")


def test_isolation_none_offers_host_alone(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2=None, v1=False, euid=1000)
    iso = build_isolation(config(tmp_path, "none"), Clock(), POOL, machine.host())
    assert not iso.namespaces.kinds and iso.namespaces.network.allowed == ("host",)
    strict = Config.load(
        {"SANDBOXD_ISOLATION": "none", "SANDBOXD_ROOT": str(tmp_path), "SANDBOXD_NETWORK": "none"}
    )
    with pytest.raises(IsolationUnavailable, match=r"none is not available.*ISOLATION=none"):
        build_isolation(strict, Clock(), POOL, machine.host())
    with pytest.raises(ValueError, match=r"\(no network namespaces: SANDBOXD_ISOLATION=none \("):
        iso.namespaces.network.mode("none")


def test_a_create_asking_for_egress_is_told_how_it_is_offered(tmp_path: Path) -> None:
    """Egress is offered by default where the host can give it: the refusal a create gets
    where it cannot, or where the operator leaves it out, names the cause and the setting."""
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)

    def no_nft(config: Config) -> None:
        raise IsolationUnavailable("network mode egress: needs nft (Debian package nftables)")

    host = evolve(machine.host(), egress=no_nft)
    iso = build_isolation(config(tmp_path, "cgroup2"), Clock(), POOL, host)
    with pytest.raises(ValueError) as refused:
        iso.namespaces.network.mode("egress")
    assert str(refused.value) == (
        "network mode egress is not offered by this replica"
        " (network mode egress: needs nft (Debian package nftables))"
    )
    assert iso.namespaces.network.default == "none"  # the native default is unchanged
    left_out = build_isolation(
        config(tmp_path, "cgroup2", network_allow="none,host"), Clock(), POOL, machine.host()
    )
    with pytest.raises(ValueError, match=r"\(SANDBOXD_NETWORK_ALLOW=none,host leaves it out\)$"):
        left_out.namespaces.network.mode("egress")
    named = config(tmp_path, "cgroup2", network_allow="none,egress")
    with pytest.raises(IsolationUnavailable, match="needs nft"):
        build_isolation(named, Clock(), POOL, host)
    missing = evolve(machine.host(), egress=lambda config: None)
    iso = build_isolation(config(tmp_path, "cgroup2"), Clock(), POOL, missing)
    with pytest.raises(ValueError, match=r"\(its module is not installed\)$"):
        iso.namespaces.network.mode("egress")
    only_none = build_isolation(
        config(tmp_path, "cgroup2", network_allow="none"), Clock(), POOL, machine.host()
    )
    with pytest.raises(ValueError, match=r"^network mode host is not allowed here \(SANDBOXD_"):
        only_none.namespaces.network.mode("host")


@pytest.mark.parametrize(
    ("helper", "creator"), [("/opt/sd/sandboxd-exec", HelperCreator), (None, ShellCreator)]
)
def test_cgroup_bundles_make_namespaces_with_the_helper_or_the_shell(
    tmp_path: Path, helper: str | None, creator: type
) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    iso = build_isolation(config(tmp_path, "auto"), Clock(), POOL, machine.host(helper=helper))
    ns = iso.namespaces
    # all: pid too where the chain makes it (the helper's), left out on the shell chain
    assert ns.kinds == (frozenset(ALL) if helper else NO_PID) and isinstance(ns.creator, creator)
    assert ns.nsroot == os.path.join(os.path.realpath(tmp_path / "root"), ".ns")
    assert ns.network.default == "none"


def test_namespaces_off_by_name_or_without_net(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    base = {"SANDBOXD_ROOT": str(tmp_path / "root"), "SANDBOXD_SECCOMP": "off"}
    off = Config.load({**base, "SANDBOXD_NAMESPACES": "none"})
    iso = build_isolation(off, Clock(), POOL, machine.host())
    assert not iso.namespaces.kinds and iso.namespaces.network.default == "host"
    no_net = Config.load({**base, "SANDBOXD_NAMESPACES": "ipc,mount", "SANDBOXD_NETWORK": "none"})
    with pytest.raises(IsolationUnavailable, match="SANDBOXD_NAMESPACES leaves net out"):
        build_isolation(no_net, Clock(), POOL, machine.host())
    tmp_root = Config.load(
        {**base, "SANDBOXD_NAMESPACES": "mount", "SANDBOXD_ROOT": "/tmp/sandboxd-x/root"}
    )
    iso = build_isolation(tmp_root, Clock(), POOL, machine.host())
    assert iso.namespaces.keep == ["/tmp/sandboxd-x"]


def test_an_installed_egress_module_is_offered_and_wired(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    host = evolve(machine.host(), egress=lambda config: Egress())
    iso = build_isolation(config(tmp_path, "auto"), Clock(), POOL, host)
    assert iso.namespaces.network.allowed == ("none", "egress", "host")


def test_identity_files_beside_the_pins_only_with_a_mount_namespace(tmp_path: Path) -> None:
    (tmp_path / ".ns").mkdir()
    ns = namespaces(tmp_path, Runner())
    ns.create("a" * 16, "/t", "/w", NoNetwork(), (Identity(7001, 7002), "/h/home"))
    directory = tmp_path / ".ns" / ("a" * 16)
    passwd = (directory / "passwd").read_text().splitlines()
    assert passwd[0].startswith("root:x:0:0:") and passwd[1].startswith("nobody:x:65534:")
    assert passwd[2] == "user:x:7001:7002:user:/h/home:/bin/sh"
    assert (directory / "group").read_text().splitlines()[2] == "user:x:7002:"
    assert (directory / "passwd").stat().st_mode & 0o777 == 0o644
    ns.remove("a" * 16)
    assert not directory.exists()

    no_mount = namespaces(tmp_path, Runner())
    no_mount.kinds = frozenset({"ipc", "net"})
    no_mount.create("b" * 16, "/t", "/w", NoNetwork(), (Identity(7001, 7002), "/h/home"))
    assert sorted(os.listdir(tmp_path / ".ns" / ("b" * 16))) == ["ipc", "net"]
