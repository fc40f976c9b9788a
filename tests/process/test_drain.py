"""Graceful drain of a real daemon: SIGTERM and POST /drain with commands in flight."""

import base64
import http.client
import json
import signal
from pathlib import Path
from typing import Any

from tests.process.test_exec_stream import open_exec
from tests.support.daemon import start_daemon, stop_daemon


def read_frames(response) -> list[dict]:  # type: ignore[no-untyped-def]
    return [json.loads(line) for line in response.read().splitlines()]


def test_sigterm_lets_a_running_exec_finish_and_refuses_creates(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--isolation=none", "--drain-deadline=60s")
    try:
        rid = daemon.create()
        gate = tmp_path / "gate"
        script = (
            f"echo started; i=0; while [ ! -e {gate} ] && [ $i -lt 300 ]; "
            "do sleep 0.1; i=$((i+1)); done; echo finished"
        )
        response = open_exec(daemon, rid, {"cmd": ["sh", "-c", script]})
        assert json.loads(response.readline()) == {"o": base64.b64encode(b"started\n").decode()}
        daemon.process.send_signal(signal.SIGTERM)
        # Draining: new sandboxes are refused, existing ones keep answering.
        for _ in range(200):
            status, body = daemon.call("POST", "/sandboxes", {})
            if status == 503:
                break
        assert (status, json.loads(body)["error"]) == (503, "Draining")
        assert daemon.call("GET", "/readyz")[0] == 503
        assert daemon.call("PUT", f"/sandboxes/{rid}/file?path=x", raw=b"1")[0] == 204
        assert daemon.process.poll() is None
        gate.touch()
        rest = read_frames(response)
        assert rest[-1]["exit"] == 0
        assert base64.b64decode(rest[-1]["out"]) == b"started\nfinished\n"
        # twistd ends by re-raising the signal it stopped for: a clean stop, for systemd too.
        assert daemon.process.wait(30) in (0, -signal.SIGTERM)
        assert [p.name for p in daemon.root.iterdir()] == [".lock"]  # sandboxes removed
    finally:
        stop_daemon(daemon)


def test_drain_deadline_kills_a_command_that_never_ends(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--isolation=none", "--drain-deadline=1s")
    try:
        rid = daemon.create()
        response = open_exec(daemon, rid, {"cmd": ["sh", "-c", "echo up; exec sleep 1000"]})
        response.readline()
        status, _ = daemon.call("POST", "/drain")
        assert status == 204
        frames = read_frames(response)
        assert frames[-1]["exit"] == 128 + signal.SIGKILL  # complete final frame, not cut
        assert daemon.process.wait(30) == 0
    finally:
        stop_daemon(daemon)


def test_background_processes_do_not_hold_a_drain(tmp_path: Path) -> None:
    """A drain waits for running ``exec`` commands, not for background processes, printing
    or silent: with a deadline of ten minutes the daemon still stops at once, and their
    followers get their sandbox's end in band."""
    daemon = start_daemon(tmp_path, "--isolation=none", "--drain-deadline=600s")
    try:
        rid = daemon.create()
        followers = []
        for cmd in (["sh", "-c", "while :; do echo tick; sleep 0.1; done"], ["sleep", "600"]):
            begun = daemon.json("POST", f"/sandboxes/{rid}/processes", {"cmd": cmd})
            followers.append(
                open_output(daemon, f"/sandboxes/{rid}/processes/{begun['id']}/output")
            )
        assert daemon.call("POST", "/drain")[0] == 204
        for follower in followers:
            frames = read_frames(follower)
            assert frames[-1] == {"error": "SandboxNotFound", "detail": "the sandbox was killed"}
        assert daemon.process.wait(60) == 0
        assert [p.name for p in daemon.root.iterdir()] == [".lock"]
    finally:
        stop_daemon(daemon)


def open_output(daemon: Any, path: str) -> "http.client.HTTPResponse":
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    connection.request("GET", path + "?follow=true")
    response = connection.getresponse()
    assert response.status == 200
    return response
