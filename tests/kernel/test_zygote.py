"""Per-sandbox zygotes under real isolation, as root (``SANDBOXD_SPAWNER=zygote``, issue 34).

One daemon with zygotes on (a short quiet spell, so that the retirement is seen): a sandbox's
first exec goes through the spawn server and starts its zygote beside it, the execs after it
are forked by the zygote. So within one sandbox an exec through the zygote and a background
process through the helper must run as the same uid, in the same cgroups and namespaces (its
PID namespace too), under the same filter, with the helper's exit codes and messages; the
zygote must be out of the sandbox's reach (not dumpable: its uid cannot ptrace it or read its
descriptors; outside the sandbox's PID namespace: not in its sight), out of another sandbox's
reach altogether; a killed zygote costs no exec; the kill of its sandbox ends it; a quiet one
is retired.
"""

import base64
import json
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.kernel.exec_semantics import check_the_helpers_exit_codes
from tests.kernel.kernel_http import (
    SLOW,
    Box,
    KernelDaemon,
    alive,
    host_pid,
    isolation_problem,
    wait_for,
)
from tests.templates.rootfs import OS_RELEASE, rootfs

WHY_NOT = isolation_problem()
pytestmark = [pytest.mark.kernel, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

QUIET = 3.0
"""The module daemon's SANDBOXD_ZYGOTE_QUIET, in seconds."""

IDENTITY = """\
id -u; id -g; id -G; cat /proc/self/cgroup; umask; cat /proc/self/oom_score_adj
readlink /proc/self/ns/ipc /proc/self/ns/mnt /proc/self/ns/net /proc/self/ns/pid
grep -E '^(Seccomp|NoNewPrivs|CapEff|CapPrm|SigBlk|SigIgn):' /proc/self/status
ls /proc/self/fd
"""

LEADS_ITS_SESSION = "read -r pid comm state ppid pgrp session rest < /proc/self/stat; "
"""Sets ``$pid`` and ``$session`` of the shell (inside its PID namespace): through a zygote the
command leads its own session there; through the helper's relay it is in the relay's, outside."""


@pytest.fixture(scope="module")
def zygoted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelDaemon]:
    kd = KernelDaemon.start(
        tmp_path_factory.mktemp("zygoted"),
        "--memory-max=256M",
        "--pids-max=64",
        "--template-max=64M",
        env={"SANDBOXD_SPAWNER": "zygote", "SANDBOXD_ZYGOTE_QUIET": f"{QUIET:g}s"},
    )
    try:
        yield kd
    finally:
        kd.stop()


@pytest.fixture
def box(zygoted: KernelDaemon) -> Iterator[Box]:
    sandbox = zygoted.create()
    yield sandbox
    sandbox.kill()


def children(kd: KernelDaemon) -> dict[int, str]:
    """The daemon's children, by pid: their comm."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        comm, _, rest = stat.partition(" (")[2].rpartition(")")
        if int(rest.split()[1]) == kd.daemon.process.pid and rest.split()[0] != "Z":
            found[int(entry.name)] = comm
    return found


def zygotes(kd: KernelDaemon, uid: int) -> list[int]:
    """The daemon's live zygotes running as ``uid``."""
    return [
        pid
        for pid, comm in children(kd).items()
        if comm == "sandboxd-zygote" and Path(f"/proc/{pid}/status").exists() and uid_of(pid) == uid
    ]


