"""Interpreter contexts over a real port (docs/extensions.rst, "Contexts"): a real daemon, a
real ipykernel from the host's python3, real cells.

Every wait is for an event (a frame, the end), bounded by the client's socket timeout only.
"""

import http.client
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, start_daemon, stop_daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = start_daemon(
        tmp_path, "--isolation=none", "--keepalive=1s", "--max-output=64K", "--contexts-max=2"
    )
    try:
        yield running
    finally:
        stop_daemon(running)


def run(daemon: Daemon, rid: str, cid: str, code: str, **fields: Any) -> list[dict[str, Any]]:
    status, data = daemon.call(
        "POST", f"/sandboxes/{rid}/contexts/{cid}/run", {"code": code, **fields}
    )
    assert status == 200, data
    frames = [json.loads(line) for line in data.splitlines()]
    assert frames[-1] == {"type": "end"}
    return [frame for frame in frames if frame]


def main_text(frames: list[dict[str, Any]]) -> str:
    [main] = [f for f in frames if f["type"] == "result" and f["is_main_result"]]
    return str(main["data"]["text/plain"])


def test_state_output_results_errors(daemon: Daemon) -> None:
    rid = daemon.create()
    context = daemon.json("POST", f"/sandboxes/{rid}/contexts", {})
    cid = context["id"]
    assert context["language"] == "python"
    assert context["cwd"].endswith(f"/{rid}/workspace")
    assert daemon.json("GET", f"/sandboxes/{rid}/contexts") == [context]

    assert run(daemon, rid, cid, "x = 41")[0] == {"type": "count", "execution_count": 1}
    assert main_text(run(daemon, rid, cid, "x + 1")) == "42"
    frames = run(
        daemon, rid, cid, "import os, sys; print(os.getcwd()); print('e', file=sys.stderr)"
    )
    assert {"type": "stdout", "text": context["cwd"] + "\n"} in frames
    assert {"type": "stderr", "text": "e\n"} in frames
    [error] = [f for f in run(daemon, rid, cid, "1/0") if f["type"] == "error"]
    assert error["name"] == "ZeroDivisionError"
    assert any("1/0" in line for line in error["traceback"])

    frames = run(daemon, rid, cid, "os.environ.get('ONLY_NOW')", env={"ONLY_NOW": "yes"})
    assert main_text(frames) == "'yes'"
    assert main_text(run(daemon, rid, cid, "repr(os.environ.get('ONLY_NOW'))")) == "'None'"


def test_timeout_kill_restart_remove(daemon: Daemon) -> None:
    rid = daemon.create()
    cid = daemon.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
    run(daemon, rid, cid, "kept = 1")
    [error] = [
        f for f in run(daemon, rid, cid, "while True: pass", timeout=1) if f["type"] == "error"
    ]
    assert error["name"] == "KeyboardInterrupt"
    assert main_text(run(daemon, rid, cid, "kept")) == "1"  # the interrupt kept the state

    [died] = [f for f in run(daemon, rid, cid, "import os; os._exit(3)") if f["type"] == "error"]
    assert died["name"] == "KernelDied"
    frames = run(daemon, rid, cid, "'kept' in dir()")
    assert main_text(frames) == "False"  # a fresh kernel

    run(daemon, rid, cid, "again = 2")
    assert daemon.json("POST", f"/sandboxes/{rid}/contexts/{cid}/restart", {})["id"] == cid
    assert main_text(run(daemon, rid, cid, "'again' in dir()")) == "False"

    second = daemon.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
    status, data = daemon.call("POST", f"/sandboxes/{rid}/contexts", {})
    assert status == 429, data
    assert daemon.call("DELETE", f"/sandboxes/{rid}/contexts/{second}")[0] == 204
    status, data = daemon.call("POST", f"/sandboxes/{rid}/contexts/{second}/run", {"code": "1"})
    assert status == 404
    assert json.loads(data)["error"] == "ContextNotFound"
    status, data = daemon.call("POST", f"/sandboxes/{rid}/contexts", {"language": "cobol"})
    assert status == 400, data


