"""Auth (docs/extensions.rst, "Auth"): the bearer token, its file, and a sandbox that attacks the
API.

Every test runs real ``twistd -n sandboxd`` daemons over real TCP.
"""

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.boot import read_token
from sandboxd.config import ConfigError
from tests.security.live_daemon import (
    PENDING,
    PUBLIC,
    call,
    create,
    documented_operations,
    exec_frames,
    fill,
    listening_on_all_interfaces,
    new_token,
    own_address,
    refused_start,
    running,
    snapshot,
    start_daemon,
    stop_daemon,
    write_token,
)

NOBODY = 65534


def operations() -> list[tuple[str, str]]:
    return sorted(documented_operations() - set(PENDING))


def bodies(method: str, path: str) -> Any:
    """A valid body for each operation, so a 401 is the token's doing and nothing else's."""
    if path.endswith("/exec"):
        return {"cmd": ["touch", "pwned"]}
    if path.endswith("/mkdir"):
        return {"path": "pwned"}
    if path.endswith("/rename"):
        return {"src": "victim.txt", "dst": "pwned"}
    if path.endswith("/persist"):
        return {"delete": True}
    if path == "/sandboxes" and method == "POST":
        return {}
    return None


# The token file


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o606, 0o610, 0o601])
def test_a_token_file_others_can_reach_stops_start_up(tmp_path: Path, mode: int) -> None:
    token_file = write_token(tmp_path / "token", "t0ken-value", mode)
    status, output = refused_start(tmp_path, "--isolation=none", f"--token-file={token_file}")
    assert status != 0
    last = output.strip().splitlines()[-1]
    assert "SANDBOXD_TOKEN_FILE" in last and f"{mode:04o}" in last, output
    assert "t0ken-value" not in output


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_token_file_root_does_not_own_stops_start_up(tmp_path: Path) -> None:
    token_file = write_token(tmp_path / "token", "t0ken-value")
    os.chown(token_file, NOBODY, NOBODY)
    status, output = refused_start(tmp_path, "--isolation=none", f"--token-file={token_file}")
    assert status != 0
    last = output.strip().splitlines()[-1]
    assert "SANDBOXD_TOKEN_FILE" in last and f"uid {NOBODY}" in last and "root" in last, output
    assert "t0ken-value" not in output


@pytest.mark.parametrize("kind", ["missing", "empty", "directory", "fifo"])
def test_an_unusable_token_file_stops_start_up(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "token"
    if kind == "empty":
        write_token(path, "")
    elif kind == "directory":
        path.mkdir(mode=0o700)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    status, output = refused_start(tmp_path, "--isolation=none", f"--token-file={path}")
    assert status != 0
    last = output.strip().splitlines()[-1]
    assert "start-up failed at token" in last, output


def test_the_owner_rule_follows_the_daemons_own_user(tmp_path: Path) -> None:
    """Root needs a root-owned file; any other user a file of its own (checked on the opened
    file, so the file checked is the file read)."""
    path = write_token(tmp_path / "token", "t0ken-value", 0o400)
    mine = os.stat(path).st_uid
    other = NOBODY if mine != NOBODY else mine + 1
    assert read_token(str(path), euid=mine) == b"t0ken-value"
    with pytest.raises(ConfigError, match=rf"owned by uid {mine}, not by the daemon's user"):
        read_token(str(path), euid=other)
    if mine != 0:
        with pytest.raises(ConfigError, match=rf"owned by uid {mine}, not by root"):
            read_token(str(path), euid=0)
    link = tmp_path / "link"
    link.symlink_to(path)  # a Kubernetes secret volume: the checks apply to the target
    assert read_token(str(link), euid=mine) == b"t0ken-value"


def _runs_as_nobody(tmp_path: Path) -> bool:
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import twisted, klein, sandboxd"],
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            capture_output=True,
            cwd="/",
            env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        )
    except OSError:
        return False
    return probe.returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a daemon as another user")
def test_a_daemon_not_run_as_root_needs_its_own_token_file(tmp_path: Path) -> None:
    if not _runs_as_nobody(tmp_path):
        pytest.skip("the Python environment is not readable by an unprivileged user")
    tmp_path.chmod(0o755)
    token_file = write_token(tmp_path / "token", "t0ken-value")  # root's: nobody cannot use it
    status, output = refused_start(
        tmp_path, "--isolation=none", f"--token-file={token_file}", user=NOBODY
    )
    assert status != 0 and "start-up failed at token" in output.strip().splitlines()[-1]
    os.chown(token_file, NOBODY, NOBODY)
    os.chmod(token_file, 0o640)
    status, output = refused_start(
        tmp_path, "--isolation=none", f"--token-file={token_file}", user=NOBODY
    )
    assert status != 0 and "0640" in output.strip().splitlines()[-1], output


# What the daemon says about auth


