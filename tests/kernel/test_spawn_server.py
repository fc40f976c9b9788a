"""The spawn server under real isolation, as root (``SANDBOXD_SPAWNER=server``, issue 20).

One daemon with the server on: its execs go through ``sandboxd-exec spawn-server``, its
background processes through the helper, as the default daemon's execs do. So within one
sandbox an exec and a background process must run as the same uid, in the same cgroups and
namespaces, under the same filter; the exec semantics (exit codes, pipes, stdin, descriptors,
timeout and disconnect kill the process group) are the helper's; a server that cannot clone
answers the error a failed spawn gives today; a killed server is replaced, its exec spawned.
"""

import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.isolation.exec.helper import HELPER
from tests.kernel.exec_semantics import check_the_helpers_exit_codes, exec_frames
from tests.kernel.kernel_http import (
    SLOW,
    Box,
    KernelDaemon,
    alive,
    host_pid,
    isolation_problem,
    wait_for,
)

WHY_NOT = isolation_problem()
pytestmark = [pytest.mark.kernel, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

IDENTITY = """\
id -u; id -g; id -G; cat /proc/self/cgroup; umask; cat /proc/self/oom_score_adj
readlink /proc/self/ns/ipc /proc/self/ns/mnt /proc/self/ns/net
grep -E '^(Seccomp|NoNewPrivs|CapEff|CapPrm|SigBlk|SigIgn):' /proc/self/status
ls /proc/self/fd
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KernelDaemon]:
    kd = KernelDaemon.start(
        tmp_path_factory.mktemp("served"),
        "--memory-max=256M",
        "--pids-max=64",
        env={"SANDBOXD_SPAWNER": "server"},
    )
    try:
        yield kd
    finally:
        kd.stop()


@pytest.fixture
def box(served: KernelDaemon) -> Iterator[Box]:
    sandbox = served.create()
    yield sandbox
    sandbox.kill()


def servers(kd: KernelDaemon) -> list[int]:
    """The daemon's spawn servers (its children running ``sandboxd-exec spawn-server``)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == kd.daemon.process.pid and argv[:2] == [HELPER.encode(), b"spawn-server"]:
            found.append(int(entry.name))
    return found


GLIBC_INTERNAL = (1 << 31) | (1 << 32)
"""Signals 32 and 33 (SIGCANCEL, SIGSETXID), as bits of ``SigIgn``."""


def ignored(lines: list[str]) -> int:
    (line,) = [line for line in lines if line.startswith("SigIgn:")]
    return int(line.split()[1], 16)


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def test_execs_go_through_one_server_with_the_helpers_exit_codes(
    served: KernelDaemon, box: Box
) -> None:
    assert box.ok("echo ready") == "ready"
    (server,) = servers(served)
    check_the_helpers_exit_codes(served, box)
    assert servers(served) == [server], "one server for them all"


def test_an_exec_runs_as_the_helpers_background_process_does(
    box: Box, served: KernelDaemon
) -> None:
    exec_identity = box.ok(IDENTITY)
    script = f"({IDENTITY}) > ident.part; mv ident.part ident.done"
    answer = served.call("POST", box.url("processes"), {"cmd": ["sh", "-c", script]})
    assert answer.status == 200, answer
    done = box.workspace / "ident.done"
    assert wait_for(done.exists, 30 * SLOW)
    helper_identity = done.read_text().strip()
    # One difference, glibc's: its posix_spawn (the reactor's spawn of the helper) leaves its
    # internal signals 32 and 33 ignored in the child, where the server's children start with
    # every signal at its default, as a program a shell starts.
    served_lines, helper_lines = exec_identity.splitlines(), helper_identity.splitlines()
    assert ignored(served_lines) == 0
    assert ignored(helper_lines) & ~GLIBC_INTERNAL == 0
    strip = [line for line in served_lines if not line.startswith("SigIgn:")]
    assert strip == [line for line in helper_lines if not line.startswith("SigIgn:")]
    lines = served_lines
    assert int(lines[0]) == box.uid() and int(lines[0]) >= served.uid_min
    assert lines[-4:] == ["0", "1", "2", "3"]  # exactly 0, 1, 2 (3: the listing's own)
    assert "Seccomp:\t2" in lines and "NoNewPrivs:\t1" in lines
    assert any(box.rid in line for line in lines if ":" in line), "in the sandbox's cgroups"


def test_timeout_and_disconnect_kill_the_process_group(box: Box, served: KernelDaemon) -> None:
    pin = box.kd.root / ".ns" / box.rid / "pid"  # with a PID namespace: $! is its number
    timed = box.run("sleep 300 & echo $! > bg1; wait", timeout=2 * SLOW)
    assert timed.exit == 124, timed
    first = host_pid(int((box.workspace / "bg1").read_text()), pin)
    assert first is None or wait_for(lambda: not alive(first), 10 * SLOW)

    body = json.dumps({"cmd": ["sh", "-c", "sleep 300 & echo $! > bg2; wait"]}).encode()
    client = socket.create_connection(("127.0.0.1", served.daemon.port))
    head = f"POST {box.url('exec')} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    client.sendall(head.encode() + body)
    pid_file = box.workspace / "bg2"
    assert wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 30 * SLOW)
    second = host_pid(int(pid_file.read_text()), pin)
    assert second is not None and alive(second)
    client.close()
    assert wait_for(lambda: not alive(second), 10 * SLOW)


