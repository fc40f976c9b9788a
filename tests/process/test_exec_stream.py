"""exec against a real daemon over a real TCP port: streaming, timeouts, disconnects, memory."""

import base64
import http.client
import json
import time
from pathlib import Path
from typing import Any

from tests.support.daemon import Daemon


def open_exec(daemon: Daemon, rid: str, body: dict[str, Any]) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    connection.request("POST", f"/sandboxes/{rid}/exec", json.dumps(body))
    response = connection.getresponse()
    assert response.status == 200
    assert response.getheader("content-type") == "application/x-ndjson"
    return response


def frames(response: http.client.HTTPResponse) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.read().splitlines()]


def wait_gone(pid: int, seconds: float = 20.0) -> bool:
    """Whether the process ``pid`` has disappeared (or is a zombie) within a bound."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_output_is_streamed_before_the_command_ends(daemon: Daemon, tmp_path: Path) -> None:
    """The first chunk arrives while the command is still blocked waiting for the test."""
    rid = daemon.create()
    gate = tmp_path / "gate"
    script = (
        f"echo first; i=0; while [ ! -e {gate} ] && [ $i -lt 300 ]; "
        "do sleep 0.1; i=$((i+1)); done; echo second"
    )
    response = open_exec(daemon, rid, {"cmd": ["sh", "-c", script]})
    first = json.loads(response.readline())
    while first == {"o": ""}:
        first = json.loads(response.readline())
    assert base64.b64decode(first["o"]) == b"first\n"
    gate.touch()  # only now may the command finish
    rest = frames(response)
    assert rest[-1]["exit"] == 0
    assert base64.b64decode(rest[-1]["out"]) == b"first\nsecond\n"


def test_final_frame_keeps_stdout_and_stderr_apart(daemon: Daemon) -> None:
    rid = daemon.create()
    response = open_exec(
        daemon, rid, {"cmd": ["sh", "-c", "echo out1; echo err1 >&2; echo out2; exit 7"]}
    )
    got = frames(response)
    final = got[-1]
    assert final["exit"] == 7
    assert base64.b64decode(final["out"]) == b"out1\nout2\n"
    assert base64.b64decode(final["err"]) == b"err1\n"
    live = b"".join(base64.b64decode(f["o"]) for f in got[:-1])
    assert sorted(live.splitlines()) == [b"err1", b"out1", b"out2"]


def test_timeout_gives_124_and_kills_the_process_group(daemon: Daemon) -> None:
    rid = daemon.create()
    response = open_exec(
        daemon, rid, {"cmd": ["sh", "-c", "sleep 1000 & echo $!; sleep 1000"], "timeout": 1}
    )
    got = frames(response)
    assert got[-1]["exit"] == 124
    pid = int(base64.b64decode(got[-1]["out"]).split()[0])
    assert wait_gone(pid)


def test_disconnecting_client_kills_the_process_group(daemon: Daemon) -> None:
    rid = daemon.create()
    response = open_exec(daemon, rid, {"cmd": ["sh", "-c", "sleep 1000 & echo $! $$; wait"]})
    line = json.loads(response.readline())
    while line == {"o": ""}:
        line = json.loads(response.readline())
    child, shell = (int(x) for x in base64.b64decode(line["o"]).split())
    response.close()  # the client goes away mid-exec
    assert wait_gone(child)
    assert wait_gone(shell)
    # The daemon keeps serving.
    assert daemon.call("GET", f"/sandboxes/{rid}/ready")[0] == 200


def test_keepalive_frames_while_silent(daemon: Daemon) -> None:
    rid = daemon.create()
    got = frames(open_exec(daemon, rid, {"cmd": ["sleep", "2.5"]}))
    assert {"o": ""} in got[:-1]
    assert got[-1]["exit"] == 0


def test_large_output_keeps_daemon_memory_bounded(daemon: Daemon) -> None:
    """300 MiB of output read slowly: the daemon's peak RSS grows by far less than that."""
    rid = daemon.create()
    baseline = daemon.rss_kib("VmHWM")
    response = open_exec(daemon, rid, {"cmd": ["head", "-c", str(300 << 20), "/dev/zero"]})
    received = 0
    final: dict[str, Any] = {}
    slow_until = 20 << 20
    while True:
        line = response.readline()
        if not line:
            break
        frame = json.loads(line)
        if "o" in frame:
            received += len(base64.b64decode(frame["o"]))
            if received < slow_until:
                time.sleep(0.001)  # a slow reader for the first part
        else:
            final = frame
    assert received == 300 << 20
    assert final["exit"] == 0
    assert final["truncated"] is True
    assert len(base64.b64decode(final["out"])) == 1 << 20  # --max-output=1M
    growth_mib = (daemon.rss_kib("VmHWM") - baseline) / 1024
    assert growth_mib < 64, f"daemon peak RSS grew by {growth_mib:.0f} MiB"


def test_a_slow_reader_gets_the_whole_final_frame(daemon: Daemon) -> None:
    """The final frame (1 MiB kept: 1.4 MB of base64) is written as the client takes it, after
    more output than the socket buffers hold (the connection is paused when it comes)."""
    rid = daemon.create()
    size = 16 << 20
    response = open_exec(daemon, rid, {"cmd": ["head", "-c", str(size), "/dev/zero"]})
    body = bytearray()
    while chunk := response.read(64 << 10):
        body += chunk
        time.sleep(0.001)  # a slow reader, the final frame included
    got = [json.loads(line) for line in bytes(body).splitlines()]
    assert sum(len(base64.b64decode(f["o"])) for f in got[:-1]) == size
    assert got[-1]["exit"] == 0 and got[-1]["truncated"] is True
    assert base64.b64decode(got[-1]["out"]) == bytes(1 << 20)


def test_command_never_sees_the_daemon_environment(daemon: Daemon) -> None:
    rid = daemon.create()
    final = frames(open_exec(daemon, rid, {"cmd": ["env"], "env": {"EXTRA": "1"}}))[-1]
    names = {line.split(b"=", 1)[0] for line in base64.b64decode(final["out"]).splitlines()}
    assert names <= {b"PATH", b"HOME", b"TMPDIR", b"LANG", b"TERM", b"PWD", b"EXTRA", b"SHLVL"}
    assert b"PYTHONPATH" not in names  # the daemon was started with it (see conftest)
