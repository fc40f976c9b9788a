"""The exec wrapper, run for real by ``/bin/sh`` with stand-ins for ``setsid`` and ``setpriv``.

The stand-ins log their arguments and environment and ``exec`` the rest, so the test needs no
root: it checks what the wrapper asks of them, the cgroup join (plain files here), argument
and environment passing, and the exit codes.
"""

import os
import stat
import subprocess
from pathlib import Path

import pytest
from attrs import frozen

from sandboxd.isolation.base import CD_AND_EXEC, Identity
from sandboxd.isolation.exec.wrapper import JOIN_FAILED, PREFIX, Programs, Wrapper, spawn_env
from sandboxd.isolation.none import find_program

SANDBOX = Identity(200007, 200008)
BASE_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/h", "LANG": "C.UTF-8", "TERM": "dumb"}


def script(path: Path, text: str) -> str:
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return str(path)


@frozen
class Rig:
    tmp: Path
    wrapper: Wrapper
    procs: list[str]

    def run(
        self, argv: list[str], env: dict[str, str] | None = None, procs: list[str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        wrapped = self.wrapper(SANDBOX, self.procs if procs is None else procs, "/", argv)
        carried = spawn_env(BASE_ENV if env is None else env)
        return subprocess.run(
            wrapped, env=carried, capture_output=True, text=True, timeout=30, check=False
        )

    def log(self, name: str) -> str:
        return (self.tmp / name).read_text()


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    setsid = script(
        tmp_path / "setsid",
        f'echo "$$ $*" > {tmp_path}/setsid.log\n[ "$1" = -- ] && shift\nexec "$@"\n',
    )
    setpriv = script(
        tmp_path / "setpriv",
        f'echo "$$ $*" > {tmp_path}/setpriv.log\nenv > {tmp_path}/setpriv.env\n'
        'while [ "$1" != -- ]; do shift; done\nshift\nexec "$@"\n',
    )
    programs = Programs(sh="/bin/sh", setsid=setsid, setpriv=setpriv, env=find_program("env"))
    procs = [str(tmp_path / "memory.procs"), str(tmp_path / "pids procs")]
    for path in procs:
        Path(path).write_text("")
    return Rig(tmp_path, Wrapper(programs), procs)


def test_joins_every_cgroup_then_drops_privilege_in_one_process(rig: Rig) -> None:
    done = rig.run(["sh", "-c", 'echo "$$"; cat /proc/self/oom_score_adj'])
    assert done.returncode == 0, done.stderr
    pid, oom = done.stdout.split()
    assert [Path(p).read_text() for p in rig.procs] == ["0\n", "0\n"]  # 0: the writer itself
    assert oom == "0"
    assert rig.log("setsid.log").split()[0] == pid
    setpriv_pid, *options = rig.log("setpriv.log").split()
    assert setpriv_pid == pid
    assert options[:5] == [
        "--reuid=200007",
        "--regid=200008",
        "--clear-groups",
        "--no-new-privs",
        "--",
    ]


def test_a_failed_join_stops_before_the_command(rig: Rig) -> None:
    marker = rig.tmp / "ran"
    done = rig.run(["touch", str(marker)], procs=[str(rig.tmp / "gone" / "cgroup.procs")])
    assert done.returncode == JOIN_FAILED
    assert "sandboxd-exec: cannot join cgroup" in done.stderr
    assert not marker.exists()
    assert not (rig.tmp / "setpriv.log").exists()


ODD = ["a b", "'q'", '"dq"', "$HOME", "`id`", "$(id)", "-n", "", "*", "\\", "x\ny", "--"]


@pytest.mark.parametrize("env", [BASE_ENV, {**BASE_ENV, "LD_PRELOAD": "/nonexistent.so"}])
def test_arguments_pass_through_untouched(rig: Rig, env: dict[str, str]) -> None:
    done = rig.run(["printf", "[%s]", *ODD], env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "".join(f"[{a}]" for a in ODD)


@pytest.mark.parametrize("carried", [False, True])
def test_a_command_named_with_a_leading_dash(rig: Rig, carried: bool) -> None:
    bin_dir = rig.tmp / "bin"
    bin_dir.mkdir()
    script(bin_dir / "-tool", 'echo "tool:$*"\n')
    env = {**BASE_ENV, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    if carried:
        env["EXTRA"] = "1"
    done = rig.run(["-tool", "-x"], env=env)
    assert (done.returncode, done.stdout) == (0, "tool:-x\n"), done.stderr


def test_harmless_environment_passes_as_is(rig: Rig) -> None:
    done = rig.run(["env"])
    assert done.returncode == 0
    seen = dict(line.split("=", 1) for line in done.stdout.splitlines())
    seen.pop("PWD", None)  # sh exports its working directory
    assert seen == BASE_ENV
    assert PREFIX not in rig.log("setpriv.env")


def test_other_environment_reaches_only_the_command(rig: Rig) -> None:
    env = {
        **BASE_ENV,
        "LD_PRELOAD": "/nonexistent.so",
        "LANG": "/tmp/evil-locale",
        "IFS": "0123456789",
        "WEIRD": "line1\nline2 $x `y` 'z' \"w\" \\",
        "EMPTY": "",
        "OPTIND": "3",
    }
    done = rig.run(["env"], env=env)
    assert done.returncode == 0, done.stderr
    seen = {}
    for line in done.stdout.split("\n"):
        if "=" in line:
            key, value = line.split("=", 1)
            seen[key] = value
    assert seen["LD_PRELOAD"] == "/nonexistent.so"
    assert "IFS" in seen  # the chain's last sh (cd) resets its value, as every sh does
    assert seen["EMPTY"] == ""
    assert "line1" in seen["WEIRD"]
    assert not any(key.startswith(PREFIX) for key in seen)
    root_names = {line.split("=", 1)[0] for line in rig.log("setpriv.env").splitlines()}
    assert not root_names & {"LD_PRELOAD", "LANG", "IFS", "WEIRD", "OPTIND"}


def test_carried_values_survive_exactly(rig: Rig) -> None:
    weird = "a\nb $x `y` 'z' \"w\" \\ \t end\n"
    done = rig.run(["sh", "-c", 'printf %s "$WEIRD"'], env={**BASE_ENV, "WEIRD": weird, "X": "1"})
    assert done.stdout == weird


@pytest.mark.parametrize("carried", [False, True])
def test_exit_codes_follow_the_shell(rig: Rig, carried: bool) -> None:
    env = {**BASE_ENV, "X": "1"} if carried else BASE_ENV
    plain = rig.tmp / "plain"
    plain.write_text("not a program")
    assert rig.run(["no-such-command-xyz"], env=env).returncode == 127
    assert rig.run([str(plain)], env=env).returncode == 126
    assert rig.run(["sh", "-c", "exit 3"], env=env).returncode == 3
    assert rig.run(["sh", "-c", "kill -9 $$"], env=env).returncode == -9


def test_wrap_refuses_root_and_empty_commands(rig: Rig) -> None:
    for identity in (Identity(0, 5), Identity(5, 0)):
        with pytest.raises(ValueError, match="never as root"):
            rig.wrapper(identity, [], "/", ["true"])
    with pytest.raises(ValueError, match="empty"):
        rig.wrapper(SANDBOX, [], "/", [])


def test_wrap_layout() -> None:
    wrapper = Wrapper(Programs("/bin/sh", "/s/setsid", "/s/set priv", "/usr/bin/env"))
    argv = wrapper(SANDBOX, ["/cg/a", "/cg/b"], "/ws", ["ls", "-l"])
    assert argv[:2] == ["/bin/sh", "-c"]
    assert argv[3:] == [
        "sandboxd-exec",
        "200007",
        "200008",
        "2",
        "/cg/a",
        "/cg/b",
        "/bin/sh",
        "-c",
        CD_AND_EXEC,
        "sh",
        "/ws",
        "ls",
        "-l",
    ]
    assert "'/s/set priv'" in argv[2]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"A-B": "1"}, "not a shell identifier"),
        ({"1A": "1"}, "not a shell identifier"),
        ({f"{PREFIX}N": "1"}, "reserved prefix"),
        ({"OPTIND": "x"}, "not a number"),
        ({"A": "x\0y"}, "NUL"),
    ],
)
def test_spawn_env_refuses_what_cannot_be_carried(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spawn_env(env)


def test_spawn_env_carries_anything_not_known_harmless() -> None:
    assert spawn_env({}) == {}
    assert spawn_env({"LC_ALL": "C", "USER": "x"}) == {"LC_ALL": "C", "USER": "x"}
    assert spawn_env({"LC_ALL": "../x/y"}) == {f"{PREFIX}0": "LC_ALL=../x/y", f"{PREFIX}N": "1"}
    assert spawn_env({"PATH": "/bin", "LD_LIBRARY_PATH": "/w"}) == {
        f"{PREFIX}0": "PATH=/bin",
        f"{PREFIX}1": "LD_LIBRARY_PATH=/w",
        f"{PREFIX}N": "2",
    }


def test_programs_find_resolves_each_once() -> None:
    asked: list[str] = []

    def which(name: str) -> str:
        asked.append(name)
        return f"/opt/{name}"

    assert Programs.find(which) == Programs("/opt/sh", "/opt/setsid", "/opt/setpriv", "/opt/env")
    assert asked == ["sh", "setsid", "setpriv", "env"]


def test_scripts_are_plain_posix_sh(rig: Rig) -> None:
    mode = os.stat(rig.wrapper.programs.setpriv).st_mode
    assert mode & stat.S_IXUSR
    check = subprocess.run(["/bin/sh", "-n", "-c", rig.wrapper.script], check=False)
    assert check.returncode == 0


def test_an_oom_score_adj_that_cannot_be_lowered_is_kept(rig: Rig) -> None:
    def raise_own() -> None:
        Path("/proc/self/oom_score_adj").write_text("100")

    wrapped = rig.wrapper(SANDBOX, rig.procs, "/", ["cat", "/proc/self/oom_score_adj"])
    done = subprocess.run(
        wrapped, env=BASE_ENV, capture_output=True, text=True, preexec_fn=raise_own, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("0", "100")  # 100 without CAP_SYS_RESOURCE


@pytest.mark.parametrize(("umask", "modes"), [(0o077, "600 700"), (0o022, "644 755")])
def test_the_command_starts_with_the_umask(
    tmp_path: Path, rig: Rig, umask: int, modes: str
) -> None:
    wrapper = Wrapper(rig.wrapper.programs, umask)
    made = tmp_path / "made"
    argv = ["sh", "-c", f"umask; echo x > {made}.f; mkdir {made}.d; stat -c %a {made}.f {made}.d"]
    done = subprocess.run(
        wrapper(SANDBOX, [], "/", argv), env=spawn_env(BASE_ENV), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"{umask:04o}", *modes.split()]
