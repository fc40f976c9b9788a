"""The daemon's port cannot be taken from inside a sandbox
(docs/operating.rst, "Who holds the port").

As root with real isolation: a sandbox in ``host`` network mode shares the host's addresses and
runs a squatter (:data:`SQUATTER`) that tries, as its own uid, to bind the daemon's port on
``127.0.0.1``, ``0.0.0.0``, ``[::1]`` and ``[::]``, and records every request it receives.

- Both address families are claimed: the squatter can take none of them, and a client that
  reaches ``localhost`` over IPv6 (``[::1]``: what ``localhost`` resolves to first on a stock
  Debian ``/etc/hosts``) talks to the daemon. With ``SANDBOXD_DUAL_STACK=off`` the very same
  squatter takes ``[::1]`` and receives that client's bearer token.
- A daemon killed with SIGKILL, its port then taken by the squatter left running in one of its
  sandboxes, restarts and serves: it reclaims its predecessor's sandboxes (the squatter with
  them) before it listens; the token then goes to the daemon on both families (the squatter
  never answers: a reply proves the daemon got the request).
"""

import base64
import http.client
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sandboxd import port_remnants
from tests.kernel.kernel_http import host_pid
from tests.security.live_daemon import new_token, write_token
from tests.support import daemon as process

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="real isolation needs root"),
]

SQUATTER = r"""
import errno, os, socket, sys, time
port, out, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
HOSTS = [(socket.AF_INET6, "::1"), (socket.AF_INET6, "::"),
         (socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0")]
def note(name, text):
    with open(os.path.join(out, name), "a") as f:
        f.write(text + "\n")
note("pid", str(os.getpid()))
held, said = {}, set()
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    for family, host in HOSTS:
        if host in held:
            continue
        s = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            s.bind((host, port))
            s.listen(16)
        except OSError as e:
            s.close()
            if (host, e.errno) not in said:
                said.add((host, e.errno))
                note("tries", f"refused {host} {errno.errorcode[e.errno]}")
            continue
        s.setblocking(False)
        held[host] = s
        note("tries", f"bound {host}")
    for s in held.values():
        try:
            conn, _ = s.accept()
        except BlockingIOError:
            continue
        conn.settimeout(2)
        try:
            note("captured", conn.recv(65536).decode("latin-1"))
        except OSError:
            pass
        conn.close()  # never answers: the client sees the connection drop
    time.sleep(0.01)
"""


@contextmanager
def pinned_port(port: int) -> Iterator[None]:
    """Make the next ``start_daemon`` listen on ``port``."""
    saved = process.free_port
    process.free_port = lambda: port
    try:
        yield
    finally:
        process.free_port = saved


@pytest.fixture
def token_file() -> Iterator[tuple[str, Path]]:
    """A token in a root-only file beneath a directory sandbox uids cannot read."""
    process.SHARED_ROOTS.mkdir(mode=0o711, exist_ok=True)
    where = Path(tempfile.mkdtemp(prefix="listen-", dir=process.SHARED_ROOTS))
    token = new_token()
    try:
        yield token, write_token(where / "token", token)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def start(tmp_path: Path, port: int, token_path: Path, *args: str) -> process.Daemon:
    uid = 610_000 + (abs(hash(str(tmp_path))) % 4000) * 8
    with pinned_port(port):
        try:
            return process.start_daemon(
                tmp_path,
                "--isolation=auto",
                f"--uid-min={uid}",
                f"--uid-max={uid + 7}",
                f"--token-file={token_path}",
                *args,
            )
        except AssertionError as e:
            if "start-up failed at isolation" in str(e):
                pytest.skip(f"cannot isolate here: {str(e).strip().splitlines()[-1]}")
            raise


def call(
    host: str, port: int, token: str, method: str, path: str, body: Any = None
) -> tuple[int, bytes]:
    """One request with the bearer token, to ``host`` (``::1`` is IPv6 loopback)."""
    connection = http.client.HTTPConnection(host, port, timeout=60)
    try:
        data = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=data, headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def run_squatter(daemon: process.Daemon, token: str, rid: str, seconds: float) -> Path:
    """Start the squatter in the background of sandbox ``rid``; the directory it writes."""
    out = daemon.root / rid / "workspace" / "squat"
    script = f"mkdir squat && setsid python3 -c '{SQUATTER}' {daemon.port} squat {seconds} "
    script += "</dev/null >squat/log 2>&1 &"
    status, body = call(
        "127.0.0.1",
        daemon.port,
        token,
        "POST",
        f"/sandboxes/{rid}/exec",
        {"cmd": ["sh", "-c", script]},
    )
    assert status == 200, body
    final = json.loads(body.splitlines()[-1])
    assert final.get("exit") == 0, (final, base64.b64decode(final.get("err", "")))
    return out


