"""The PID namespace layer's logic without root: its setting, argv, pins and init's end.

The kernel side (the namespace made, entered through the relay, its ``/proc``, the attacks and
the recovery) is in ``tests/kernel/test_pid_namespace.py``.
"""

import os
import signal
from pathlib import Path

import pytest
from twisted.internet.task import Clock

from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.namespaces.pidns import INIT_FILE, kill_init
from sandboxd.isolation.namespaces.pins import ALL, KINDS, parse_namespaces
from sandboxd.isolation.network.modes import HostNetwork, NoNetwork
from sandboxd.isolation.select import build_isolation
from tests.isolation.test_isolation_namespaces import RID, Runner, namespaces
from tests.isolation.test_isolation_select import POOL, Machine, config


def test_pid_is_asked_for_by_name_and_only_with_mount() -> None:
    assert "pid" in KINDS and "pid" not in ALL
    assert "pid" not in parse_namespaces("all")
    assert parse_namespaces("ipc,mount,net,pid") == frozenset(KINDS)
    for bad in ("pid", "ipc,net,pid"):
        with pytest.raises(ValueError, match="pid needs mount"):
            parse_namespaces(bad)


def test_create_pins_pid_and_enters_it_before_mount(tmp_path: Path) -> None:
    runner = Runner()
    ns = namespaces(tmp_path, runner)
    ns.kinds = frozenset(KINDS)
    os.makedirs(ns.nsroot)
    ns.create(RID, "/t", "/w", NoNetwork())
    pins = tmp_path / ".ns" / RID
    assert runner.argvs[0][4] == "imnp"
    entered = ns.enter(RID, ["/h/sandboxd-exec", "sandbox"])
    assert entered[2:7] == ["4", *(str(pins / name) for name in ("ipc", "net", "pid", "mnt"))]
    assert "isolation.pid" in ns.capabilities()
    ns.remove(RID)  # no init file (the stand-in made none): nothing to kill
    assert not pins.exists()
    ns.create(RID, "/t", "/w", HostNetwork())
    assert runner.argvs[1][4] == "imp"
    ns.remove(RID)


def test_pid_needs_the_helper(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    wanted = config(tmp_path, "auto", namespaces="ipc,mount,net,pid")
    with pytest.raises(IsolationUnavailable, match="pid needs the exec helper"):
        build_isolation(wanted, Clock(), POOL, machine.host(helper=None))
    iso = build_isolation(wanted, Clock(), POOL, machine.host(helper="/opt/sd/sandboxd-exec"))
    assert iso.namespaces.kinds == frozenset(KINDS)


def init_layout(tmp_path: Path, pid: str, same_namespace: bool) -> tuple[str, str, str]:
    """A pins directory with ``init`` holding ``pid`` and a ``proc`` whose ``PID/ns/pid`` is
    (a hard link of) the pin, or another file."""
    directory, proc = tmp_path / "pins", tmp_path / "proc"
    directory.mkdir()
    pin = directory / "pid"
    pin.touch()
    (directory / INIT_FILE).write_text(pid + "\n")
    held = proc / pid.strip() / "ns"
    held.mkdir(parents=True)
    if same_namespace:
        os.link(pin, held / "pid")
    else:
        (held / "pid").touch()
    return str(directory), str(pin), str(proc)


@pytest.mark.parametrize(
    ("pid", "same", "killed"), [("4242", True, True), ("4242", False, False), ("x", True, False)]
)
def test_init_is_killed_only_while_it_holds_the_pinned_namespace(
    tmp_path: Path, pid: str, same: bool, killed: bool
) -> None:
    directory, pin, proc = init_layout(tmp_path, pid, same)
    sent: list[tuple[int, int]] = []
    done = kill_init(directory, pin, proc, lambda p, s: sent.append((p, s)))
    assert done is killed and sent == ([(4242, signal.SIGKILL)] if killed else [])


def test_init_gone_meanwhile_or_never_recorded(tmp_path: Path) -> None:
    directory, pin, proc = init_layout(tmp_path, "4242", True)

    def gone(pid: int, signum: int) -> None:
        raise ProcessLookupError(pid)

    assert not kill_init(directory, pin, proc, gone)
    os.unlink(os.path.join(directory, INIT_FILE))
    assert not kill_init(directory, pin, proc, gone)
