"""The PID namespace (docs/isolation.rst, "Namespaces"), tried for real: one sandbox looks for
another's processes, and through them at its private network, in ``/proc``.

As root with real isolation (cgroup v1 here, v2 in the VM; nothing here depends on the cgroup
version). Each attack runs against a daemon with ``--namespaces=all``, the default, which
includes ``pid`` with the exec helper (it must be refused), and against one with the ``pid``
layer left out by name (it must then succeed: proof that the test can fail). The victim serves
on its own loopback (network mode ``none``: a network namespace of its own), which the attacker
cannot connect to either way; without the PID namespace the attacker still reads the listener
in ``/proc/<victim's pid>/net/tcp``.
"""

import errno
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel.kernel_http import (
    SLOW,
    Box,
    KernelDaemon,
    alive,
    isolation_problem,
    processes_of,
    wait_for,
)
from tests.kernel.kernel_ns import on_and_off
from tests.kernel.test_namespaces import NET
from tests.support.daemon import start_daemon, stop_daemon

pytestmark = [pytest.mark.kernel]

WITH_PID = "--namespaces=all"
"""The default: every layer, ``pid`` included where the exec helper makes it."""
WITHOUT_PID = "--namespaces=ipc,mount,net"

LISTENERS = r"""
import os, sys
port = "%04X" % int(sys.argv[1])
found = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        table = open(f"/proc/{pid}/net/tcp").read().splitlines()[1:]
    except OSError:
        continue
    for row in table:
        local, state = row.split()[1], row.split()[3]
        if local == "0100007F:" + port and state == "0A":
            found.add(pid)
print(len(found), sorted(found)[:1])
"""

DAEMON_NET = r"""
import sys
pid, port = sys.argv[1], "%04X" % int(sys.argv[2])
try:
    rows = open(f"/proc/{pid}/net/tcp").read().splitlines()[1:]
except OSError:
    print("unreadable")
else:
    mine = [r for r in rows if r.split()[1] == "0100007F:" + port and r.split()[3] == "0A"]
    print("listening" if mine else "not listening")
"""


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, KernelDaemon]]:
    with on_and_off(tmp_path_factory, "pid", (WITH_PID,), (WITHOUT_PID,)) as pair:
        yield pair


def serve(box: Box) -> int:
    """Start a loopback tcp server in ``box`` (in the background): its port."""
    background = 'python3 -c "$0" "$@" </dev/null >/dev/null 2>serve.err &'
    started = box.exec(["sh", "-c", background, NET, "tcp", "serve", "0"])
    assert started.exit == 0, started
    assert wait_for(lambda: box.run("cat serving").exit == 0, 30 * SLOW), box.run("cat serve.err")
    return int(box.ok("cat serving"))


def visible_pids(box: Box) -> set[int]:
    return {int(name) for name in box.ok("ls /proc").split() if name.isdigit()}


def test_healthz_names_the_pid_layer(daemons: dict[str, KernelDaemon]) -> None:
    on = daemons["on"].call("GET", "/healthz").json()["capabilities"]
    off = daemons["off"].call("GET", "/healthz").json()["capabilities"]
    assert "isolation.pid" in on and "isolation.pid" not in off, (on, off)


@pytest.mark.parametrize("layer", ["on", "off"])
def test_another_sandboxs_listener_is_read_in_proc_net(
    daemons: dict[str, KernelDaemon], layer: str
) -> None:
    attacker, victim = daemons[layer].create(), daemons[layer].create()
    try:
        port = serve(victim)
        own = attacker.exec(["python3", "-c", LISTENERS, str(port)])
        seen = own.text.split()
        assert own.exit == 0, own
        if layer == "on":
            assert seen[0] == "0", own
        else:
            # The victim's server, found by host pid in the shared view: its private loopback.
            assert int(seen[0]) >= 1, own
            victims = processes_of([victim.uid()])
            assert int(seen[1].strip("[']")) in victims, (own, victims)
    finally:
        attacker.kill()
        victim.kill()


@pytest.mark.parametrize("layer", ["on", "off"])
def test_the_daemons_listener_is_read_in_proc_net(
    daemons: dict[str, KernelDaemon], layer: str
) -> None:
    """The daemon's own sockets (its API port on the host's loopback), read through its pid
    by a sandbox with a network namespace of its own."""
    kd = daemons[layer]
    attacker = kd.create()
    try:
        port, daemon = kd.daemon.port, kd.daemon.process.pid
        read = attacker.exec(["python3", "-c", DAEMON_NET, str(daemon), str(port)])
        assert read.exit == 0, read
        assert read.text == ("listening" if layer == "off" else "unreadable"), read
    finally:
        attacker.kill()


@pytest.mark.parametrize("layer", ["on", "off"])
def test_ps_sees_only_the_sandboxs_own_processes(
    daemons: dict[str, KernelDaemon], layer: str
) -> None:
    watcher, other = daemons[layer].create(), daemons[layer].create()
    try:
        serve(other)
        others = set(processes_of([other.uid()]))
        assert others, "the other sandbox's server runs"
        seen = visible_pids(watcher)
        listed = watcher.ok("ps -e -o pid=").split()
        if layer == "on":
            # Its init (1), the shell, and the command listing: nothing else.
            assert len(seen) <= 3 and 1 in seen, seen
            assert len(listed) <= 3 and "1" in listed, listed
            assert not others & seen
        else:
            assert others <= seen, (others, seen)
    finally:
        watcher.kill()
        other.kill()