def own_pids_cgroup() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return Path("/sys/fs/cgroup/pids") / path.lstrip("/")
    return None


def test_a_server_at_its_pids_limit_gives_todays_spawn_error(
    box: Box, served: KernelDaemon
) -> None:
    own = own_pids_cgroup()
    if own is None or not own.is_dir():
        pytest.skip("no cgroup v1 pids hierarchy to hold the server in")
    assert box.ok("true") == ""
    (server,) = servers(served)
    held = own / f"spawn-server-test-{os.getpid()}"
    held.mkdir()
    origin = Path(f"/proc/{server}/cgroup").read_text()
    try:
        (held / "pids.max").write_text("1")
        (held / "cgroup.procs").write_text(str(server))  # the server is its one pid: no clone
        final = exec_frames(served, box, {"cmd": ["true"]})
    finally:
        back = next(line for line in origin.splitlines() if ":pids:" in line).split(":", 2)[2]
        (Path("/sys/fs/cgroup/pids") / back.lstrip("/") / "cgroup.procs").write_text(str(server))
        held.rmdir()
    # reactor.spawnProcess of the helper names its EAGAIN so (os.posix_spawnp's filename)
    detail = f"cannot start the command: [Errno 11] Resource temporarily unavailable: {HELPER!r}"
    assert final == {"error": "SpawnFailed", "detail": detail}
    assert box.ok("echo again") == "again"


def test_a_killed_server_means_the_helper_then_a_new_server(box: Box, served: KernelDaemon) -> None:
    assert box.ok("true") == ""
    (server,) = servers(served)
    os.kill(server, signal.SIGKILL)
    assert wait_for(lambda: not alive(server) or zombie(server), 10 * SLOW)
    assert box.ok("echo spawned") == "spawned"  # the server found gone: the helper
    assert servers(served) == []
    assert box.ok("echo served") == "served"
    (again,) = servers(served)
    assert again != server


def test_a_sandbox_at_its_pids_max_answers_as_through_the_helper(
    box: Box, served: KernelDaemon
) -> None:
    fill = "for (1 .. 80) { my $p = fork; if (defined $p && !$p) { sleep 300; exit } } sleep 300"
    answer = served.call("POST", box.url("processes"), {"cmd": ["perl", "-e", fill]})
    assert answer.status == 200, answer
    assert wait_for(lambda: box.stats()["pids"] == 64, 30 * SLOW), "held at pids.max"
    script = "exec > helper.out 2> helper.err; echo inside; sleep 0 & wait"
    served_result = box.run(script.partition("; ")[2])  # its fork is refused
    answer = served.call("POST", box.url("processes"), {"cmd": ["sh", "-c", script]})
    assert answer.status == 200, answer
    ended: list[dict[str, object]] = []

    def helper_ended() -> bool:
        listing = served.call("GET", box.url("processes")).json()
        ended[:] = [p for p in listing["processes"] if p["id"] == answer.json()["id"]]
        return bool(ended) and ended[0]["exit"] is not None

    assert wait_for(helper_ended, 30 * SLOW)
    assert served_result.exit == ended[0]["exit"] != 0
    assert served_result.out == (box.workspace / "helper.out").read_bytes() == b"inside\n"
    assert served_result.err == (box.workspace / "helper.err").read_bytes() != b""
