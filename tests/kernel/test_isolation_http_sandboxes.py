"""Real-kernel behaviour suite over HTTP, part 1: sandboxes against each other and the host.

Issue 4, points 1 (uids, workspaces, signals, ptrace), 6 (the ready marker), 7 (kill leaves
nothing, the uid is reused safely) and 8 (never root, never the daemon's environment), proven
with a real ``twistd -n sandboxd --isolation=auto`` as root: the cgroup v1 driver on the hybrid
hosts, cgroup v2 in the VM of ``tests/vm/run.sh``. See ``kernel_http`` and ``conftest``.
"""

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from sandboxd.isolation.namespaces.pins import PLACES, kept_directories
from sandboxd.isolation.network.egress_ca import CA_DIR
from tests.kernel.conftest import CANARY_NAME, CANARY_VALUE, OTHER_CANARY_NAME
from tests.kernel.kernel_http import (
    SLOW,
    Box,
    KernelDaemon,
    Result,
    alive,
    cgroup_dirs_named,
    host_pid,
    isolation_problem,
    proc_uids,
    processes_of,
    remove,
    scratch_dir,
    wait_for,
)

WHY_NOT = isolation_problem()
pytestmark = [pytest.mark.kernel, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

SECRET = b"b's secret: never readable by another sandbox\n"

PTRACE_ATTACH = """\
import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
pid = int(sys.argv[1])
rc = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
print(rc, errno.errorcode.get(ctypes.get_errno(), "-"))
if rc == 0:
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
sys.exit(0 if rc == 0 else 1)
"""


DOUBLE_FORK = "import os, time; os.fork() or os.setsid(); os.fork() or time.sleep(303)"
"""Python daemonizing itself: fork, setsid in the child, fork again; the grandchildren sleep."""


def running(uid: int, cmdline: bytes) -> bool:
    """Whether a process of ``uid`` has the command line ``cmdline`` (NUL-terminated words)."""
    for pid in processes_of([uid]):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline:
                return True
        except OSError:
            pass  # ended meanwhile
    return False


def background_sleeper(box: Box, seconds: int = 300) -> tuple[int, int]:
    """Start ``sleep`` in the sandbox, outliving its exec: its pid as the host numbers it, and
    as the sandbox does (the same, unless it has a PID namespace)."""
    inner = int(box.ok(f"sleep {seconds} </dev/null >/dev/null 2>&1 & echo $!"))
    pin = box.kd.root / ".ns" / box.rid / "pid"
    assert wait_for(lambda: host_pid(inner, pin) is not None, 5 * SLOW)
    pid = host_pid(inner, pin)
    assert pid is not None and wait_for(lambda: proc_uids(pid) is not None, 5 * SLOW)
    return pid, inner


def test_two_sandboxes_have_distinct_uids_and_private_workspaces(roomy: KernelDaemon) -> None:
    a, b = roomy.create(), roomy.create()
    ids = {}
    for box in (a, b):
        out = box.ok("id -u; id -g; id -G").split()
        uid, gid, groups = int(out[0]), int(out[1]), out[2:]
        assert uid != 0 and roomy.uid_min <= uid <= roomy.uid_max
        assert gid == uid and groups == [str(gid)]
        ids[box.rid] = uid
    assert ids[a.rid] != ids[b.rid]

    assert b.upload("secret", SECRET).status == 204
    assert b.mkdir("sub").status == 204
    before = sorted(os.listdir(b.workspace))
    other = b.workspace
    attacks = [
        f"cat {other}/secret",
        f"head -c1 {other}/secret",
        f"ls {other}",
        f"ls {b.directory}",
        f"ls {roomy.root}",
        f"test -e {other}/secret",
        f"touch {other}/pwned",
        f"echo x >> {other}/secret",
        f": > {other}/secret",
        f"rm -f {other}/secret",
        f"mkdir {other}/pwned",
        f"mv {other}/secret {other}/moved",
        f"chmod 777 {other}",
        f"ln -s /etc {other}/sub/pwned",
        f"touch {b.directory}/home/pwned",
        f"touch {b.directory}/tmp/pwned",
        f"cd {other}",
    ]
    for attack, result in zip(attacks, a.run_each(attacks), strict=True):
        assert result.exit != 0, (attack, result)
        assert SECRET not in result.out + result.err
    assert sorted(os.listdir(b.workspace)) == before
    assert (b.workspace / "secret").read_bytes() == SECRET
    assert os.listdir(b.workspace / "sub") == []
    assert os.listdir(b.directory / "home") == []
    # Only the mount point binding a state root under /tmp back into the sandbox's own /tmp.
    kept = {os.path.basename(p) for p in kept_directories(PLACES, [str(b.kd.root)])}
    assert set(os.listdir(b.directory / "tmp")) <= kept
    assert b.download("secret").body == SECRET
    # And the sandbox itself keeps every right to its own workspace.
    assert b.ok("cat secret; ls") == SECRET.decode() + "secret\nsub"
    a.kill()
    b.kill()


def test_a_sandbox_cannot_signal_or_ptrace_another(roomy: KernelDaemon) -> None:
    a, b = roomy.create(), roomy.create()
    pid, inner = background_sleeper(b)
    uids = proc_uids(pid)
    assert uids is not None and set(uids) == {b.uid()}
    assert b.run(f"kill -0 {inner}").exit == 0, "its own sandbox may signal it"
    # With a PID namespace the other sandbox cannot even name it: no such process.
    hidden = "isolation.pid" in roomy.call("GET", "/healthz").json()["capabilities"]
    refused = b"No such process" if hidden else b"not permitted"

    for result in a.run_each([f"kill {signal} {pid}" for signal in ("-0", "-9", "-STOP", "-TERM")]):
        assert result.exit != 0, result
        assert refused in result.err, result
    assert alive(pid)
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state == "S", "neither killed nor stopped"

    peeks = [f"cat /proc/{pid}/environ", f"ls /proc/{pid}/fd", f"cat /proc/{pid}/maps"]
    for peek, result in zip(peeks, a.run_each(peeks), strict=True):
        assert result.exit != 0, (peek, result)
        assert (b"No such file" if hidden else b"ermission denied") in result.err, (peek, result)
    traced = a.exec(["python3", "-c", PTRACE_ATTACH, str(pid)])
    assert traced.exit == 1 and traced.text == ("-1 ESRCH" if hidden else "-1 EPERM"), traced
    assert alive(pid)
    a.kill()
    b.kill()
    assert wait_for(lambda: not alive(pid), 5 * SLOW)


def test_a_sandbox_cannot_forge_or_remove_its_ready_marker(roomy: KernelDaemon) -> None:
    box = roomy.create()
    marker = box.directory / ".ready"
    assert not box.ready()
    forge = [
        "touch ../.ready",
        ": > ../.ready",
        "mkdir ../.ready",
        "ln -s workspace ../.ready",
        "mv ../workspace ../.ready",
        "ls -a ..",
        "chmod 777 ..",
    ]
    for attempt, result in zip(forge, box.run_each(forge), strict=True):
        assert result.exit != 0, (attempt, result)
    for path in ("../.ready", "/../.ready", "a/../../.ready"):
        assert box.upload(path, b"").status == 400
        assert box.mkdir(path).status == 400
    # A link in the workspace to where the marker lives: the file API replaces the link.
    assert box.ok("ln -s ../.ready r1; ln -s .. up; echo ok") == "ok"
    assert box.upload("r1", b"").status == 204
    assert box.upload("up/.ready", b"").status == 404
    assert box.mkdir("up/.ready").status == 404
    assert not marker.exists() and not box.ready()

    assert roomy.call("POST", box.url("mark-ready")).status == 204
    assert box.ready()
    remove_attempts = [
        "rm -f ../.ready",
        "rm -rf ..",
        "mv ../.ready ../gone",
        "mv ../.ready gone",
        "echo x > ../.ready",
        "chmod 777 ../.ready",
        "ln -f ../.ready gone",
    ]
    for attempt, result in zip(remove_attempts, box.run_each(remove_attempts), strict=True):
        assert result.exit != 0, (attempt, result)
    for path in ("../.ready", "/../.ready"):
        assert box.delete(path).status == 400
        assert box.rmdir(path).status == 400
        assert box.rename(path, "gone").status == 400
    assert box.ok("ln -sfn ../.ready r2; echo ok") == "ok"
    assert box.delete("r2").status == 204  # the link, not the marker
    assert box.rename("up/.ready", "gone").status == 404
    assert box.rmdir("up").status == 400  # a link is not a directory
    assert box.ready()
    st = marker.lstat()
    assert (st.st_uid, st.st_size) == (0, 0) and marker.is_file()
    box.kill()


def test_kill_and_stop_leave_no_process_cgroup_directory_or_uid(tmp_path: Path) -> None:
    # One uid in the pool: the next sandbox must get the very uid the killed one had.
    kd = KernelDaemon.start(tmp_path, "--memory-max=128M", "--pids-max=64", uids=1)
    try:
        box = kd.create()
        uid = box.uid()
        script = """
            sleep 300 </dev/null >/dev/null 2>&1 &
            setsid sh -c 'sleep 301 </dev/null >/dev/null 2>&1 &' </dev/null >/dev/null 2>&1
            (setsid sh -c '(trap "" TERM HUP INT; sleep 302) &' </dev/null >/dev/null 2>&1 &)
            nohup sh -c 'trap "" TERM HUP; while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &
            sh -c 'kill -STOP $$' </dev/null >/dev/null 2>&1 &
            python3 -c "$DOUBLE_FORK" </dev/null >/dev/null 2>&1
            echo started
        """
        assert box.ok(f"DOUBLE_FORK='{DOUBLE_FORK}'; {script}") == "started"
        # A command still streaming when the kill comes.
        streaming: list[Result | BaseException] = []

        def stream() -> None:
            try:
                streaming.append(box.exec(["sh", "-c", "echo go; exec sleep 304"], timeout=120))
            except BaseException as e:
                streaming.append(e)

        streamer = threading.Thread(target=stream)
        streamer.start()
        # the streaming command's sleep runs: the kill comes while it streams (counting the
        # uid's processes alone let the kill come before the exec was asked for: a 404)
        assert wait_for(lambda: running(uid, b"sleep\x00304\x00"), 10 * SLOW), processes_of([uid])
        assert len(processes_of([uid])) >= 8, processes_of([uid])
        pids = processes_of([uid])
        assert kd.call("DELETE", f"/sandboxes/{box.rid}").status == 204
        streamer.join(30 * SLOW)
        assert not streamer.is_alive()
        assert isinstance(streaming[0], Result) and streaming[0].exit == 137, streaming

        assert wait_for(lambda: not processes_of([uid]), 5 * SLOW), processes_of([uid])
        assert not any(alive(pid) for pid in pids)
        assert cgroup_dirs_named(box.rid) == []
        assert not box.directory.exists()
        # the (empty) pins' directory, and the egress proxy's CA (the daemon's, made at start)
        assert sorted(os.listdir(kd.root)) == sorted([".lock", ".ns", CA_DIR])
        assert os.listdir(kd.root / ".ns") == []
        assert box.kill().status == 404
        assert kd.call("GET", box.url("ready")).status == 404

        again = kd.create()
        assert again.uid() == uid, "the one uid of the pool is free again"
        assert again.walk().json()["entries"] == []
        workspace_and_home, tmp = again.ok("ls -A; ls -A $HOME; echo /; ls -A $TMPDIR").split("/")
        assert workspace_and_home.strip() == ""
        # Nothing but the mount point binding a state root under /tmp back into its /tmp.
        kept = {os.path.basename(p) for p in kept_directories(PLACES, [str(kd.root)])}
        assert set(tmp.split()) <= kept, tmp
        # Stopping the daemon with a live sandbox holding a setsid double-fork.
        assert again.ok("setsid sh -c 'sleep 305 &' </dev/null >/dev/null 2>&1; echo ok") == "ok"
        assert wait_for(lambda: len(processes_of([uid])) >= 1, 5 * SLOW)
    finally:
        kd.stop()  # asserts: no process of the uid, no cgroup of the daemon, no state root


def test_commands_never_run_as_root_nor_see_the_daemon_environment(roomy: KernelDaemon) -> None:
    box = roomy.create()
    uid = box.uid()
    daemon_env = Path(f"/proc/{roomy.daemon.process.pid}/environ").read_bytes()
    assert f"{CANARY_NAME}={CANARY_VALUE}".encode() in daemon_env, "the canary is really there"

    out = box.ok(
        "id -u; id -ru; id -g; id -rg; id -G;"
        " grep -E '^(Uid|Gid|Groups|NoNewPrivs|Cap[A-Za-z]+):' /proc/self/status; env"
    )
    lines = out.splitlines()
    assert lines[:5] == [str(uid)] * 5
    status = dict(line.split(":", 1) for line in lines[5:] if ":" in line)
    assert status["Uid"].split() == [str(uid)] * 4
    assert status["Gid"].split() == [str(uid)] * 4
    assert status["Groups"].split() == []
    assert status["NoNewPrivs"].strip() == "1"
    for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(status[cap], 16) == 0, (cap, status[cap])
    assert CANARY_VALUE not in out and CANARY_NAME not in out and OTHER_CANARY_NAME not in out

    # Not through the daemon's /proc entry either (its parent: the daemon spawned the wrapper).
    for peek in ("cat /proc/$PPID/environ", f"cat /proc/{roomy.daemon.process.pid}/environ"):
        result = box.run(peek)
        assert result.exit != 0 and CANARY_VALUE.encode() not in result.out, (peek, result)
    # Nor by any process of its own, however it is started.
    deep = box.ok("sh -c 'setsid sh -c env' ; python3 -c 'import os; print(dict(os.environ))'")
    assert CANARY_VALUE not in deep
    box.kill()


def test_a_setuid_root_binary_cannot_escalate(roomy: KernelDaemon) -> None:
    box = roomy.create()
    uid = box.uid()
    where = scratch_dir()
    try:
        if os.statvfs(where).f_flag & os.ST_NOSUID:
            pytest.skip(f"{where} is on a nosuid mount")
        suid_id = where / "id"
        shutil.copy2(shutil.which("id") or "/usr/bin/id", suid_id)
        os.chown(suid_id, 0, 0)
        suid_id.chmod(0o4755)
        # Control: without no_new_privs, the same uid really becomes root through it.
        control = subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", str(suid_id), "-u"],
            capture_output=True,
            check=True,
        )
        assert control.stdout.strip() == b"0"

        assert box.ok(f"{suid_id} -u; {suid_id} -ru") == f"{uid}\n{uid}"
        escalations = [
            "su -c id root",
            "su root -c 'touch /root/pwned'",
            "mount -t tmpfs none $HOME",
            "umount /proc",
            "newgrp root",
        ]
        for attempt, result in zip(escalations, box.run_each(escalations), strict=True):
            assert result.exit != 0, (attempt, result)
            assert not result.out.strip().startswith(b"uid=0"), (attempt, result)
        assert not Path("/root/pwned").exists()
    finally:
        remove(where)
        box.kill()


