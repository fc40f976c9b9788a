"""The PID namespace layer's logic without root: its setting, argv, pins and init's end.

The kernel side (the namespace made, entered through the relay, its ``/proc``, the attacks and
the recovery) is in ``tests/kernel/test_pid_namespace.py``.
"""

import os
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest
from attrs import define
from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent

from sandboxd.isolation.base import IsolationUnavailable
from sandboxd.isolation.namespaces.kinds import ALL, KINDS, AllLayers, parse_namespaces
from sandboxd.isolation.namespaces.pidns import INIT_FILE, kill_init
from sandboxd.isolation.network.modes import HostNetwork, NoNetwork
from sandboxd.isolation.select import build_isolation
from tests.isolation.test_isolation_namespaces import RID, Runner, namespaces
from tests.isolation.test_isolation_select import POOL, Machine, config


def test_pid_is_part_of_all_and_by_name_only_with_mount() -> None:
    assert "pid" in KINDS and "pid" in ALL
    every = parse_namespaces("all")
    assert every == frozenset(KINDS) and isinstance(every, AllLayers)
    by_name = parse_namespaces("ipc,mount,net,pid")
    assert by_name == frozenset(KINDS) and not isinstance(by_name, AllLayers)
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


def test_all_leaves_pid_out_on_the_shell_chain_and_says_why(tmp_path: Path) -> None:
    machine = Machine(tmp_path, v2="memory cpu pids", v1=False)
    every = config(tmp_path, "auto")  # SANDBOXD_NAMESPACES=all, the default
    with capturedLogs() as events:
        iso = build_isolation(every, Clock(), POOL, machine.host(helper=None))
    assert iso.namespaces.kinds == frozenset(KINDS) - {"pid"}
    said = [formatEvent(e) for e in events if "pid left out of all" in formatEvent(e)]
    assert said and "exec helper" in said[0]
    iso = build_isolation(every, Clock(), POOL, machine.host(helper="/opt/sd/sandboxd-exec"))
    assert iso.namespaces.kinds == frozenset(KINDS)
    assert "isolation.pid" in iso.namespaces.capabilities()


@define
class NoPidRunner(Runner):
    """A kernel that refuses a PID namespace (a pod whose user namespace forbids a new /proc)."""

    def __call__(self, argv: Sequence[str]) -> tuple[int, str]:
        if argv[1] == "namespaces" and "p" in argv[4]:
            self.argvs.append(list(argv))
            return 1, "sandboxd-exec: mount /proc: Operation not permitted"
        return super().__call__(argv)


def test_all_leaves_pid_out_where_the_kernel_refuses_it(tmp_path: Path) -> None:
    runner = NoPidRunner()
    ns = namespaces(tmp_path, runner)
    ns.kinds = parse_namespaces("all")
    with capturedLogs() as events:
        ns.prepare()
    assert ns.kinds == frozenset(KINDS) - {"pid"} and isinstance(ns.kinds, AllLayers)
    probed = [argv[4] for argv in runner.argvs]  # then the root switch's probe, without pid
    assert probed[:2] == ["imnp", "imn"] and all("p" not in kinds for kinds in probed[1:])
    assert any("pid left out of all" in formatEvent(e) for e in events)
    assert "isolation.pid" not in ns.capabilities()
    ns.close()


def test_pid_asked_by_name_that_the_kernel_refuses_stops_start_up(tmp_path: Path) -> None:
    ns = namespaces(tmp_path, NoPidRunner())
    ns.kinds = parse_namespaces("ipc,mount,net,pid")
    with pytest.raises(IsolationUnavailable, match=r"namespaces ipc, mount, net, pid: .*exit 1"):
        ns.prepare()
    ns.close()
    all_refused = namespaces(tmp_path, Runner(code=125))  # not pid's fault: nothing works
    all_refused.kinds = parse_namespaces("all")
    with pytest.raises(IsolationUnavailable, match=r"namespaces ipc, mount, net: .*exit 125"):
        all_refused.prepare()
    all_refused.close()


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
