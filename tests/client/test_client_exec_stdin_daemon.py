"""``sandboxctl exec`` stdin streamed to a real daemon, as ``docker exec -i`` streams it: a
pipe or a file is sent without ``-i``, as it comes (a line arrives before EOF), with the
memory of the CLI and of the daemon flat whatever its length; ``-t`` says terminals come later.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.coverage import coverage_env

from .real_daemon import Daemon, running_daemon

REPO = str(Path(__file__).resolve().parents[2])
TOKEN = "stdin-daemon-token"
MIB = 1 << 20
RSS_GROWTH_MAX = 50 * MIB
BIG = 300 * MIB
ECHO_WAIT = 60.0
"""Seconds the echo of a first line may take (a hang guard, not a timing)."""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("daemon"), TOKEN) as running:
        yield running


@pytest.fixture
def env(daemon: Daemon, tmp_path: Path) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    return {
        **coverage_env(),
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": REPO,
        "SANDBOXD_URL": daemon.url,
        "SANDBOXD_TOKEN_FILE": str(token),
    }


def ctl_argv(*argv: str) -> list[str]:
    return [sys.executable, "-m", "sandboxd_client.cli", *argv]


@pytest.fixture
def handle(env: dict[str, str]) -> Iterator[str]:
    made = subprocess.run(ctl_argv("create"), env=env, capture_output=True, timeout=60)
    assert made.returncode == 0, made.stderr
    handle = made.stdout.decode().strip()
    yield handle
    subprocess.run(ctl_argv("kill", handle), env=env, capture_output=True, timeout=60)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_pipe_is_sent_without_dash_i(env: dict[str, str], handle: str) -> None:
    done = subprocess.run(
        ctl_argv("exec", handle, "wc", "-l"), env=env, input=b"a\nb\n", capture_output=True
    )
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, b"2", b"")
    done = subprocess.run(
        ctl_argv("exec", handle, "sh", "-c", "cat; echo err >&2; exit 3"),
        env=env,
        input=b"through\n",
        capture_output=True,
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, b"through\n", b"err\n")
    done = subprocess.run(
        ctl_argv("--json", "exec", handle, "cat"), env=env, input=b"x", capture_output=True
    )
    assert done.stdout == (b'{"exit_code": 0, "stderr": "", "stdout": "x", "truncated": false}\n')


def test_a_file_is_sent_and_a_command_that_reads_nothing_ends(
    env: dict[str, str], handle: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.write_bytes(b"line\n" * 1000)
    with open(data, "rb") as f:
        done = subprocess.run(
            ctl_argv("exec", handle, "wc", "-c"), env=env, stdin=f, capture_output=True
        )
    assert done.stdout.strip() == b"5000"
    with subprocess.Popen(["yes"], stdout=subprocess.PIPE) as yes:
        done = subprocess.run(
            ctl_argv("exec", handle, "true"), env=env, stdin=yes.stdout, capture_output=True,
            timeout=120,
        )  # fmt: skip
        yes.kill()
    assert (done.returncode, done.stderr) == (0, b"")


def test_dash_t_says_terminals_come_later(env: dict[str, str], handle: str) -> None:
    done = subprocess.run(ctl_argv("exec", "-t", handle, "sh"), env=env, capture_output=True)
    assert done.returncode == 2
    assert b"terminals (a PTY) come in a later release" in done.stderr


def test_a_line_arrives_before_eof(env: dict[str, str], handle: str) -> None:
    script = "read first; echo got:$first; cat >/dev/null; echo eof"
    process = subprocess.Popen(
        ctl_argv("exec", handle, "sh", "-c", script),
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(b"hello\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], ECHO_WAIT)
        assert ready, "the first line's echo did not come while stdin was open"
        assert process.stdout.readline() == b"got:hello\n"
        assert process.poll() is None  # stdin still open: the command still waits
        process.stdin.close()
        assert process.stdout.read() == b"eof\n"
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_300_mib_through_wc_with_the_cli_and_the_daemon_flat(
    env: dict[str, str], handle: str, daemon: Daemon
) -> None:
    daemon_before = rss(daemon.pid)
    producer = subprocess.Popen(["sh", "-c", f"yes | head -c {BIG}"], stdout=subprocess.PIPE)
    cli = subprocess.Popen(
        ctl_argv("exec", handle, "wc", "-c"),
        env=env,
        stdin=producer.stdout,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert producer.stdout is not None
    producer.stdout.close()
    peaks = {"cli": 0, "daemon": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                peaks["cli"] = max(peaks["cli"], rss(cli.pid))
                peaks["daemon"] = max(peaks["daemon"], rss(daemon.pid))
            except (OSError, AssertionError):
                pass  # the CLI just exited
            time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        out, err = cli.communicate(timeout=600)
    finally:
        done.set()
        sampler.join()
        producer.wait(60)
    assert (cli.returncode, out.strip(), err) == (0, str(BIG).encode(), b"")
    assert peaks["daemon"] - daemon_before < RSS_GROWTH_MAX, peaks
    assert peaks["cli"] < 150 * MIB, peaks  # an interpreter with Twisted: ~60 MiB; no stdin
