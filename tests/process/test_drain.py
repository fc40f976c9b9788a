"""Graceful drain of a real daemon: SIGTERM and POST /drain with commands in flight."""

import base64
import http.client
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.process.test_exec_stream import open_exec
from tests.support.daemon import Daemon, start_daemon, stop_daemon


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
    """With no idle grace (the test daemons' ``SANDBOXD_DRAIN_IDLE=0s``) a drain waits for
    running ``exec`` commands, not for background processes, printing or silent: with a
    deadline of ten minutes the daemon still stops at once, and their
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


def listed(daemon: Daemon) -> set[str]:
    """The live sandboxes, read without touching any of them (a call is activity)."""
    return {s["remote_id"] for s in daemon.json("GET", "/sandboxes")["sandboxes"]}


def wait_for_log(daemon: Daemon, text: str) -> None:
    for _ in range(600):
        if text in daemon.log.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(daemon.log.read_text())


def test_a_sandbox_used_through_a_drain_keeps_working_and_an_idle_one_goes(
    tmp_path: Path,
) -> None:
    daemon = start_daemon(tmp_path, "--isolation=none", "--drain-deadline=60s", "--drain-idle=4s")
    try:
        used, idle = daemon.create(), daemon.create()
        assert daemon.call("POST", "/drain")[0] == 204
        uses = 0
        # A turn of an agent: exec, think for 2 s, exec again; the other sandbox is left alone.
        while idle in listed(daemon) or uses < 6:
            response = open_exec(daemon, used, {"cmd": ["echo", str(uses)]})
            assert read_frames(response)[-1]["exit"] == 0
            assert daemon.call("PUT", f"/sandboxes/{used}/file?path=n", raw=b"1")[0] == 204
            uses += 1
            if idle not in listed(daemon):
                assert used in listed(daemon)
            time.sleep(2)
        assert listed(daemon) == {used}  # in use for 12 s and more past the 4 s grace
        assert daemon.process.wait(30) == 0  # then left alone: it goes, and the daemon exits
        text = daemon.log.read_text()
        assert "(all idle): waited for 2 sandboxes, 2 went idle, 0 killed still in use" in text
    finally:
        stop_daemon(daemon)


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_second_signal_during_a_drain_stops_at_once(
    tmp_path: Path, second: signal.Signals
) -> None:
    daemon = start_daemon(tmp_path, "--isolation=none", "--drain-deadline=10m")
    try:
        rid = daemon.create()
        response = open_exec(daemon, rid, {"cmd": ["sh", "-c", "echo up; exec sleep 1000"]})
        response.readline()
        daemon.process.send_signal(signal.SIGTERM)
        wait_for_log(daemon, "draining: 1 sandboxes, 1 commands running")
        daemon.process.send_signal(second)
        assert read_frames(response)[-1]["exit"] == 128 + signal.SIGKILL
        assert daemon.process.wait(30) in (0, -signal.SIGTERM)  # long before the 10 min
        text = daemon.log.read_text()
        assert f"{second.name} during the drain: stopping at once (1 sandboxes killed)" in text
        assert "(stopped at once): waited for 1 sandboxes, 0 went idle, 1 killed" in text
        assert "Traceback" not in text and "ReactorNotRunning" not in text
        assert [p.name for p in daemon.root.iterdir()] == [".lock"]
    finally:
        stop_daemon(daemon)


def open_output(daemon: Any, path: str) -> "http.client.HTTPResponse":
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    connection.request("GET", path + "?follow=true")
    response = connection.getresponse()
    assert response.status == 200
    return response


def test_a_background_process_that_prints_keeps_its_sandbox_through_a_drain(
    tmp_path: Path,
) -> None:
    daemon = start_daemon(tmp_path, "--isolation=none", "--drain-deadline=15s", "--drain-idle=2s")
    try:
        printing, idle = daemon.create(), daemon.create()
        script = "while :; do echo tick; sleep 0.5; done"
        started = daemon.json(
            "POST", f"/sandboxes/{printing}/processes", {"cmd": ["sh", "-c", script]}
        )
        assert started["pid"] > 0
        assert daemon.call("POST", "/drain")[0] == 204
        while idle in listed(daemon):
            time.sleep(0.2)
        time.sleep(3)  # longer than the grace, no call: only the process's output
        assert listed(daemon) == {printing}
        assert daemon.process.wait(30) == 0
        text = daemon.log.read_text()
        assert (
            "(deadline passed): waited for 2 sandboxes, 1 went idle, 1 killed still in use" in text
        )
    finally:
        stop_daemon(daemon)
