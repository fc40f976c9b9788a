"""The real ``sandboxctl`` (its own process) against a real daemon: what a person at a
terminal sees, stream by stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.coverage import coverage_env

from .real_daemon import Daemon, running_daemon

REPO = str(Path(__file__).resolve().parents[2])
TOKEN = "cli-daemon-token"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("daemon"), TOKEN) as running:
        yield running


@pytest.fixture
def ctl(daemon: Daemon, tmp_path: Path) -> Iterator[object]:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {
        **coverage_env(),
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": REPO,
        "SANDBOXD_URL": daemon.url,
        "SANDBOXD_TOKEN_FILE": str(token),
    }

    def run(*argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "sandboxd_client.cli", *argv],
            env=env,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,  # not the test's own
            capture_output=True,
            timeout=120,
            check=False,
        )

    yield run


def created(ctl) -> str:  # type: ignore[no-untyped-def]
    done = ctl("create")
    assert done.returncode == 0, done.stderr
    return str(done.stdout.decode().strip())


def test_exec_sends_stderr_to_stderr_and_takes_the_command_without_a_separator(ctl) -> None:  # type: ignore[no-untyped-def]
    handle = created(ctl)
    script = "echo out1; echo err1 >&2; echo out2; exit 4"
    done = ctl("exec", handle, "sh", "-c", script)
    assert (done.returncode, done.stdout, done.stderr) == (4, b"out1\nout2\n", b"err1\n")
    assert ctl("put", handle, "/dev/null", "dir/empty-file").returncode == 0
    done = ctl("exec", "--cwd", "dir", handle, "ls", "-la")  # -la is the command's own
    assert done.returncode == 0 and b"empty-file" in done.stdout and b"total" in done.stdout
    done = ctl("exec", handle, "--cwd", "dir", "--", "ls", "-a")
    assert done.stdout.split() == [b".", b"..", b"empty-file"]
    done = ctl("exec", handle, "sh", "-c", "echo --cwd")  # an option after the command: its own
    assert done.stdout == b"--cwd\n"
    assert ctl("kill", handle).returncode == 0


def test_a_cwd_that_is_no_directory_is_execs_own_failure(ctl) -> None:  # type: ignore[no-untyped-def]
    handle = created(ctl)
    assert ctl("put", handle, "/dev/null", "dir/a-file").returncode == 0
    line = "sandboxctl: exec: --cwd {}: no such directory in the sandbox's workspace\n"
    for cwd in ("missing", "dir/a-file"):
        done = ctl("exec", "--cwd", cwd, handle, "true")
        assert (done.returncode, done.stdout) == (125, b"")
        assert done.stderr.endswith(line.format(cwd).encode()), done.stderr
    # Streamed stdin takes the same way out, and --json too.
    done = ctl("exec", "--cwd", "missing", handle, "cat", stdin=b"data")
    assert done.returncode == 125 and done.stderr.endswith(line.format("missing").encode())
    done = ctl("--json", "exec", "--cwd", "missing", handle, "true")
    assert done.returncode == 125
    # The command's own exit 2 in a directory that exists stays 2, with or without --cwd.
    for cwd in (["--cwd", "dir"], []):
        done = ctl("exec", *cwd, handle, "sh", "-c", "echo own >&2; exit 2")
        assert (done.returncode, done.stderr) == (2, b"own\n")
    assert ctl("kill", handle).returncode == 0


def test_the_ids_that_list_prints_work_as_handles(ctl) -> None:  # type: ignore[no-untyped-def]
    handle = created(ctl)
    listed = ctl("list")
    assert listed.returncode == 0 and listed.stderr == b""
    ids = [line.split()[0].decode() for line in listed.stdout.splitlines()]
    assert len(ids) >= 1 and all(b" ago" in line for line in listed.stdout.splitlines())
    for rid in ids:
        done = ctl("exec", rid, "echo", "hi")
        assert (done.returncode, done.stdout) == (0, b"hi\n")
    assert ctl("kill", handle).returncode == 0
    for rid in ids:
        ctl("kill", rid)
    empty = ctl("list")
    assert (empty.returncode, empty.stdout) == (0, b"")
    assert empty.stderr.startswith(b"no sandboxes on http://127.0.0.1:")


def test_put_and_get_of_a_directory_tree(ctl, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tree = tmp_path / "tree"
    for n in range(40):
        path = tree / f"d{n % 4}" / f"sub{n % 3}" / f"file{n}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"content {n}\n".encode() * (n + 1))
    (tree / "empty").mkdir()
    (tree / "top.bin").write_bytes(os.urandom(70_000))
    handle = created(ctl)
    done = ctl("put", handle, str(tree), "proj")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")  # no bar off a terminal
    done = ctl("exec", "--cwd", "proj", handle, "sh", "-c", "find . -type f | wc -l; ls -d empty")
    assert done.stdout == b"41\nempty\n"
    back = tmp_path / "back"
    done = ctl("get", handle, "proj", str(back))
    assert done.returncode == 0, done.stderr

    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    assert files(back) == files(tree) and len(files(back)) == 41
    one = tmp_path / "one.txt"
    assert ctl("get", handle, "proj/d1/sub1/file1.txt", str(one)).returncode == 0
    assert one.read_bytes() == (tree / "d1" / "sub1" / "file1.txt").read_bytes()
    (tmp_path / "bare").mkdir()
    assert ctl("put", handle, str(tmp_path / "bare"), "bare").returncode == 0
    assert ctl("exec", handle, "ls", "-d", "bare").stdout == b"bare\n"  # an empty tree: made
    missing = ctl("get", handle, "nothing-here", str(tmp_path / "x"))
    assert missing.returncode == 1 and missing.stderr.startswith(b"sandboxctl: FileNotFoundError")
    assert ctl("kill", handle).returncode == 0


def test_help_and_usage_errors_need_no_service(ctl) -> None:  # type: ignore[no-untyped-def]
    done = ctl("--help")
    assert done.returncode == 0 and b"exec" in done.stdout and done.stderr == b""
    done = ctl("exec")
    assert done.returncode == 2 and done.stdout == b"" and b"usage:" in done.stderr


def test_ps_says_when_there_is_nothing_and_run_takes_the_command_without_a_separator(ctl) -> None:  # type: ignore[no-untyped-def]
    handle = created(ctl)
    empty = ctl("ps", handle)
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, b"", b"no background processes\n")
    started = ctl("run", "-d", handle, "--tag", "t", "sh", "-c", "echo hi -x")
    assert started.returncode == 0, started.stderr
    process = started.stdout.decode().strip()
    assert process and " " not in process, started.stdout  # the id alone, for P=$(...)
    assert started.stderr.decode().startswith("pid ")
    followed = ctl("logs", "-f", handle, process)
    assert (followed.returncode, followed.stdout) == (0, b"hi -x\n")
    assert ctl("kill", handle).returncode == 0


@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [(signal.SIGINT, 130, b"interrupted"), (signal.SIGTERM, 143, b"terminated")],
)
def test_ctrl_c_interrupts_an_exec_with_130(  # type: ignore[no-untyped-def]
    ctl, daemon: Daemon, tmp_path: Path, signum: int, code: int, said: bytes
) -> None:
    """Ctrl-C is 130, SIGTERM 143 (it used to read as the host being unreachable)."""
    handle = created(ctl)
    token = tmp_path / "token"  # the ctl fixture's
    env = {
        **coverage_env(),
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": REPO,
        "SANDBOXD_URL": daemon.url,
        "SANDBOXD_TOKEN_FILE": str(token),
    }
    # --timeout bounds the command on the host should the interrupt never come.
    argv = ["exec", "--timeout", "60", handle, "sh", "-c", "echo started; exec sleep 60"]
    running = subprocess.Popen(
        [sys.executable, "-m", "sandboxd_client.cli", *argv],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert running.stdout is not None and running.stdout.readline() == b"started\n"
        running.send_signal(signum)
        out, err = running.communicate(timeout=60)
    finally:
        if running.poll() is None:
            running.kill()
            running.wait(30)
    assert (running.returncode, out, err) == (code, b"", b"sandboxctl: " + said + b"\n")


def test_a_refused_token_names_the_setting_that_carries_it(ctl, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not the daemon's token")
    done = ctl("--token-file", str(wrong), "list")
    assert done.returncode == 1
    message = done.stderr.decode()
    assert message.startswith("sandboxctl: PermissionError"), message
    assert f"the token in {wrong} was refused" in message and "SANDBOXD_TOKEN_FILE" in message
    done = ctl("--token-file", "", "list")
    assert done.returncode == 1
    assert "no token was sent" in done.stderr.decode()
    assert "--token-file or SANDBOXD_TOKEN_FILE" in done.stderr.decode()


def test_fork_prints_a_new_handle_with_a_copy_of_the_files(ctl) -> None:  # type: ignore[no-untyped-def]
    source = created(ctl)
    assert ctl("exec", source, "sh", "-c", "echo copied > f").returncode == 0
    done = ctl("fork", source)
    assert done.returncode == 0, done.stderr
    fork = done.stdout.decode().strip()
    assert fork != source
    assert ctl("exec", fork, "cat", "f").stdout == b"copied\n"
    assert ctl("exec", fork, "sh", "-c", "echo mine > f").returncode == 0
    assert ctl("exec", source, "cat", "f").stdout == b"copied\n"
    done = ctl("--json", "fork", fork)
    assert done.returncode == 0 and done.stdout.startswith(b'{"handle": ')
    for handle in (source, fork):
        assert ctl("kill", handle).returncode == 0


def test_create_names_a_template_the_replica_cannot_run_in(ctl) -> None:  # type: ignore[no-untyped-def]
    done = ctl("create", "--template", "nope")
    assert done.returncode == 1
    assert b"no template named 'nope'" in done.stderr


def test_run_code_keeps_state_and_reads_stdin(ctl) -> None:  # type: ignore[no-untyped-def]
    handle = created(ctl)
    done = ctl("run-code", handle, "x = 20\nprint('hi')")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"hi\n", b"")
    done = ctl("run-code", handle, stdin=b"import sys\nprint('e', file=sys.stderr)\nx * 2\n")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"40\n", b"e\n")
    done = ctl("run-code", handle, "1/0")
    assert done.returncode == 1 and done.stderr.endswith(b"ZeroDivisionError: division by zero\n")
    done = ctl("run-code", "--json", handle, "x")
    result = json.loads(done.stdout)
    assert result["main_result"] == {"text/plain": "20"} and result["execution_count"] == 4
    done = ctl("run-code", handle, "x", "--context", result["context"])
    assert done.stdout == b"20\n"
    assert ctl("kill", handle).returncode == 0