def uid_of(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def zygote_of(kd: KernelDaemon, box: Box) -> int:
    """``box``'s zygote, started by an exec (it starts beside the exec, so wait for it)."""
    uid = box.uid()
    assert wait_for(lambda: len(zygotes(kd, uid)) == 1, 10 * SLOW), children(kd)
    (pid,) = zygotes(kd, uid)
    return pid


def through_zygote(box: Box) -> bool:
    """Whether an exec of ``box`` now is forked by its zygote (see LEADS_ITS_SESSION)."""
    out = box.ok(LEADS_ITS_SESSION + 'echo "$pid $session"').split()
    return out[0] == out[1]


ATTACK = """
import ctypes, errno, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
target = int(sys.argv[1])
attached = libc.ptrace(16, target, 0, 0)  # PTRACE_ATTACH
print("attach", "ok" if attached == 0 else errno.errorcode[ctypes.get_errno()])
if attached == 0:
    os.waitpid(target, 0)
    libc.ptrace(17, target, 0, 0)  # PTRACE_DETACH
try:
    os.listdir(f"/proc/{target}/fd")
    print("fds ok")
except PermissionError:
    print("fds EPERM")
try:
    os.kill(target, 0)
    print("signal ok")
except PermissionError:
    print("signal EPERM")
"""


def attack(target: int, uid: int) -> list[str]:
    """What a process of ``uid`` in the host's PID namespace (no filter: more than a sandbox
    can) can do to ``target``: attach with ptrace, list its descriptors, signal it."""
    done = subprocess.run(
        ["/usr/bin/python3", "-c", ATTACK, str(target)],
        user=uid,
        group=uid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30 * SLOW,
        check=True,
    )
    return done.stdout.splitlines()


def test_a_zygote_forks_the_execs_after_the_first_with_the_helpers_semantics(
    zygoted: KernelDaemon, box: Box
) -> None:
    assert (zygoted.root / ".ns" / box.rid / "pid").exists(), "a PID namespace of its own"
    assert not through_zygote(box), "the first exec: the server's (and its relay)"
    zygote = zygote_of(zygoted, box)
    assert through_zygote(box)
    check_the_helpers_exit_codes(zygoted, box)
    env = box.exec(["sh", "-c", 'echo "$GREETING"'], env={"GREETING": "hello there"})
    assert env.out == b"hello there\n"
    killed = box.run("kill -TERM $$")
    assert killed.exit == 128 + signal.SIGTERM
    timed = box.run("sleep 300", timeout=1)
    assert timed.exit == 124, timed
    assert zygotes(zygoted, box.uid()) == [zygote], "one zygote served them all"


def test_an_exec_through_the_zygote_runs_as_the_helpers_background_process(
    box: Box, zygoted: KernelDaemon
) -> None:
    """The reference is the helper's spawn: a request over one spawn server message
    (``MESSAGE_MAX``) still goes through it. A background process is the zygote's too."""
    box.ok("true")
    zygote_of(zygoted, box)
    assert through_zygote(box)
    exec_identity = box.ok(IDENTITY)
    padding = {f"PAD{i}": "x" * (100 << 10) for i in range(3)}  # 300 KiB of environment
    spawned = box.exec(
        ["sh", "-c", LEADS_ITS_SESSION + 'echo "$pid $session"\n' + IDENTITY], env=padding
    )
    assert spawned.exit == 0, spawned
    session, *helper = spawned.text.splitlines()
    assert len(set(session.split())) == 2, "in its relay's session: the helper's spawn"
    # glibc's posix_spawn (the reactor's spawn of the helper) leaves its signals 32 and 33
    # ignored; a zygote's child, as a server's, has every signal at its default
    strip = [line for line in exec_identity.splitlines() if not line.startswith("SigIgn:")]
    assert strip == [line for line in helper if not line.startswith("SigIgn:")]
    assert int(strip[0]) == box.uid() >= zygoted.uid_min
    assert strip[-4:] == ["0", "1", "2", "3"]  # exactly 0, 1, 2 (3: the listing's own)
    assert "Seccomp:\t2" in strip and "NoNewPrivs:\t1" in strip
    assert any(box.rid in line for line in strip if ":" in line), "in the sandbox's cgroups"
    assert "SigIgn:\t0000000000000000" in exec_identity
    leads = LEADS_ITS_SESSION + 'echo "$pid $session" > ident.part; '
    script = f"{leads}({IDENTITY}) >> ident.part; mv ident.part ident.done"
    answer = zygoted.call("POST", box.url("processes"), {"cmd": ["sh", "-c", script]})
    assert answer.status == 200, answer
    done = box.workspace / "ident.done"
    assert wait_for(done.exists, 30 * SLOW)
    session, *background = done.read_text().splitlines()
    assert len(set(session.split())) == 1, "leads its session: forked by the zygote"
    assert background == exec_identity.splitlines()


def test_the_zygote_is_out_of_its_sandboxs_reach(box: Box, zygoted: KernelDaemon) -> None:
    box.ok("true")
    zygote = zygote_of(zygoted, box)
    status = Path(f"/proc/{zygote}/status").read_text()
    assert "Seccomp:\t2" in status and "NoNewPrivs:\t1" in status
    own = Path(f"/proc/{zygote}/cgroup").read_text()
    assert box.rid in own, "charged to its sandbox"
    # a process of the sandbox's uid that could name it (the sandbox cannot: the zygote is
    # outside its PID namespace) can signal it, but neither attach to it nor read its fds
    assert attack(zygote, box.uid()) == ["attach EPERM", "fds EPERM", "signal ok"]
    in_sight = box.ok("cat /proc/[0-9]*/comm 2>/dev/null").split()
    assert "sandboxd-zygote" not in in_sight and "sh" in in_sight


def test_another_sandbox_cannot_reach_a_zygote(zygoted: KernelDaemon) -> None:
    a, b = zygoted.create(), zygoted.create()
    try:
        a.ok("true")
        b.ok("true")
        zygote_a = zygote_of(zygoted, a)
        zygote_b = zygote_of(zygoted, b)
        assert attack(zygote_a, b.uid()) == ["attach EPERM", "fds EPERM", "signal EPERM"]
        for box, other in ((a, b), (b, a)):
            assert through_zygote(box)
            lines = box.ok(IDENTITY).splitlines()
            assert int(lines[0]) == box.uid() != other.uid()
            assert any(box.rid in line for line in lines if ":" in line)
            assert not any(other.rid in line for line in lines)
            pid_ns = os.stat(zygoted.root / ".ns" / box.rid / "pid").st_ino
            assert f"pid:[{pid_ns}]" in lines
        assert zygote_a != zygote_b
    finally:
        a.kill()
        b.kill()


def test_a_killed_zygote_costs_no_exec_and_is_replaced(box: Box, zygoted: KernelDaemon) -> None:
    box.ok("true")
    zygote = zygote_of(zygoted, box)
    os.kill(zygote, signal.SIGKILL)  # as a sandbox of its uid without a PID namespace could
    assert wait_for(lambda: zygote not in children(zygoted), 10 * SLOW), "reaped"
    assert box.ok("echo still") == "still"
    again = zygote_of(zygoted, box)
    assert again != zygote
    assert through_zygote(box)
    os.kill(again, signal.SIGSTOP)  # it cannot answer: the exec goes to the server in time
    try:
        started = time.monotonic()
        assert box.ok("echo stopped") == "stopped"
        assert time.monotonic() - started < 30 * SLOW
    finally:
        os.kill(again, signal.SIGCONT)
    assert wait_for(lambda: again not in children(zygoted), 10 * SLOW), "killed, reaped"


def test_the_kill_of_a_sandbox_ends_its_zygote(zygoted: KernelDaemon) -> None:
    box = zygoted.create()
    box.ok("true")
    zygote = zygote_of(zygoted, box)
    assert box.kill().status == 204
    assert wait_for(lambda: zygote not in children(zygoted), 10 * SLOW)
    assert not alive(zygote)


def test_a_quiet_zygote_is_retired(box: Box, zygoted: KernelDaemon) -> None:
    box.ok("true")
    zygote = zygote_of(zygoted, box)
    assert wait_for(lambda: zygote not in children(zygoted), QUIET + 10 * SLOW)
    assert not through_zygote(box), "the server's, starting a new one"
    assert zygote_of(zygoted, box) != zygote


def test_a_zygote_at_pids_max_hands_the_exec_to_the_server(box: Box, zygoted: KernelDaemon) -> None:
    box.ok("true")
    zygote_of(zygoted, box)
    fill = "for (1 .. 80) { my $p = fork; if (defined $p && !$p) { sleep 300; exit } } sleep 300"
    answer = zygoted.call("POST", box.url("processes"), {"cmd": ["perl", "-e", fill]})
    assert answer.status == 200, answer
    assert wait_for(lambda: box.stats()["pids"] == 64, 30 * SLOW), "held at pids.max"
    result = box.run(LEADS_ITS_SESSION + 'echo "$pid $session"')  # the zygote's clone: EAGAIN
    assert result.exit == 0, result
    inner, session = result.out.split()
    assert inner != session, "through the server (its relay), as the helper would"


def test_a_templated_sandboxs_zygote_runs_its_execs_in_the_templates_root(
    zygoted: KernelDaemon,
) -> None:
    answer = zygoted.client.request("PUT", "/templates/busybox", rootfs())
    assert answer.status == 201, answer
    answer = zygoted.call("POST", "/sandboxes", {"template": "busybox"})
    assert answer.status == 200, answer
    box = Box(zygoted, answer.json()["remote_id"])
    zygoted.rids.append(box.rid)
    try:
        view = "whoami; pwd; /bin/pwd -P; ls /"
        served = box.ok(view)  # the first exec: the server's, with the helper's steps
        zygote_of(zygoted, box)
        assert through_zygote(box)
        assert box.ok(view) == served
        assert served.split()[0] == "user"
        assert box.ok("cat /etc/os-release").encode() + b"\n" == OS_RELEASE
        listing = set(served.split()[3:])
        assert {"bin", "etc", "scratch", "home"} <= listing and "usr" not in listing
    finally:
        box.kill()


def test_a_disconnect_kills_the_process_group_of_a_zygotes_command(
    box: Box, zygoted: KernelDaemon
) -> None:
    box.ok("true")
    zygote_of(zygoted, box)
    pin = zygoted.root / ".ns" / box.rid / "pid"
    script = LEADS_ITS_SESSION + 'sleep 300 & echo "$pid $session $!" > bg; wait'
    body = json.dumps({"cmd": ["sh", "-c", script]}).encode()
    client = socket.create_connection(("127.0.0.1", zygoted.daemon.port))
    head = f"POST {box.url('exec')} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    client.sendall(head.encode() + body)
    pid_file = box.workspace / "bg"
    assert wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 30 * SLOW)
    inner, session, background = pid_file.read_text().split()
    assert inner == session, "through the zygote"
    sleeper = host_pid(int(background), pin)
    assert sleeper is not None and alive(sleeper)
    client.close()
    assert wait_for(lambda: not alive(sleeper), 10 * SLOW)


