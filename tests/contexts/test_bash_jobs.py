"""What a bash context leaves running in the background (docs/extensions.rst, "Contexts"): a
real daemon, the bash kernel on the host's python3 and bash, real cells.

Every wait is for an event (a frame, the end, a process gone), bounded by a deadline only.
"""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process.test_contexts import run
from tests.process.test_contexts_bash import errors, texts
from tests.support.daemon import SLOW, Daemon, start_daemon, stop_daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = start_daemon(tmp_path, "--isolation=none", "--keepalive=1s")
    try:
        yield running
    finally:
        stop_daemon(running)


def gone(pid: int) -> bool:
    """Whether ``pid`` ends within the deadline (a zombie waiting for its reaper has)."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + 10 * SLOW
    while time.monotonic() < deadline:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_exit_leaving_a_job_behind_answers_at_once(daemon: Daemon) -> None:
    """``sleep & exit``: the sleep holds bash's pipes open; the cell still ends when bash
    does (it hung until its timeout), as ``exit`` alone does, with a new shell after it."""
    rid = daemon.create()
    cid = daemon.json("POST", f"/sandboxes/{rid}/contexts", {"language": "bash"})["id"]
    run(daemon, rid, cid, "kept=1")
    started = time.monotonic()
    frames = run(daemon, rid, cid, "echo before; sleep 600 & echo $!; exit", timeout=30)
    assert time.monotonic() - started < 20 * SLOW
    [(name, _)] = errors(frames)
    assert name == "ShellExited"
    before, sleeper = texts(frames, "stdout").splitlines()
    assert before == "before"
    assert gone(int(sleeper))  # with its shell
    assert texts(run(daemon, rid, cid, 'echo "[$kept]"'), "stdout") == "[]\n"  # a new shell
