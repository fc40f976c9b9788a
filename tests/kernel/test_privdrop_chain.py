"""Real-kernel suite: every process the daemon starts as a sandbox's uid is filtered, and the
daemon's own work cannot be taken over by the sandbox (issue 29, "A process of the sandbox
without the filter"; docs/isolation.rst, "The privilege-drop chain").

A real daemon as root, with real isolation and an archive. The places it starts a process as a
sandbox (listed by ``tests/unit/test_unit_privdrop_sites.py``) are tried one by one: an exec, a
background process, and the archive's rsync end. For the rsync end a process of the sandbox
plays the attacker (``rsync_end_probe.py``): it catches the end while a persist runs, reads its
``/proc/PID/status`` and tries ``PTRACE_ATTACH`` on it. Before the one chain, the rsync end ran
without the filter (``Seccomp: 0``) and the attach worked: from there the sandbox could make the
system calls its filter refuses it (user namespaces, io_uring, keyrings).
"""

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kernel.kernel_http import SLOW, Box, KernelDaemon, isolation_problem, wait_for

WHY_NOT = isolation_problem()
pytestmark = [pytest.mark.kernel, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

PROBE = Path(__file__).with_name("rsync_end_probe.py")
FILES, FILE_MIB = 48, 1
"""The workspace a persist copies: enough for the probe to catch the rsync end at work."""


@pytest.fixture(scope="module")
def archived(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KernelDaemon, Box]]:
    """A daemon with an archive (``{its tmp}/archive``) and one sandbox of an item."""
    top = tmp_path_factory.mktemp("privdrop")
    kd = KernelDaemon.start(
        top, "--memory-max=256M", "--pids-max=128", f"--archive-root={top / 'archive'}"
    )
    try:
        answer = kd.call("POST", "/sandboxes", {"item_id": "privdrop-item"})
        assert answer.status == 200, answer
        box = Box(kd, str(answer.json()["remote_id"]))
        kd.rids.append(box.rid)
        yield kd, box
    finally:
        kd.stop()


def filter_lines(text: str) -> dict[str, str]:
    """``Seccomp`` and ``NoNewPrivs`` of a ``/proc/PID/status`` text."""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {name: fields[name].strip() for name in ("Seccomp", "NoNewPrivs")}


FILTERED = {"Seccomp": "2", "NoNewPrivs": "1"}


def test_an_exec_runs_filtered(archived: tuple[KernelDaemon, Box]) -> None:
    _, box = archived
    assert filter_lines(box.ok("cat /proc/self/status")) == FILTERED


def test_a_background_process_runs_filtered(archived: tuple[KernelDaemon, Box]) -> None:
    kd, box = archived
    body = {"cmd": ["sh", "-c", "cat /proc/self/status > background-status"]}
    answer = kd.call("POST", box.url("processes"), body)
    assert answer.status == 200, answer
    written = box.workspace / "background-status"
    assert wait_for(lambda: b"Seccomp" in written.read_bytes() if written.exists() else False, 10)
    assert filter_lines(written.read_text()) == FILTERED


def test_the_archives_rsync_end_runs_filtered_and_the_sandbox_cannot_ptrace_it(
    archived: tuple[KernelDaemon, Box],
) -> None:
    kd, box = archived
    assert box.upload("probe.py", PROBE.read_bytes()).status == 204
    box.ok(
        f"mkdir data && for i in $(seq {FILES}); do head -c {FILE_MIB}M /dev/urandom"
        " > data/f$i; done"
    )
    uid = box.uid()
    seen: list[Any] = []
    probe = threading.Thread(
        target=lambda: seen.append(box.exec(["python3", "probe.py", "probing", "60"], 90))
    )
    probe.start()
    try:
        assert wait_for((box.workspace / "probing").exists, 30 * SLOW)
        persisted: list[int] = []
        started = time.monotonic()
        while not seen and time.monotonic() - started < 60 * SLOW:
            answer = kd.call("POST", box.url("persist"), {"delete": True}, timeout=180)
            persisted.append(answer.status)
    finally:
        probe.join(120)
    (result,) = seen
    assert result.exit == 0, result
    caught = json.loads(result.out)
    assert caught["found"], "the probe never saw the rsync end"
    assert caught["uid"] == uid, caught
    filtered = (caught["seccomp"], caught["no_new_privs"], caught["ptrace"])
    assert filtered == ("2", "1", "EPERM"), json.dumps(caught)
    assert set(persisted) == {204}, persisted  # the copies themselves went through
    stored = kd.daemon.log.parent / "archive" / "privdrop-item" / "data" / "f1"
    assert stored.stat().st_size == FILE_MIB << 20