def test_output_is_bounded(daemon: Daemon) -> None:
    rid = daemon.create()
    cid = daemon.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
    frames = run(
        daemon,
        rid,
        cid,
        "import time\nfor i in range(40):\n    print('x' * 4000)\n    time.sleep(0.02)",
    )
    text = "".join(f["text"] for f in frames if f["type"] == "stdout")
    assert len(text) <= 64 * 1024
    assert any("SANDBOXD_MAX_OUTPUT" in f["text"] for f in frames if f["type"] == "stderr")


def test_a_dead_kernel_restarts_on_request(daemon: Daemon) -> None:
    rid = daemon.create()
    cid = daemon.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
    run(daemon, rid, cid, "import os; os._exit(1)")
    assert daemon.json("POST", f"/sandboxes/{rid}/contexts/{cid}/restart", {})["id"] == cid
    assert main_text(run(daemon, rid, cid, "6 * 7")) == "42"


def test_bad_bodies(daemon: Daemon) -> None:
    rid = daemon.create()
    cid = daemon.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
    creates: list[dict[str, Any]] = [{"language": 3}, {"cwd": ""}]
    for body in creates:
        assert daemon.call("POST", f"/sandboxes/{rid}/contexts", body)[0] == 400
    runs: list[dict[str, Any]] = [{}, {"code": "1", "timeout": 0}, {"code": "1", "timeout": True}]
    for body in runs:
        assert daemon.call("POST", f"/sandboxes/{rid}/contexts/{cid}/run", body)[0] == 400


BROKEN_KERNEL = """#!/bin/sh
# python3, but a kernel that fails to start once the sandbox has left the marker
if [ "$1" = -c ] && [ -e "$TMPDIR/no-kernel" ]; then echo "kernel refused" >&2; exit 3; fi
exec /usr/bin/python3 "$@"
"""


