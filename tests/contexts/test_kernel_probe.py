"""The kernels' probe at start-up (docs/extensions.rst, "Contexts"): ``SANDBOXD_KERNEL_PYTHON``
asked in a thread while the daemon serves; what needs its answer waits for it.

A real daemon whose kernel python holds the probe until the test lets it go: every wait is
for an event (a file, an answer), bounded by a deadline only.
"""

import base64
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.process.test_contexts import main_text, run
from tests.support.daemon import (
    SLOW,
    Daemon,
    daemon_argv,
    daemon_environ,
    free_port,
    reachable_root,
    stop_daemon,
    unisolated_uids,
)

HELD_PROBE = """#!/bin/sh
# The kernels' probe (python3 -c PROBE MODULES...) waits for the test's release; the kernels
# themselves start at once.
case "$2" in *find_spec*)
  touch {held}/probing
  tries=0
  while [ ! -e {held}/release ] && [ "$tries" -lt 1200 ]; do sleep 0.05; tries=$((tries+1)); done
esac
exec /usr/bin/python3 "$@"
"""


def wait_for(what: str, ready: Callable[[], bool], daemon: Daemon) -> None:
    deadline = time.monotonic() + 30 * SLOW
    while not ready():
        if daemon.process.poll() is not None:
            raise AssertionError(f"daemon exited: {daemon.log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {30 * SLOW}s: {daemon.log.read_text()}")
        time.sleep(0.05)


def answers(daemon: Daemon, path: str) -> bool:
    try:
        return daemon.call("GET", path)[0] == 200
    except OSError:
        return False  # not listening yet


class Pending:
    """A call made in a thread of its own: :attr:`answer` once it returned."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.answer: Any = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        self.answer = call()

    def result(self) -> Any:
        self.thread.join(60 * SLOW)
        assert not self.thread.is_alive()
        return self.answer


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """A directory the sandbox's uid can read, with the kernel python that holds the probe."""
    place = reachable_root(tmp_path, "kernel")
    place.mkdir(exist_ok=True)
    place.chmod(0o755)
    python = place / "python3"
    python.write_text(HELD_PROBE.format(held=place))
    python.chmod(0o755)
    try:
        yield place
    finally:
        shutil.rmtree(place, ignore_errors=True)


def test_the_daemon_serves_while_the_probe_runs(tmp_path: Path, held: Path) -> None:
    port = free_port()
    args = ("--isolation=none", "--keepalive=1s", f"--kernel-python={held / 'python3'}")
    root = reachable_root(tmp_path)
    argv = daemon_argv(
        f"--listen=tcp:{port}:interface=127.0.0.1", f"--root={root}", *unisolated_uids(args), *args
    )
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=daemon_environ({})
        )
    daemon = Daemon(process, port, root, log)
    try:
        wait_for("the probe", (held / "probing").exists, daemon)
        # The probe is held: the daemon answers meanwhile (it did not, the probe blocking
        # its start), and serves a sandbox and its command.
        wait_for("an answer while the probe is held", lambda: answers(daemon, "/readyz"), daemon)
        rid = daemon.create()
        health = Pending(lambda: daemon.json("GET", "/healthz"))
        context = Pending(lambda: daemon.call("POST", f"/sandboxes/{rid}/contexts", {}))
        frames = daemon.call("POST", f"/sandboxes/{rid}/exec", {"cmd": ["echo", "served"]})[1]
        end = json.loads(frames.splitlines()[-1])
        assert (end["exit"], base64.b64decode(end["out"])) == (0, b"served\n")
        # What needs the probe's answer waits for it: the capabilities /healthz lists, a
        # context's create.
        assert health.thread.is_alive() and context.thread.is_alive()
        assert not (held / "release").exists()
        (held / "release").touch()
        assert "contexts" in health.result()["capabilities"]
        status, data = context.result()
        assert status == 200, data
        cid = json.loads(data)["id"]
        assert main_text(run(daemon, rid, cid, "6 * 7")) == "42"
    finally:
        (held / "release").touch()
        stop_daemon(daemon)
        if os.path.islink(tmp_path / "root"):
            shutil.rmtree(root, ignore_errors=True)