def test_the_first_commands_pid_is_small(daemons: dict[str, KernelDaemon]) -> None:
    box = daemons["on"].create()
    try:
        assert box.ok("echo $$") == "2"  # 1 is the namespace's init
        assert box.ok("cat /proc/1/status | grep '^Uid'").split()[1] == "0"
    finally:
        box.kill()


def init_of(kd: KernelDaemon, box: Box) -> int:
    return int((kd.root / ".ns" / box.rid / "init").read_text())


def test_kill_ends_every_process_and_the_namespace(daemons: dict[str, KernelDaemon]) -> None:
    kd = daemons["on"]
    box = kd.create()
    uid = box.uid()
    init = init_of(kd, box)
    pin = kd.root / ".ns" / box.rid / "pid"
    assert os.stat(f"/proc/{init}/ns/pid").st_ino == os.stat(pin).st_ino
    # One in its own session, one double-forked: neither in the command's process group.
    box.ok("setsid sleep 1000 </dev/null >/dev/null 2>&1 & (sleep 1001 &) ; true")
    assert wait_for(lambda: len(processes_of([uid])) >= 2, 10 * SLOW), processes_of([uid])
    sleepers = processes_of([uid])
    assert box.kill().status == 204
    assert wait_for(lambda: not any(alive(pid) for pid in [init, *sleepers]), 10 * SLOW)
    assert not pin.exists()


def test_a_signal_and_a_timeout_reach_the_command(daemons: dict[str, KernelDaemon]) -> None:
    box = daemons["on"].create()
    try:
        timed = box.exec(["sh", "-c", "sleep 60; echo never"], timeout=1)
        assert "never" not in timed.text, timed
        killed = box.run("kill -TERM $$; echo after")
        assert killed.exit in (-signal.SIGTERM, 128 + signal.SIGTERM), killed
        assert box.run("exit 7").exit == 7
    finally:
        box.kill()


def test_a_crashed_daemons_sandbox_is_ended_at_restart(tmp_path: Path) -> None:
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    first = KernelDaemon.start(tmp_path, "--memory-max=128M", WITH_PID, uids=1)
    args = [f"--uid-min={first.uid_min}", f"--uid-max={first.uid_min}"]
    try:
        box = first.create()
        uid = box.uid()
        box.ok("setsid sleep 1000 </dev/null >/dev/null 2>&1 &")
        init = init_of(first, box)
        assert wait_for(lambda: processes_of([uid]), 10 * SLOW)
        first.daemon.process.kill()  # SIGKILL: no drain, no cleanup
        first.daemon.process.wait(30)
        assert alive(init) and processes_of([uid]), "the sandbox outlived its daemon"
    except BaseException:
        stop_daemon(first.daemon)
        raise
    second = start_daemon(tmp_path, "--isolation=auto", *args, "--memory-max=128M", WITH_PID)
    try:
        assert wait_for(lambda: not alive(init) and not processes_of([uid]), 30 * SLOW)
        assert wait_for(lambda: second.call("GET", "/readyz")[0] == 200, 30 * SLOW)
        assert "recovery done: 1 leftover" in second.log.read_text()
        assert not (second.root / ".ns" / box.rid).exists()
    finally:
        stop_daemon(second)


@pytest.mark.parametrize("spawner", ["helper", "server"])
def test_a_background_process_is_signalled_through_its_relay(tmp_path: Path, spawner: str) -> None:
    """The pid a start answers is the relay's: a signal to it reaches the command's whole
    group inside the namespace, and the exit is the command's (either spawner)."""
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    env = {"SANDBOXD_SPAWNER": spawner}
    kd = KernelDaemon.start(tmp_path, "--memory-max=128M", WITH_PID, uids=1, env=env)
    try:
        box = kd.create()
        uid = box.uid()
        script = "sleep 300 & sleep 301 & echo $$ > inside; wait"
        started = kd.call("POST", box.url("processes"), {"cmd": ["sh", "-c", script]}).json()
        assert wait_for(lambda: len(processes_of([uid])) >= 3, 10 * SLOW), processes_of([uid])
        relay = int(started["pid"])
        # The relay is the sandbox's to pay for: in its cgroup, ended with it.
        assert box.rid in Path(f"/proc/{relay}/cgroup").read_text()
        assert int(box.ok("cat inside")) < 10  # the namespace's number, not the host's
        base = box.url(f"processes/{started['id']}")
        assert kd.call("POST", base + "/signal", {"signal": "KILL"}).status == 204
        answer = kd.call("GET", box.url(f"processes/{started['id']}/output", follow="true"))
        assert answer.body.splitlines()[-1] == b'{"exit":%d}' % (128 + signal.SIGKILL)
        assert wait_for(lambda: not processes_of([uid]), 10 * SLOW), processes_of([uid])
        assert not alive(relay)
    finally:
        kd.stop()