def test_without_a_token_the_daemon_says_so_loudly(open_daemon: Any) -> None:
    health = call(open_daemon, "GET", "/healthz").json()
    assert "auth.none" in health["capabilities"]
    assert "auth.bearer" not in health["capabilities"]
    warnings = [
        line
        for line in open_daemon.log.read_text().splitlines()
        if "#warn]" in line and "SANDBOXD_TOKEN_FILE" in line
    ]
    assert warnings, open_daemon.log.read_text()
    assert call(open_daemon, "POST", "/sandboxes", {}).status == 200  # wire compatibility


def test_with_a_token_healthz_says_bearer(authed: Any) -> None:
    health = call(authed, "GET", "/healthz").json()
    assert "auth.bearer" in health["capabilities"]
    assert "auth.none" not in health["capabilities"]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_token_never_reaches_the_log(
    tmp_path: Path, token: str, token_file: Path, log_format: str
) -> None:
    daemon = start_daemon(
        tmp_path, "--isolation=none", f"--token-file={token_file}", f"--log-format={log_format}"
    )
    try:
        rid = create(daemon, token)
        call(daemon, "GET", f"/sandboxes/{rid}/walk", token=token)
        call(daemon, "GET", f"/sandboxes/{rid}/walk", token=token + "x")
        call(daemon, "GET", f"/sandboxes/{rid}/walk", headers={"Authorization": token})
        status, frames = exec_frames(daemon, rid, {"cmd": ["true"]}, token)
        assert status == 200 and frames[-1]["exit"] == 0
    finally:
        stop_daemon(daemon)
    log = daemon.log.read_text()
    assert token not in log
    assert token[4:20] not in log  # not even a part of it
    assert "<set>" in log  # the effective configuration is logged, the secret redacted


# Every route needs the token


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    """One token daemon for the per-route tests (each leaves it as it found it)."""
    tmp_path = tmp_path_factory.mktemp("shared")
    token = new_token()
    token_file = write_token(tmp_path / "token", token)
    with running(tmp_path, "--isolation=none", f"--token-file={token_file}") as daemon:
        yield daemon, token


@pytest.mark.parametrize(("method", "path"), operations())
def test_every_route_but_health_needs_the_token(
    shared: tuple[Any, str], method: str, path: str
) -> None:
    authed, token = shared
    rid = create(authed, token)
    assert call(authed, "PUT", fill("/sandboxes/{rid}/file", rid, "victim.txt"), raw=b"v",
                token=token).status == 204  # fmt: skip
    before = snapshot(authed, token)
    target = fill(path, rid, "victim.txt")
    attempts: list[dict[str, str]] = [
        {},
        {"Authorization": f"Bearer {token}x"},
        {"Authorization": f"Bearer {token[:-1]}"},
        {"Authorization": "Bearer "},
        {"Authorization": token},
        {"Authorization": f"bearer {token}"},
        {"Authorization": f"Bearer  {token}"},
        {"Authorization": f"Basic {token}"},
        {"X-API-Key": token},
        {"Cookie": f"token={token}"},
    ]
    for headers in attempts:
        reply = call(authed, method, target, bodies(method, path), headers=headers)
        if (method, path) in PUBLIC:
            assert reply.status in (200, 503), (headers, reply)
        else:
            assert reply.status == 401, (headers, reply)
            assert reply.error() == "Unauthorized"
            assert reply.headers["WWW-Authenticate"] == 'Bearer realm="sandboxd"'
            assert token not in reply.body.decode(errors="replace")
    reply = call(authed, method, target + ("&" if "?" in target else "?") + f"token={token}")
    assert reply.status in ((200, 503) if (method, path) in PUBLIC else (401,)), reply
    assert snapshot(authed, token) == before


def test_the_right_token_passes(authed: Any, token: str) -> None:
    rid = create(authed, token)
    status, frames = exec_frames(authed, rid, {"cmd": ["echo", "hi"]}, token)
    assert status == 200 and frames[-1]["exit"] == 0


# A sandbox attacking the API


ATTACK = r"""
import json, os, sys, urllib.request, urllib.error
bases, victim, own, ops = json.loads(sys.argv[1])
results = []
for base in bases:
    for method, path in ops:
        for rid in (victim, own):
            url = base + path.replace("{rid}", rid)
            if path.endswith(("/file", "/exists", "/size", "/dir")):
                url += "?path=victim.txt"
            data = None
            if method in ("POST", "PUT"):
                data = json.dumps({"cmd": ["touch", "/tmp/pwned"], "path": "pwned",
                                   "src": "victim.txt", "dst": "pwned", "delete": True}).encode()
            # No token; then, on the first address and for the victim, anything token-like
            # the sandbox can find in its environment (each guess costs a paced 401, and
            # where it asks makes no difference to the token check).
            guesses = os.environ.values() if (base, rid) == (bases[0], victim) else ()
            for guess in [None, *guesses]:
                headers = {} if guess is None else {"Authorization": "Bearer " + guess}
                request = urllib.request.Request(url, data=data, method=method, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        status = response.status
                except urllib.error.HTTPError as e:
                    status = e.code
                except OSError as e:
                    status = "unreachable: " + str(e)
                results.append([base, method, path, rid, status])
print(json.dumps(results))
"""


