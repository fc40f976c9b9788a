"""The pool of network namespaces wired ahead (``SANDBOXD_NETNS_POOL``) without root: its refill,
hand-out, stop and reclaim with recording stand-ins for the mount calls and the mode, the egress
mode's slots wired ahead (the host fakes of ``test_isolation_egress``), and the namespace layer
taking a pooled namespace. The real kernel: ``tests/kernel/test_netns_pool*.py``.
"""

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from attrs import define, field

from sandboxd.isolation.namespaces.creators import HelperCreator
from sandboxd.isolation.namespaces.mounts import MountCalls
from sandboxd.isolation.namespaces.netns_pool import (
    NetnsPool,
    PooledNetns,
    build_pool,
    make_netns,
)
from sandboxd.isolation.namespaces.pins import Namespaces
from sandboxd.isolation.network import netns_calls
from sandboxd.isolation.network.egress import EgressNetwork
from sandboxd.isolation.network.modes import (
    HostNetwork,
    NetworkPolicy,
    NetworkUnavailable,
    NoNetwork,
)
from tests.isolation.test_isolation_egress import Host
from tests.isolation.test_isolation_namespaces import NO_PID, RID, FakeLibc, Runner


@define
class Mounts:
    """Mount calls on plain files: a bind or a move "pins" by writing the source's name."""

    refuse_move: bool = False
    calls: list[tuple[str, str]] = field(factory=list)

    def bind(self, source: str, target: str) -> None:
        self.calls.append(("bind", target))

    def move(self, source: str, target: str) -> None:
        if self.refuse_move:
            raise OSError(errno.EINVAL, "Invalid argument", target)
        self.calls.append(("move", target))

    def make_private(self, target: str) -> None:
        self.calls.append(("private", target))

    def unmount_all(self, target: str) -> None:
        self.calls.append(("unmount", target))


@define
class Mode:
    """An egress-like mode recording what the pool asks (``fail``: wire_ahead refuses)."""

    name: str = "egress"
    own_namespace: bool = True
    fail: list[BaseException] = field(factory=list)
    wired: list[str] = field(factory=list)
    adopted: dict[str, int] = field(factory=dict)
    released: list[int] = field(factory=list)
    detached: list[str] = field(factory=list)

    def prepare(self) -> None:
        pass

    def close(self) -> None:
        pass

    def attach(self, rid: str, netns: str) -> None:
        self.adopted[rid] = -1

    def detach(self, rid: str, netns: str) -> None:
        self.detached.append(rid)

    def wire_ahead(self, netns: str) -> int:
        if self.fail:
            raise self.fail.pop(0)
        self.wired.append(netns)
        return len(self.wired) - 1

    def adopt(self, rid: str, slot: int) -> None:
        self.adopted[rid] = slot

    def release_ahead(self, slot: int) -> None:
        self.released.append(slot)


def touch(pin: str, mounts: MountCalls) -> None:
    """A stand-in for :func:`make_netns` (the pin file is there already)."""


def pool(tmp_path: Path, mode: Mode, size: int = 2, mounts: Mounts | None = None) -> NetnsPool:
    return NetnsPool(
        str(tmp_path / ".pool"),
        size,
        mode,
        mounts=mounts or Mounts(),  # type: ignore[arg-type]
        make=touch,
        retry=0.001,
        retry_max=0.002,
    )


def wait_ready(p: NetnsPool, count: int) -> None:
    done = threading.Event()
    for _ in range(2000):
        if p.ready() == count:
            return
        done.wait(0.005)
    raise AssertionError(f"pool holds {p.ready()}, not {count}")