def test_stdin_reaches_every_exec_while_others_start_and_end_around_it(
    zygoted: KernelDaemon,
) -> None:
    """Each of many sandboxes runs ``cat`` with stdin, over and over, all at once: every
    command reads all of its stdin. An exec's end makes its pipes and its pidfd ready in the
    same round of the reactor's events, and the next exec's pipes are made in that round: a
    pidfd closed at once gave its number, and its event, to a stdin pipe, which then dropped
    what it had to write (4 to 5 execs in 1 000 ran with an empty stdin;
    sandboxd/_twisted.py, ``dispatch_by_round``)."""
    boxes = [zygoted.create() for _ in range(6)]  # of the daemon's 8 uids

    def drive(box: Box, seed: int) -> list[tuple[int, int]]:
        rng = random.Random(seed)
        wrong = []
        for _ in range(400):
            data = rng.randbytes(rng.randrange(1, 4096))
            body = {"cmd": ["cat"], "stdin": base64.b64encode(data).decode()}
            answer = zygoted.call("POST", box.url("exec"), body)
            assert answer.status == 200, answer
            final = json.loads(answer.body.splitlines()[-1])
            out = base64.b64decode(final["out"])
            if (final["exit"], out) != (0, data):
                wrong.append((len(data), len(out)))
        return wrong

    try:
        with ThreadPoolExecutor(len(boxes)) as pool:
            found = list(pool.map(drive, boxes, range(len(boxes))))
    finally:
        for box in boxes:
            box.kill()
    wrong = [w for each in found for w in each]
    assert wrong == [], f"{len(wrong)} of 2400 execs (stdin bytes, stdout bytes): {wrong[:10]}"