def test_a_kernel_that_cannot_start(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text(BROKEN_KERNEL)
    python.chmod(0o755)
    running = start_daemon(tmp_path, "--isolation=none", f"--kernel-python={python}")
    try:
        rid = running.create()
        cid = running.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
        frames = run(running, rid, cid, "import os; open(os.environ['TMPDIR'] + '/no-kernel', 'w')")
        assert not [f for f in frames if f["type"] == "error"]
        [died] = [f for f in run(running, rid, cid, "os._exit(1)") if f["type"] == "error"]
        assert died["name"] == "KernelDied"
        [again] = [f for f in run(running, rid, cid, "1") if f["type"] == "error"]
        assert again["name"] == "KernelDied"
        assert "kernel refused" in again["value"]
        status, data = running.call("POST", f"/sandboxes/{rid}/contexts", {})
        assert status == 501, data
        assert "kernel refused" in json.loads(data)["detail"]
        assert [c["id"] for c in running.json("GET", f"/sandboxes/{rid}/contexts")] == [cid]
    finally:
        stop_daemon(running)


def test_a_host_without_a_kernel(tmp_path: Path) -> None:
    running = start_daemon(tmp_path, "--isolation=none", "--kernel-python=/nonexistent/python3")
    try:
        assert "contexts" not in running.json("GET", "/healthz")["capabilities"]
        rid = running.create()
        status, data = running.call("POST", f"/sandboxes/{rid}/contexts", {})
        assert status == 501
        error = json.loads(data)
        assert error["error"] == "ContextsUnavailable"
        assert "/nonexistent/python3 cannot run" in error["detail"]
    finally:
        stop_daemon(running)


def test_a_root_too_long_for_a_socket(tmp_path: Path) -> None:
    root = Path("/tmp/sandboxd-tests") / ("r" * 90)
    running = start_daemon(tmp_path, "--isolation=none", f"--root={root}")
    try:
        assert "contexts" in running.json("GET", "/healthz")["capabilities"]
        rid = running.create()
        status, data = running.call("POST", f"/sandboxes/{rid}/contexts", {})
        assert status == 501, data
        assert "shorter SANDBOXD_ROOT" in json.loads(data)["detail"]
    finally:
        stop_daemon(running)
        shutil.rmtree(root, ignore_errors=True)  # made outside tmp_path: its own to remove


def test_removing_a_context_ends_what_runs_and_waits_in_it(daemon: Daemon) -> None:
    rid = daemon.create()
    cid = daemon.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    body = json.dumps({"code": "print('started', flush=True)\nwhile True: pass"})
    connection.request("POST", f"/sandboxes/{rid}/contexts/{cid}/run", body)
    response = connection.getresponse()
    running: list[dict[str, Any]] = []
    while not any(f.get("text") == "started\n" for f in running):  # the cell runs
        running.append(json.loads(response.readline()))
    queued: list[dict[str, Any]] = []
    waiting = threading.Thread(target=lambda: queued.extend(run(daemon, rid, cid, "1")))
    waiting.start()
    time.sleep(0.5)  # the second request is in, waiting its turn (only the order matters)
    assert daemon.call("DELETE", f"/sandboxes/{rid}/contexts/{cid}")[0] == 204
    running.extend(json.loads(line) for line in response.read().splitlines())
    waiting.join(30)
    assert [f["name"] for f in running if f.get("type") == "error"] == ["KernelDied"]
    assert [f["name"] for f in queued if f["type"] == "error"] == ["ContextRemoved"]


def test_a_run_whose_client_went_while_it_waited_never_runs(daemon: Daemon) -> None:
    rid = daemon.create()
    cid = daemon.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
    path = f"/sandboxes/{rid}/contexts/{cid}/run"
    busy = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    busy.request("POST", path, json.dumps({"code": "print('started', flush=True)\nwhile 1: pass"}))
    response = busy.getresponse()
    while b"started" not in response.readline():  # the cell runs and holds the queue
        pass
    waiting = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    waiting.request("POST", path, json.dumps({"code": "ran_second = True"}))
    time.sleep(0.5)  # the second request is in, waiting its turn (only the order matters)
    waiting.close()  # its client goes while it waits
    busy.close()  # the first is interrupted: the queue moves on
    frames = run(daemon, rid, cid, "'ran_second' in dir()")
    assert main_text(frames) == "False"


def test_what_a_child_process_prints_reaches_its_own_cell(daemon: Daemon) -> None:
    """Every byte a child wrote to the kernel's descriptor before its cell ended is in that
    cell's output: a flush waits until the pipe's thread has it
    (sandboxd/core/contexts/kernel_tuning.py), cell after cell, small writes and large."""
    rid = daemon.create()
    cid = daemon.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
    for i in range(30):
        size = 1 + 30_000 * (i % 3)  # (under the fixture's --max-output)
        code = f"import os; os.system('head -c {size} /dev/zero | tr -c x x; echo child-{i}')"
        frames = run(daemon, rid, cid, code)
        said = "".join(f["text"] for f in frames if f["type"] == "stdout")
        assert said == "x" * size + f"child-{i}\n", (i, len(said), said[-20:])


SHADOW = b"raise SystemExit('a module of the working directory was imported')\n"


def test_modules_of_the_working_directory_never_shadow_the_kernels(daemon: Daemon) -> None:
    """The kernel loads with its working directory off ``sys.path`` (as ipykernel_launcher
    does); the cells then import from it as usual."""
    rid = daemon.create()
    files = {f"{name}.py": SHADOW for name in ("struct", "fcntl", "ipykernel")}
    files["mine.py"] = b"value = 7\n"
    for path, text in files.items():
        status, data = daemon.call("PUT", f"/sandboxes/{rid}/file?path={path}", raw=text)
        assert status in (200, 201, 204), data
    cid = daemon.json("POST", f"/sandboxes/{rid}/contexts", {})["id"]
    assert main_text(run(daemon, rid, cid, "import mine; mine.value")) == "7"