def test_the_pool_refills_hands_out_once_and_removes_the_rest_at_close(tmp_path: Path) -> None:
    no_egress = NetworkUnavailable("no egress")
    mode = Mode(fail=[OSError(errno.ENOSPC, "full"), no_egress, no_egress])
    p = pool(tmp_path, mode)
    assert p.take() is None  # not started: empty, the create makes its own
    p.start()
    wait_ready(p, 2)  # after two refusals, retried
    assert sorted(os.listdir(tmp_path / ".pool")) == ["3", "4"]
    assert p.serves(mode) and not p.serves(NoNetwork())
    first = p.take()
    assert first == PooledNetns(str(tmp_path / ".pool" / "3"), 0)
    target = tmp_path / "sandbox-net"
    target.touch()
    p.hand_over(first, RID, str(target))
    assert mode.adopted == {RID: 0} and not os.path.exists(first.pin)
    wait_ready(p, 2)  # refilled
    assert p.made == 6 and p.taken == 1
    p.close()
    assert sorted(mode.released) == [1, 2]  # the two never handed out
    assert not (tmp_path / ".pool").exists()
    p.close()  # again: nothing


def test_a_refused_move_removes_the_pooled_namespace(tmp_path: Path) -> None:
    mode = Mode()
    mounts = Mounts(refuse_move=True)
    p = pool(tmp_path, mode, size=1, mounts=mounts)
    p.start()
    wait_ready(p, 1)
    taken = p.take()
    assert taken is not None
    with pytest.raises(OSError, match="Invalid"):
        p.hand_over(taken, RID, str(tmp_path / "x"))
    assert mode.released == [0] and not os.path.exists(taken.pin)
    assert ("unmount", taken.pin) in mounts.calls
    p.close()


def test_a_failed_wire_unpins_what_was_made(tmp_path: Path) -> None:
    mode = Mode(fail=[RuntimeError("boom")])
    p = pool(tmp_path, mode, size=1)
    os.mkdir(p.directory)
    with pytest.raises(RuntimeError):
        p._fill_one()
    assert os.listdir(p.directory) == []


def test_reclaim_unpins_a_predecessors_pool(tmp_path: Path) -> None:
    mounts = Mounts()
    p = pool(tmp_path, Mode(), mounts=mounts)
    assert p.reclaim() == 0  # no directory
    os.mkdir(p.directory)
    assert p.reclaim() == 0
    os.mkdir(p.directory)
    for name in ("0", "1"):
        (tmp_path / ".pool" / name).touch()
    assert p.reclaim() == 2
    assert not (tmp_path / ".pool").exists()
    assert sorted(target for _, target in mounts.calls) == [
        str(tmp_path / ".pool" / "0"),
        str(tmp_path / ".pool" / "1"),
    ]