def wait_for(check: Any, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def tried(out: Path) -> list[str]:
    try:
        return (out / "tries").read_text().splitlines()
    except FileNotFoundError:
        return []


def captured(out: Path) -> str:
    try:
        return (out / "captured").read_text()
    except FileNotFoundError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.parametrize("dual_stack", ["on", "off"])
def test_a_sandbox_cannot_take_the_ipv6_port(
    tmp_path: Path, token_file: tuple[str, Path], dual_stack: str
) -> None:
    token, path = token_file
    daemon = start(tmp_path, process.free_port(), path, f"--dual-stack={dual_stack}")
    try:
        status, body = call(
            "127.0.0.1", daemon.port, token, "POST", "/sandboxes", {"network": "host"}
        )
        assert status == 200, body
        rid = json.loads(body)["remote_id"]
        out = run_squatter(daemon, token, rid, 60)
        # Every address was tried once at least (a refusal is noted once, then retried).
        wait_for(lambda: len({line.split()[1] for line in tried(out)}) == 4, "squatter tries")
        attempts = {line.split()[1]: line.split()[0] for line in tried(out)}
        status, body = (
            call("::1", daemon.port, token, "GET", "/healthz") if dual_stack == "on" else (0, b"")
        )
        if dual_stack == "on":
            assert set(attempts.values()) == {"refused"}, tried(out)
            assert all(line.endswith("EADDRINUSE") for line in tried(out)), tried(out)
            # localhost over IPv6 is the daemon.
            assert status == 200 and b"listen.dual-stack" in body, body
            status, body = call("::1", daemon.port, token, "GET", "/sandboxes")
            assert status == 200 and rid.encode() in body
            assert captured(out) == ""
        else:
            assert attempts["::1"] == "bound", tried(out)  # the other family was free
            assert attempts["127.0.0.1"] == "refused"
            with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
                call("::1", daemon.port, token, "GET", "/sandboxes")
            wait_for(lambda: token in captured(out), "the squatter got the token")
            assert f"Authorization: Bearer {token}" in captured(out)
        assert call("127.0.0.1", daemon.port, token, "DELETE", f"/sandboxes/{rid}")[0] == 204
    finally:
        process.stop_daemon(daemon)


def test_a_killed_daemon_restarts_and_serves_while_a_sandbox_squats_its_port(
    tmp_path: Path, token_file: tuple[str, Path]
) -> None:
    token, path = token_file
    first = start(tmp_path, process.free_port(), path)
    try:
        status, body = call(
            "127.0.0.1", first.port, token, "POST", "/sandboxes", {"network": "host"}
        )
        assert status == 200, body
        rid = json.loads(body)["remote_id"]
        out = run_squatter(first, token, rid, 300)
        wait_for(lambda: len({line.split()[1] for line in tried(out)}) == 4, "squatter tries")
        assert all(line.startswith("refused") for line in tried(out)), tried(out)
        found = host_pid(int((out / "pid").read_text()), first.root / ".ns" / rid / "pid")
        assert found is not None, "the squatter runs"
        squatter = found  # the host's number (the sandbox's differs with a PID namespace)
        first.process.kill()  # SIGKILL: the sandbox and its squatter live on
        first.process.wait(30)

        # The dead daemon's own closed connections (TIME_WAIT) would keep the squatter, whose
        # sockets set no SO_REUSEADDR, out for a minute: a patient squatter waits; this one
        # has them cleared as they come.
        # It takes each family's loopback or wildcard, whichever it binds first: once it holds
        # the wildcard, the loopback is its own wildcard's, and either keeps the daemon out.
        def squatted() -> bool:
            port_remnants.destroy_closing(first.port)
            bound = set(tried(out))
            return all(
                {f"bound {loopback}", f"bound {wildcard}"} & bound
                for loopback, wildcard in (("127.0.0.1", "0.0.0.0"), ("::1", "::"))
            )

        wait_for(squatted, f"the squatter took the port: {tried(out)}")
        assert alive(squatter)
    except BaseException:
        process.stop_daemon(first)
        raise

    # The restart: the squatter holds both loopbacks of the port (and drops every request,
    # start_daemon's probes included) until the new daemon reclaims the sandbox.
    second = start(tmp_path, first.port, path)
    try:
        assert not alive(squatter)
        log = second.log.read_text()
        assert log.index("recovery done: 1 leftover") < log.index("listening on")
        # start_daemon's probes reached the squatter, which closed them: their TIME_WAIT
        # (no SO_REUSEADDR) refused the bind until the daemon destroyed them.
        assert "connections that no process holds" in log
        for host in ("127.0.0.1", "::1"):
            status, body = call(host, second.port, token, "GET", "/sandboxes")
            assert status == 200, body
            assert json.loads(body) == {"sandboxes": []}
        assert not (second.root / rid).exists()
    finally:
        process.stop_daemon(second)
