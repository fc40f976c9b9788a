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


def gone(pid: int, within: float = 10 * SLOW) -> bool:
    """Whether ``pid`` ends within ``within`` seconds (a zombie waiting for its reaper has)."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + within
    while True:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


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


def left_running(daemon: Daemon, rid: str, cid: str) -> int:
    """The pid of a sleep a cell leaves running in the background."""
    return int(texts(run(daemon, rid, cid, "sleep 600 & echo $!"), "stdout"))


def test_what_a_cell_left_running_dies_with_its_kernel(daemon: Daemon) -> None:
    """Restarting or removing the context, or its kernel dying mid-cell, ends what its cells
    left running (it lived until the sandbox ended)."""
    rid = daemon.create()
    context = daemon.json("POST", f"/sandboxes/{rid}/contexts", {"language": "bash"})
    cid = context["id"]
    sleeper = left_running(daemon, rid, cid)
    assert not gone(sleeper, within=0)
    daemon.json("POST", f"/sandboxes/{rid}/contexts/{cid}/restart")
    assert gone(sleeper)

    # The kernel killed while a cell runs in the foreground: the group goes with it.
    pid_file = Path(context["cwd"]) / "sleeper"
    cell = f"sleep 600 & echo $! > {pid_file}; kill -KILL $PPID; sleep 600"
    [(name, _)] = errors(run(daemon, rid, cid, cell))
    assert name == "KernelDied"
    assert gone(int(pid_file.read_text()))

    sleeper = left_running(daemon, rid, cid)  # in the fresh kernel
    assert daemon.call("DELETE", f"/sandboxes/{rid}/contexts/{cid}")[0] == 204
    assert gone(sleeper)