def test_make_netns_hands_the_kernels_refusal_over(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class Unshare(FakeLibc):
        def unshare(self, flags: int) -> int:
            assert flags == netns_calls.CLONE_NEWNET
            return self._next()

    mounts = Mounts()
    monkeypatch.setattr(netns_calls, "_libc", Unshare([(-1, errno.EPERM), (0, 0)]))
    with pytest.raises(OSError, match="unshare"):
        make_netns(str(tmp_path / "pin"), mounts)  # type: ignore[arg-type]
    make_netns(str(tmp_path / "pin"), mounts)  # type: ignore[arg-type]
    assert mounts.calls == [("bind", str(tmp_path / "pin"))]


def test_the_pool_is_built_only_for_egress_with_net(tmp_path: Path) -> None:
    offered: dict[str, Any] = {"none": NoNetwork(), "egress": Mode()}
    assert build_pool(0, NO_PID, offered, str(tmp_path)) is None
    assert build_pool(2, NO_PID - {"net"}, offered, str(tmp_path)) is None
    assert build_pool(2, NO_PID, {"none": NoNetwork()}, str(tmp_path)) is None
    built = build_pool(2, NO_PID, offered, str(tmp_path))
    assert built is not None and built.size == 2
    assert built.directory == str(tmp_path / ".pool") and built.mode is offered["egress"]


def test_the_egress_mode_wires_slots_ahead_and_stays_up_for_them(tmp_path: Path) -> None:
    host = Host()
    mode = EgressNetwork(host.egress(tmp_path), capacity=3, lazy=True)
    ahead = mode.wire_ahead("/pool/0")  # starts the lazy layer
    assert ahead == 0 and mode._started
    mode.attach("a", "/ns/a")
    mode.detach("a", "/ns/a")  # the last sandbox, but a slot is wired ahead: the layer stays
    assert mode._started
    mode.adopt("b", ahead)
    assert mode.sandbox_at("10.200.0.1") is not None
    assert mode._slots == {"b": 0}
    second = mode.wire_ahead("/pool/1")
    mode.release_ahead(second)  # removed unused
    assert mode._started and mode._free[-1] == second
    mode.detach("b", "/ns/b")
    assert not mode._started  # nothing left: the host is given back


def namespaces_with_pool(tmp_path: Path, runner: Runner, mounts: Mounts) -> Namespaces:
    mode = Mode()
    policy = NetworkPolicy.choose(
        {"none": NoNetwork(), "host": HostNetwork(), "egress": mode}, None, None, {}
    )
    p = pool(tmp_path / ".ns", mode, size=1, mounts=mounts)
    return Namespaces(
        kinds=NO_PID,
        nsroot=str(tmp_path / ".ns"),
        network=policy,
        creator=HelperCreator("/h/sandboxd-exec"),
        run=runner,
        mounts=mounts,  # type: ignore[arg-type]
        pool=p,
    )


def test_an_egress_create_takes_a_pooled_namespace_and_others_do_not(tmp_path: Path) -> None:
    runner, mounts = Runner(), Mounts()
    ns = namespaces_with_pool(tmp_path, runner, mounts)
    assert ns.pool is not None
    os.makedirs(ns.pool.directory)
    (Path(ns.pool.directory) / "7").touch()  # a predecessor's
    ns.prepare()
    assert ("unmount", str(tmp_path / ".ns" / ".pool" / "7")) in mounts.calls
    wait_ready(ns.pool, 1)
    egress = ns.network.offered["egress"]
    assert isinstance(egress, Mode)
    ns.create(RID, "/t", "/w", egress)
    assert runner.argvs[-1][4] == "im"  # the helper leaves net out: it is the pool's
    assert egress.adopted == {RID: 0}
    net = str(tmp_path / ".ns" / RID / "net")
    assert ("move", net) in mounts.calls and ns.net_pin(RID) == net
    assert ns.enter(RID, ["cmd"])[3:6] == [
        str(tmp_path / ".ns" / RID / "ipc"),
        net,
        str(tmp_path / ".ns" / RID / "mnt"),
    ]
    ns.remove(RID)
    assert egress.detached == [RID]
    ns.create("f" * 16, "/t", "/w", ns.network.offered["none"])
    assert runner.argvs[-1][4] == "imn"  # none: its own, never the pool's
    ns.remove("f" * 16)
    wait_ready(ns.pool, 1)
    os.mkdir(tmp_path / ".ns" / ("d" * 16))  # a create that fails before its namespaces
    with pytest.raises(FileExistsError):
        ns.create("d" * 16, "/t", "/w", egress)
    assert ns.pool.ready() == 1 and ns.pool.taken == 1  # the pool's namespace stays ready
    os.rmdir(tmp_path / ".ns" / ("d" * 16))
    runner.code = 1  # the helper refuses: the pooled namespace goes with the sandbox's pins
    with pytest.raises(OSError):
        ns.create("e" * 16, "/t", "/w", egress)
    ns.remove("e" * 16)
    assert egress.detached == [RID, "e" * 16]
    ns.close()
    assert not os.path.exists(ns.pool.directory)


def test_a_move_is_one_mount_call_raising_the_kernels_errno() -> None:
    calls = MountCalls(FakeLibc([(0, 0), (-1, errno.EINVAL)]))  # type: ignore[arg-type]
    calls.move("/a", "/b")
    with pytest.raises(OSError, match="Invalid"):
        calls.move("/a", "/b")
