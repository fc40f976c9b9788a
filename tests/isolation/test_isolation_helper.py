"""The exec helper ``sandboxd-exec``, run for real: the very binary the build made.

``sandbox`` mode needs root (it joins cgroups and drops to a sandbox uid): the cgroup files are
plain files here (the kernel's are in tests/kernel), everything else is the real kernel: the
session, the uid/gid switch, ``no_new_privs``, the working directory, exec and its exit codes.
"""

import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from attrs import frozen

from sandboxd.isolation.base import Identity
from sandboxd.isolation.exec.helper import HELPER, HelperSession, HelperWrapper, helper_problem
from sandboxd.isolation.exec.wrapper import JOIN_FAILED, PREFIX, spawn_env

SANDBOX = Identity(612101, 612102)
BASE_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/h", "LANG": "C.UTF-8", "TERM": "dumb"}

built = pytest.mark.skipif(not os.path.exists(HELPER), reason="the helper is not built (no cc)")
root = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox mode needs root")


@frozen
class Rig:
    top: Path
    """A directory the sandbox uid can enter (pytest's own tmp_path is root's alone)."""
    procs: list[str]

    def run(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        procs: list[str] | None = None,
        cwd: str | None = None,
        wrap: HelperWrapper | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` started through ``wrap`` (else the default helper chain) as the sandbox
        uid, in ``cwd`` (else :attr:`top`), joining ``procs`` (else :attr:`procs`)."""
        wrapped = (wrap or HelperWrapper(HELPER))(
            SANDBOX, self.procs if procs is None else procs, cwd or str(self.top), argv
        )
        return subprocess.run(
            wrapped,
            env=spawn_env(BASE_ENV if env is None else env),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )


@pytest.fixture
def rig() -> Iterator[Rig]:
    top = Path(tempfile.mkdtemp(prefix="sandboxd-helper-test-"))
    top.chmod(0o755)
    procs = [str(top / "memory.procs"), str(top / "pids procs")]
    for path in procs:
        Path(path).write_text("")
    try:
        yield Rig(top, procs)
    finally:
        for item in sorted(top.rglob("*"), reverse=True):
            item.rmdir() if item.is_dir() and not item.is_symlink() else item.unlink()
        top.rmdir()


pytestmark = built


@root
def test_joins_every_cgroup_then_drops_privilege_in_one_process(rig: Rig) -> None:
    probe = (
        'echo "$$"; cat /proc/self/oom_score_adj; id -u; id -g; id -G;'
        " ps -o sid= -o pgid= -p $$; grep NoNewPrivs /proc/self/status; pwd; echo $PWD"
    )
    done = rig.run(["sh", "-c", probe])
    assert done.returncode == 0, done.stderr
    pid, oom, uid, gid, groups, sid, pgid, _, nnp, cwd, pwd = done.stdout.split()
    assert [Path(p).read_text() for p in rig.procs] == ["0\n", "0\n"]  # 0: the writer itself
    assert oom == "0"
    assert (uid, gid, groups) == ("612101", "612102", "612102")
    assert sid == pgid == pid  # its own session and process group: the daemon can killpg it
    assert nnp == "1"
    assert cwd == pwd == str(rig.top)


@root
def test_a_failed_join_stops_before_the_command(rig: Rig) -> None:
    marker = rig.top / "ran"
    done = rig.run(["touch", str(marker)], procs=[str(rig.top / "gone" / "cgroup.procs")])
    assert done.returncode == JOIN_FAILED
    assert "sandboxd-exec: cannot join cgroup" in done.stderr
    assert not marker.exists()


@root
def test_the_directory_is_entered_as_the_sandbox(rig: Rig) -> None:
    private = rig.top / "private"
    private.mkdir(mode=0o700)  # root's: the sandbox uid cannot enter it
    done = rig.run(["pwd"], cwd=str(private))
    assert done.returncode == 2
    assert "sandboxd-exec: cd" in done.stderr and done.stdout == ""
    missing = rig.run(["pwd"], cwd=str(rig.top / "missing"))
    assert missing.returncode == 2 and missing.stdout == ""


ODD = ["a b", "'q'", '"dq"', "$HOME", "`id`", "$(id)", "-n", "", "*", "\\", "x\ny", "--"]


@root
@pytest.mark.parametrize("env", [BASE_ENV, {**BASE_ENV, "LD_PRELOAD": "/nonexistent.so"}])
def test_arguments_pass_through_untouched(rig: Rig, env: dict[str, str]) -> None:
    done = rig.run(["printf", "[%s]", *ODD], env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "".join(f"[{a}]" for a in ODD)


@root
@pytest.mark.parametrize("carried", [False, True])
def test_a_command_named_with_a_leading_dash_is_searched_on_its_path(
    rig: Rig, carried: bool
) -> None:
    bin_dir = rig.top / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "-tool"
    tool.write_text('#!/bin/sh\necho "tool:$*"\n')
    tool.chmod(0o755)
    env = {**BASE_ENV, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    if carried:
        env["EXTRA"] = "1"
    done = rig.run(["-tool", "-x"], env=env)
    assert (done.returncode, done.stdout) == (0, "tool:-x\n"), done.stderr


@root
def test_harmless_environment_passes_as_is_with_pwd(rig: Rig) -> None:
    done = rig.run(["env"], env={**BASE_ENV, "PWD": "/elsewhere"})
    assert done.returncode == 0
    seen = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert seen == {**BASE_ENV, "PWD": str(rig.top)}


@root
def test_carried_environment_reaches_the_command_exactly(rig: Rig) -> None:
    weird = "a\nb $x `y` 'z' \"w\" \\ \t end\n"
    env = {
        **BASE_ENV,
        "LD_PRELOAD": "/nonexistent.so",
        "LANG": "/tmp/evil-locale",
        "IFS": "0123456789",
        "WEIRD": weird,
        "EMPTY": "",
    }
    done = rig.run(["sh", "-c", 'printf %s "$WEIRD"'], env=env)
    assert done.stdout == weird
    listed = rig.run(["env", "-0"], env=env)
    seen = dict(entry.split("=", 1) for entry in listed.stdout.split("\0") if entry)
    assert seen == {**env, "PWD": str(rig.top)}
    assert not any(key.startswith(PREFIX) for key in seen)


@root
def test_a_forged_carrier_count_is_refused(rig: Rig) -> None:
    done = subprocess.run(
        HelperWrapper(HELPER)(SANDBOX, [], str(rig.top), ["true"]),
        env={f"{PREFIX}N": "5", f"{PREFIX}0": "A=1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == JOIN_FAILED and "environment" in done.stderr


@root
@pytest.mark.parametrize("carried", [False, True])
def test_exit_codes_follow_the_shell(rig: Rig, carried: bool) -> None:
    env = {**BASE_ENV, "X": "1"} if carried else BASE_ENV
    plain = rig.top / "plain"
    plain.write_text("not a program")
    missing = rig.run(["no-such-command-xyz"], env=env)
    assert missing.returncode == 127 and "not found" in missing.stderr
    assert rig.run([str(plain)], env=env).returncode == 126
    assert rig.run(["sh", "-c", "exit 3"], env=env).returncode == 3
    assert rig.run(["sh", "-c", "kill -9 $$"], env=env).returncode == -9


@root
@pytest.mark.parametrize(
    "args",
    [
        ["0", "1", "/", "0", "true"],  # uid 0
        ["5", "0", "/", "0", "true"],  # gid 0
        ["x", "5", "/", "0", "true"],
        ["4294967296", "5", "/", "0", "true"],  # would wrap to uid 0
        ["5", "4294967295", "/", "0", "true"],  # (gid_t)-1: "unchanged"
        ["5", "5", "/", "-1", "true"],
        ["5", "5", "/", "3", "a", "true"],  # more procs files than arguments left
        ["5", "5", "/", "1x", "true"],
    ],
)
def test_bad_arguments_start_nothing(args: list[str]) -> None:
    done = subprocess.run([HELPER, "sandbox", *args], capture_output=True, text=True, check=False)
    assert done.returncode == JOIN_FAILED and "sandboxd-exec: bad" in done.stderr


@pytest.mark.parametrize("argv", [[], ["sandbox"], ["other", "/", "true"], ["session", "/"]])
def test_usage(argv: list[str]) -> None:
    done = subprocess.run([HELPER, *argv], capture_output=True, text=True, check=False)
    assert done.returncode == JOIN_FAILED and "usage:" in done.stderr


def test_session_mode_starts_a_session_in_cwd_with_the_env_as_it_is(tmp_path: Path) -> None:
    env = {**BASE_ENV, f"{PREFIX}N": "1", "LD_PRELOAD": ""}  # nothing is unpacked here
    wrapped = HelperSession(HELPER)(Identity(os.getuid(), os.getgid()), (), str(tmp_path), ["sh"])
    wrapped += ["-c", "ps -o sid= -o pgid= -p $$; echo $$; id -u; pwd; env"]
    done = subprocess.run(wrapped, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    ids, pid, uid, cwd, *listed = done.stdout.split("\n")[:-1]
    assert ids.split() == [pid, pid]
    assert (uid, cwd) == (str(os.getuid()), str(tmp_path))
    assert dict(line.split("=", 1) for line in listed) == {**env, "PWD": str(tmp_path)}
    gone = subprocess.run(
        [HELPER, "session", str(tmp_path / "x"), "true"], capture_output=True, check=False
    )
    assert gone.returncode == 2


def test_wrappers_refuse_root_and_empty_commands() -> None:
    for identity in (Identity(0, 5), Identity(5, 0)):
        with pytest.raises(ValueError, match="never as root"):
            HelperWrapper(HELPER)(identity, [], "/", ["true"])
    for wrap in (HelperWrapper(HELPER), HelperSession(HELPER)):
        with pytest.raises(ValueError, match="empty"):
            wrap(SANDBOX, [], "/", [])


def test_wrap_layout() -> None:
    argv = HelperWrapper("/h/sandboxd-exec")(SANDBOX, ["/cg/a", "/cg/b"], "/ws", ["ls", "-l"])
    assert argv == [
        "/h/sandboxd-exec",
        "--umask=077",
        "--seccomp=default",
        "sandbox",
        "612101",
        "612102",
        "/ws",
        "2",
        "/cg/a",
        "/cg/b",
        "ls",
        "-l",
    ]
    unfiltered = HelperWrapper("/h/sandboxd-exec", seccomp=False, umask=0o022)
    assert unfiltered(SANDBOX, [], "/ws", ["ls"])[1:4] == [
        "--umask=022",
        "--seccomp=off",
        "sandbox",
    ]
    session = HelperSession("/h/sandboxd-exec", umask=0o027)(SANDBOX, [], "/ws", ["ls"])
    assert session == ["/h/sandboxd-exec", "--umask=027", "session", "/ws", "ls"]


def test_the_built_helper_is_usable() -> None:
    assert helper_problem(HELPER, as_root=False) is None
    mode = os.stat(HELPER).st_mode
    assert stat.S_ISREG(mode) and mode & 0o111 and not mode & 0o022


@root
@pytest.mark.parametrize("umask", [0o077, 0o022])
def test_the_command_starts_with_the_umask_asked_for(rig: Rig, umask: int) -> None:
    argv = HelperWrapper(HELPER, umask=umask)(SANDBOX, [], str(rig.top), ["sh", "-c", "umask"])
    done = subprocess.run(argv, env=BASE_ENV, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout.strip()) == (0, f"{umask:04o}")
    session = HelperSession(HELPER, umask)(SANDBOX, [], str(rig.top), ["sh", "-c", "umask"])
    done = subprocess.run(session, env=BASE_ENV, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout.strip()) == (0, f"{umask:04o}")


@root
@pytest.mark.parametrize("seccomp", [True, False])
def test_the_filter_is_applied_unless_asked_not_to(rig: Rig, seccomp: bool) -> None:
    probe = ["grep", "^Seccomp:", "/proc/self/status"]
    argv = HelperWrapper(HELPER, seccomp=seccomp)(SANDBOX, [], str(rig.top), probe)
    done = subprocess.run(argv, env=BASE_ENV, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Seccomp:", "2" if seccomp else "0"]  # 2: filter mode


@pytest.mark.parametrize(
    "option", ["--umask=8", "--umask=", "--umask=1000", "--seccomp=strict", "--verbose"]
)
def test_a_bad_option_stops_before_anything(option: str) -> None:
    done = subprocess.run(
        [HELPER, option, "session", "/", "true"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == JOIN_FAILED
    assert done.stderr.startswith("sandboxd-exec: bad")


def test_seccomp_check_and_dump_need_no_privilege() -> None:
    check = subprocess.run([HELPER, "seccomp-check"], capture_output=True, text=True, timeout=30)
    assert (check.returncode, check.stdout) == (0, "seccomp: enforced\n")
    dump = subprocess.run([HELPER, "seccomp-dump"], capture_output=True, timeout=30)
    assert dump.returncode == 0 and len(dump.stdout) % 8 == 0 and dump.stdout


DUMPABLE = [
    "/usr/bin/python3",
    "-c",
    "import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))",  # PR_GET_DUMPABLE
]


@root
@pytest.mark.parametrize("no_ptrace", [True, False])
def test_no_ptrace_keeps_the_command_non_dumpable_and_filtered(rig: Rig, no_ptrace: bool) -> None:
    wrap = HelperWrapper(HELPER, no_ptrace=no_ptrace)
    done = rig.run(DUMPABLE, procs=[], wrap=wrap)
    # 0: the kernel refuses ptrace and /proc/PID/mem to the uid's other processes; 1: allowed
    assert (done.returncode, done.stdout.strip()) == (0, "0" if no_ptrace else "1"), done.stderr
    done = rig.run(["/bin/grep", "^Seccomp:", "/proc/self/status"], procs=[], wrap=wrap)
    assert done.stdout.split() == ["Seccomp:", "2"], done.stderr


@root
def test_no_ptrace_runs_only_an_absolute_program_its_uid_can_read(rig: Rig) -> None:
    secret = rig.top / "root-only"
    secret.write_bytes(Path("/bin/true").read_bytes())
    secret.chmod(0o711)  # executable by the sandbox, not readable: no copy can be made
    wrap = HelperWrapper(HELPER, no_ptrace=True)
    for argv, code, said in [
        (["true"], 127, "true: command not found"),
        ([str(rig.top / "absent")], 127, "command not found"),
        ([str(secret)], 126, "Permission denied"),
        (["/bin/true"], 0, ""),
    ]:
        done = rig.run(argv, procs=[], wrap=wrap)
        assert done.returncode == code and said in done.stderr, (argv, done)


def test_no_ptrace_is_an_option_of_the_sandbox_mode() -> None:
    argv = HelperWrapper("/h/sandboxd-exec", no_ptrace=True)(SANDBOX, [], "/ws", ["/bin/ls"])
    assert argv[:5] == [
        "/h/sandboxd-exec",
        "--umask=077",
        "--seccomp=default",
        "--no-ptrace",
        "sandbox",
    ]