PRELOAD_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char line[64];
    int fd = open(LOG_PATH, O_WRONLY | O_APPEND);
    if (fd < 0) return;
    int n = snprintf(line, sizeof line, "%d %d\n", (int)getuid(), (int)geteuid());
    if (n > 0) { ssize_t w = write(fd, line, (size_t)n); (void)w; }
    close(fd);
}
"""


def test_ld_preload_reaches_the_command_only(roomy: KernelDaemon) -> None:
    box = roomy.create()
    uid = box.uid()
    result = box.exec(
        ["sh", "-c", "printenv LD_PRELOAD; id -u"], env={"LD_PRELOAD": "/nonexistent.so"}
    )
    assert result.exit == 0 and result.text.splitlines() == ["/nonexistent.so", str(uid)], result

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a preload library that reports who loads it")
    where = scratch_dir()
    try:
        log = where / "loaded"
        log.touch()
        log.chmod(0o666)
        library = where / "preload.so"
        source = where / "preload.c"
        source.write_text(PRELOAD_C)
        subprocess.run(
            [cc, "-shared", "-fPIC", "-O1", f'-DLOG_PATH="{log}"', "-o", str(library), str(source)],
            check=True,
        )
        library.chmod(0o755)
        result = box.exec(["sh", "-c", "printenv LD_PRELOAD"], env={"LD_PRELOAD": str(library)})
        assert result.exit == 0 and result.text == str(library), result
        loaded = log.read_text().splitlines()
        assert loaded, "the command's own programs load it"
        assert set(loaded) == {f"{uid} {uid}"}, f"loaded before the privilege drop: {loaded}"
    finally:
        remove(where)
        box.kill()


NODE = shutil.which("node")


def test_the_sandbox_uid_has_a_name_that_tools_find(roomy: KernelDaemon) -> None:
    """``whoami``, ``id -un``, Python's ``pwd`` and Node's ``os.userInfo()`` (npm's) name the
    sandbox's uid ``user`` with its home, inside the sandbox only."""
    host_passwd = Path("/etc/passwd").read_bytes()
    box = roomy.create()
    uid = box.uid()
    home = box.ok("echo $HOME")
    assert box.ok("whoami; id -un; id -gn").split() == ["user"] * 3
    entry = box.ok("python3 -c 'import pwd, os; print(tuple(pwd.getpwuid(os.getuid())))'")
    assert entry == repr(("user", "x", uid, uid, "user", home, "/bin/sh"))
    if NODE is not None:
        info = box.ok(
            f"{NODE} -e 'const i = require(\"os\").userInfo(); console.log(i.username, i.homedir)'"
        )
        assert info == f"user {home}"
    assert box.ok("getent passwd root | cut -d: -f1,3") == "root:0"
    assert Path("/etc/passwd").read_bytes() == host_passwd
    box.kill()