def namespace_inits(helper: Path) -> list[int]:
    """Live processes of ``helper`` (a copy only this test runs) in a PID namespace not ours."""
    ours = os.stat("/proc/self/ns/pid").st_ino
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            mine = os.readlink(f"/proc/{name}/exe") == str(helper) and alive(int(name))
            if mine and os.stat(f"/proc/{name}/ns/pid").st_ino != ours:
                found.append(int(name))
        except OSError:
            continue
    return found


def test_a_refused_create_leaves_no_init_behind(tmp_path: Path) -> None:
    """When the pins cannot be made (here: ``init`` is there already), the helper kills the
    init it started: no namespace outlives a create that failed."""
    if os.geteuid() != 0:
        pytest.skip("namespaces need root")
    helper = tmp_path / "sandboxd-exec"
    helper.write_bytes(Path("sandboxd/isolation/exec/sandboxd-exec").read_bytes())
    helper.chmod(0o755)
    nsroot, rid = tmp_path / "ns", "0123456789abcdef"
    (nsroot / rid).mkdir(parents=True)
    for place in ("tmp", "ws"):
        (tmp_path / place).mkdir()
    subprocess.run(["mount", "--bind", str(nsroot), str(nsroot)], check=True)
    try:
        subprocess.run(["mount", "--make-private", str(nsroot)], check=True)
        argv = [str(helper), "namespaces", str(nsroot), rid, "imp"]
        argv += [str(tmp_path / "tmp"), str(tmp_path / "ws"), "1000000"]
        made = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        assert made.returncode == 0, made.stderr
        assert namespace_inits(helper) == [int((nsroot / rid / "init").read_text())]
        other = "fedcba9876543210"
        (nsroot / other).mkdir()
        (nsroot / other / "init").touch()
        argv[3] = other
        refused = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        assert refused.returncode == 125 and "init file" in refused.stderr, refused
        assert wait_for(lambda: len(namespace_inits(helper)) == 1, 10 * SLOW)
    finally:
        for pin in ("ipc", "mnt", "pid"):
            subprocess.run(["umount", str(nsroot / rid / pin)], check=False)
        for init in namespace_inits(helper):
            os.kill(init, signal.SIGKILL)
        subprocess.run(["umount", "-l", str(nsroot)], check=False)


def test_a_signal_sent_at_once_is_not_lost_in_the_relay(tmp_path: Path) -> None:
    """A signal sent as soon as a start answers may reach the relay before the command exists
    (the relay blocks every signal): it must still end the command."""
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    kd = KernelDaemon.start(tmp_path, "--memory-max=128M", WITH_PID, uids=1)
    try:
        box = kd.create()
        for _ in range(20):
            started = kd.call("POST", box.url("processes"), {"cmd": ["sleep", "60"]}).json()
            base = box.url(f"processes/{started['id']}")
            assert kd.call("POST", base + "/signal", {"signal": "TERM"}).status == 204
            answer = kd.call("GET", base + "/output?follow=true", timeout=15 * SLOW)
            assert answer.body.splitlines()[-1] == b'{"exit":%d}' % (128 + signal.SIGTERM)
    finally:
        kd.stop()


def test_the_pids_limit_holds_inside_the_namespace(tmp_path: Path) -> None:
    """The sandbox's pids.max still bounds what its commands fork (its init is outside its
    cgroup; the relay counts as one)."""
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    kd = KernelDaemon.start(tmp_path, "--memory-max=128M", "--pids-max=24", WITH_PID, uids=1)
    try:
        box = kd.create()
        forks = box.exec(["python3", "-c", FORKS], timeout=60)
        made, error = (int(n) for n in forks.text.split())
        assert made < 24 and error == errno.EAGAIN, forks
        assert box.ok("echo still") == "still"
    finally:
        kd.stop()


FORKS = r"""
import os, time
made, error = 0, 0
while made < 200:
    try:
        child = os.fork()
    except OSError as e:
        error = e.errno
        break
    if child == 0:
        time.sleep(30)
        os._exit(0)
    made += 1
print(made, error)
"""


def test_a_sandbox_at_its_pids_max_still_starts_a_command(tmp_path: Path) -> None:
    """The relay forks before it joins the sandbox's cgroup: a command still starts at
    pids.max (its own forks are then refused), as it does without the pid layer."""
    problem = isolation_problem()
    if problem is not None:
        pytest.skip(problem)
    kd = KernelDaemon.start(tmp_path, "--memory-max=128M", "--pids-max=16", WITH_PID, uids=1)
    try:
        box = kd.create()
        fill = "for (1 .. 40) { my $p = fork; if (defined $p && !$p) { sleep 300; exit } }"
        fill += " sleep 300"
        assert kd.call("POST", box.url("processes"), {"cmd": ["perl", "-e", fill]}).status == 200
        assert wait_for(lambda: box.stats()["pids"] >= 16, 30 * SLOW), box.stats()
        held = box.run("echo inside; sleep 0 & wait")  # echo is the shell's own: no fork
        assert held.out == b"inside\n" and held.exit != 0, held
    finally:
        kd.stop()
