"""``/tools/resolve`` and ``exec`` ``tools`` through a real daemon and a real artifact server
(both subprocesses: ``twistd -n sandboxd --isolation=none`` and ``python -m http.server``)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, free_port, start_daemon, stop_daemon
from tests.tools.tools_helpers import COMMANDS, GOOD, dead_url, manifest, sha256


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    """A static artifact server on 127.0.0.1; yields its base URL."""
    served = tmp_path / "store"
    (served / "greeter").mkdir(parents=True)
    (served / "greeter" / "tool.tar.gz").write_bytes(GOOD)
    (served / "greeter" / "manifest.json").write_bytes(manifest("tool.tar.gz", sha256(GOOD)))
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    process = subprocess.Popen(
        [*argv, "--directory", str(served)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(base + "/greeter/manifest.json", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield base
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = start_daemon(tmp_path, "--isolation=none", f"--tools-dir={tmp_path / 'tools'}")
    try:
        yield running
    finally:
        stop_daemon(running)


def last_frame(daemon: Daemon, rid: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, data = daemon.call("POST", f"/sandboxes/{rid}/exec", body)
    return status, json.loads(data.splitlines()[-1])


def test_a_resolved_tool_runs_in_a_sandbox_through_tools(daemon: Daemon, store: str) -> None:
    answer = daemon.json(
        "POST",
        "/tools/resolve",
        {"tools": {"greeter": store + "/greeter/manifest.json", "gone": dead_url()}},
    )
    sha = sha256(GOOD)
    assert answer["tools"] == {
        "greeter": {"sha": sha, "version": "1.0.0", "stale": False, "commands": COMMANDS}
    }
    assert "unreachable" in answer["refused"]["gone"]

    rid = daemon.create()
    status, frame = last_frame(daemon, rid, {"cmd": ["greet", "world"], "tools": [sha]})
    assert status == 200
    assert frame["exit"] == 0, frame
    assert base64.b64decode(frame["out"]) == b"hello from the tool: world\n"
    status, frame = last_frame(
        daemon, rid, {"cmd": ["sh", "-c", "command -v hello"], "tools": [sha]}
    )
    assert base64.b64decode(frame["out"]).decode().strip() == str(
        daemon.log.parent / "tools" / sha / "bin" / "hello"
    )
    # Without naming the tool, it is not on PATH.
    status, frame = last_frame(daemon, rid, {"cmd": ["greet", "world"]})
    assert frame["exit"] == 127


def test_exec_refuses_a_tool_that_is_not_installed(daemon: Daemon) -> None:
    rid = daemon.create()
    status, body = daemon.call(
        "POST", f"/sandboxes/{rid}/exec", {"cmd": ["true"], "tools": ["ab" * 32]}
    )
    assert status == 400
    assert json.loads(body)["error"] == "BadRequest"
    status, body = daemon.call("POST", f"/sandboxes/{rid}/exec", {"cmd": ["true"], "tools": ["x"]})
    assert status == 400


def test_resolve_refuses_a_malformed_body_and_lists_its_capability(daemon: Daemon) -> None:
    for body in ({}, {"tools": ["a"]}, {"tools": "x"}, {"tools": {str(i): "" for i in range(65)}}):
        status, data = daemon.call("POST", "/tools/resolve", body)
        assert status == 400, (body, data)
    assert "tools.resolve" in daemon.json("GET", "/healthz")["capabilities"]
    assert daemon.json("POST", "/tools/resolve", {"tools": {}}) == {"tools": {}, "refused": {}}