def test_a_sandbox_calling_the_api_gets_401_everywhere(tmp_path: Path, token: str) -> None:
    """A command in a sandbox calls every route, on 127.0.0.1 and on the daemon's own address,
    for another sandbox and for its own: 401 each time, and nothing changes."""
    address = own_address()
    token_file = write_token(tmp_path / "token", token)
    with listening_on_all_interfaces() as port:
        daemon = start_daemon(
            tmp_path, "--isolation=none", f"--token-file={token_file}", f"--listen=tcp:{port}"
        )
    try:
        victim = create(daemon, token)
        call(daemon, "PUT", f"/sandboxes/{victim}/file?path=victim.txt", raw=b"v", token=token)
        attacker = create(daemon, token)
        pod_url = call(daemon, "POST", "/sandboxes", {}, token=token).json()["pod_url"]
        bases = sorted({f"http://127.0.0.1:{port}", f"http://{address}:{port}", pod_url})
        # /drain last: were it let through, the daemon would stop serving.
        ops = sorted(operations(), key=lambda op: op == ("POST", "/drain"))
        before = snapshot(daemon, token)
        argv = ["python3", "-c", ATTACK, json.dumps([bases, victim, attacker, ops])]
        status, frames = exec_frames(daemon, attacker, {"cmd": argv}, token)
        assert status == 200, frames
        assert frames[-1].get("exit") == 0, frames[-1]
        import base64

        results = json.loads(base64.b64decode(frames[-1]["out"]))
        assert len(results) >= len(bases) * len(ops) * 2
        for base, method, path, _rid, got in results:
            expected = (200, 503) if (method, path) in PUBLIC else (401,)
            assert got in expected, (base, method, path, got)
        after = snapshot(daemon, token)
        # The attacker's own exec is the one change: its sandbox ran one command.
        before["sandboxes"] = [
            (rid, ready, execs + (rid == attacker)) for rid, ready, execs in before["sandboxes"]
        ]
        assert after == before
        assert not os.path.exists("/tmp/pwned")
        assert call(daemon, "GET", "/healthz").json()["status"] == "ok"
    finally:
        stop_daemon(daemon)


PROBE = r"""
import os, sys, time
print(os.getpid(), flush=True)
time.sleep(60)
"""


def _ancestry(pid: int, stop: int) -> list[int]:
    chain = []
    while pid not in (0, 1, stop):
        chain.append(pid)
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return chain


def test_the_token_is_not_in_a_commands_environment_or_command_line(
    authed: Any, token: str
) -> None:
    """While a command runs, its /proc environ and cmdline (and those of every process between
    it and the daemon) hold no token; nor do the daemon's own."""
    from http.client import HTTPConnection

    rid = create(authed, token)
    connection = HTTPConnection("127.0.0.1", authed.port, timeout=60)
    try:
        body = json.dumps({"cmd": ["python3", "-c", PROBE]})
        connection.request(
            "POST",
            f"/sandboxes/{rid}/exec",
            body=body,
            headers={"Authorization": f"Bearer {token}"},
        )
        response = connection.getresponse()
        assert response.status == 200
        import base64

        pid = 0
        while not pid:
            frame = json.loads(response.readline())
            assert "o" in frame, frame
            if frame["o"]:
                pid = int(base64.b64decode(frame["o"]))
        chain = _ancestry(pid, authed.process.pid)
        assert chain and chain[0] == pid
        needle = token.encode()
        for each in chain:
            assert needle not in Path(f"/proc/{each}/environ").read_bytes()
            assert needle not in Path(f"/proc/{each}/cmdline").read_bytes()
        assert b"SANDBOXD_TOKEN_FILE" not in Path(f"/proc/{pid}/environ").read_bytes()
        assert needle not in Path(f"/proc/{authed.process.pid}/environ").read_bytes()
        assert needle not in Path(f"/proc/{authed.process.pid}/cmdline").read_bytes()
    finally:
        connection.close()  # the client goes away: the daemon kills the command
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_daemon_with_a_token_still_serves_health_to_anyone(tmp_path: Path, token: str) -> None:
    token_file = write_token(tmp_path / "token", token)
    with running(tmp_path, "--isolation=none", f"--token-file={token_file}") as daemon:
        assert call(daemon, "GET", "/healthz").status == 200
        assert call(daemon, "GET", "/readyz").status == 200
        # Refused at its headers (docs/operating.rst, "Connections"): without the token, an unknown
        # route is not told apart from a known one.
        assert call(daemon, "GET", "/nowhere").status == 401
