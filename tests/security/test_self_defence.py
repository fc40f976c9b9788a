"""Self-defence (docs/operating.rst, "Connections"; docs/contract.rst, "Bad input and faults"):
attacks an unauthenticated local peer mounts, for real, against a running ``twistd -n sandboxd``,
each also with its protection turned off by name, to show that the attack then works.

Every attack has an outer bound of its own (a small tmpfs as the state root, ``prlimit`` on the
daemon's descriptors, a fixed number of bytes and connections, socket timeouts).
"""

import contextlib
import os
import resource
import socket
import subprocess
import time
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest

from tests.security.live_daemon import new_token, trickle_headers, write_token
from tests.support.daemon import Daemon, start_daemon, stop_daemon

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs as the state root")

MIB = 1 << 20
ATTACK_BYTES = 48 * MIB
"""The unauthenticated body sent (chunked): more than twice the bound it is held to."""

STORED_BOUND = 8 * MIB
"""What the state filesystem and the daemon's RSS may grow by while the attack runs."""


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "160m") -> Iterator[Path]:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def used_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def send_unfinished(port: int, head: bytes) -> tuple[socket.socket, int]:
    """Send ``head`` and then up to :data:`ATTACK_BYTES` of its chunked body, never finished;
    the connection and the bytes sent (fewer once the daemon stops reading)."""
    attack = socket.create_connection(("127.0.0.1", port), timeout=20)
    attack.sendall(head)
    chunk = b"%x\r\n%s\r\n" % (MIB, b"x" * MIB)
    sent = 0
    with contextlib.suppress(OSError):  # a refused body: the daemon stops reading it
        while sent < ATTACK_BYTES:
            attack.sendall(chunk)
            sent += MIB
    return attack, sent


def stored_whole(attack: socket.socket, sent: int, stored: int) -> None:
    """With the gate off: the whole attack was sent and at least half of it stored (less what
    the socket buffers still hold). The daemon is still reading the body, so no answer comes:
    ``attack`` is closed without waiting for one."""
    attack.close()
    assert sent == ATTACK_BYTES and stored >= ATTACK_BYTES // 2, stored


def answer_of(attack: socket.socket) -> bytes:
    """What the daemon answered on ``attack`` (nothing if it reset it), and close it."""
    answer = b""
    with contextlib.suppress(OSError):
        answer = attack.recv(65536)
    attack.close()
    return answer


@contextlib.contextmanager
def daemon_with_token(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, **kwargs: Any
) -> Iterator[tuple[Daemon, str]]:
    tmp_path.mkdir(exist_ok=True)
    token = new_token()
    token_file = write_token(tmp_path / "token", token)
    daemon = start_daemon(
        tmp_path, "--isolation=none", f"--token-file={token_file}", *args, env=env, **kwargs
    )
    try:
        yield daemon, token
    finally:
        stop_daemon(daemon)


def request(port: int, head: bytes, timeout: float = 20.0) -> bytes:
    """Send ``head`` (a whole request without a body) and read the answer to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            data = s.recv(65536)
            if not data:
                break
            answer += data
        return answer


def healthz(port: int) -> bytes:
    return request(port, b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")


def create(port: int, token: str) -> bytes:
    return request(
        port,
        b"POST /sandboxes HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\n"
        b"content-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
        % token.encode(),
        timeout=60.0,
    )


# A body without the token


@pytest.mark.parametrize("gate", ["headers", "off"])
def test_an_unauthenticated_chunked_body_is_never_stored(tmp_path: Path, gate: str) -> None:
    with (
        tmpfs(tmp_path / "root") as root,
        daemon_with_token(tmp_path, f"--auth-gate={gate}") as (daemon, _),
    ):
        rss_before = daemon.rss_kib() * 1024
        used_before = used_bytes(root)
        attack, sent = send_unfinished(
            daemon.port,
            b"PUT /sandboxes/0123456789abcdef/file?path=x HTTP/1.1\r\nhost: x\r\n"
            b"transfer-encoding: chunked\r\n\r\n",
        )
        # The body is left unfinished, so whatever the daemon stored of it is still held.
        stored = used_bytes(root) - used_before
        grown = daemon.rss_kib() * 1024 - rss_before
        if gate == "off":
            stored_whole(attack, sent, stored)
            return
        answer = answer_of(attack)
        assert answer.startswith(b"HTTP/1.1 401 Unauthorized\r\n"), answer
        assert b'"error": "Unauthorized"' in answer
        assert stored < STORED_BOUND and sent < ATTACK_BYTES, (stored, sent)
        assert grown < STORED_BOUND, grown
        assert healthz(daemon.port).startswith(b"HTTP/1.1 200")


def test_the_early_401_is_the_routes_401(tmp_path: Path) -> None:
    """The same status, body and challenge as the route's own refusal (gate off)."""
    answers = []
    for gate in ("headers", "off"):
        with daemon_with_token(tmp_path / gate, f"--auth-gate={gate}") as (daemon, _):
            connection = HTTPConnection("127.0.0.1", daemon.port, timeout=20)
            connection.request(
                "POST", "/sandboxes", body=b"{}", headers={"authorization": "Bearer nope"}
            )
            response = connection.getresponse()
            answers.append(
                (
                    response.status,
                    response.getheader("content-type"),
                    response.getheader("www-authenticate"),
                    response.read(),
                )
            )
            connection.close()
    assert answers[0] == answers[1]
    assert answers[0][0] == 401


# Idle connections


@pytest.fixture
def many_descriptors() -> Iterator[None]:
    """This test process may hold a few thousand sockets."""
    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(saved[0], 4096), max(saved[1], 4096)))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, saved)


def test_idle_connections_do_not_shut_out_health_and_authenticated_calls(
    tmp_path: Path, many_descriptors: None
) -> None:
    _attack_idle(tmp_path, capped=True)


def test_idle_connections_shut_out_a_daemon_without_the_cap(
    tmp_path: Path, many_descriptors: None
) -> None:
    _attack_idle(tmp_path, capped=False)


DAEMON_DESCRIPTORS = 256
IDLE_CONNECTIONS = 1500
TOP_UP_BOUND = 3500
"""The most connections the attack against a daemon without the cap ever holds (this test
process may have 4 096 descriptors)."""


def _attack_idle(tmp_path: Path, capped: bool) -> None:
    cap = "auto" if capped else "off"
    with daemon_with_token(
        tmp_path,
        f"--max-connections={cap}",
        "--header-timeout=off",  # only the cap is tried here
        wrapper=("prlimit", f"--nofile={DAEMON_DESCRIPTORS}:{DAEMON_DESCRIPTORS}", "--"),
    ) as (daemon, token):
        held: list[socket.socket] = []
        fds = Path(f"/proc/{daemon.process.pid}/fd")
        try:
            held += _idle_connections(daemon.port, IDLE_CONNECTIONS)
            time.sleep(2)  # let the daemon accept (or fail to accept) them all
            # Past the listen backlog, connects wait for SYN and SYN-ACK retries: on a busy
            # machine the daemon without the cap takes the last ones in late, and some never
            # (they time out). The attacker keeps connecting until the daemon is full.
            deadline = time.monotonic() + 60
            while (
                not capped
                and len(os.listdir(fds)) < DAEMON_DESCRIPTORS - 2
                and time.monotonic() < deadline
                and len(held) < TOP_UP_BOUND
            ):
                held += _idle_connections(daemon.port, 50)
                time.sleep(0.5)
            descriptors = len(os.listdir(fds))
            if not capped:
                assert descriptors >= DAEMON_DESCRIPTORS - 2, descriptors
                assert not (
                    _answers(daemon.port, b"GET /healthz", b"")
                    and _answers(
                        daemon.port,
                        b"POST /sandboxes",
                        b"authorization: Bearer %s\r\n" % token.encode(),
                    )
                )
                return
            assert descriptors < DAEMON_DESCRIPTORS - 32, descriptors
            assert healthz(daemon.port).startswith(b"HTTP/1.1 200")
            assert create(daemon.port, token).startswith(b"HTTP/1.1 200")
        finally:
            for s in held:
                s.close()
        log = daemon.log.read_text()
        evictions = log.count("connections: closed the longest-waiting")
        assert evictions >= 1 and log.count("[sandboxd.web.guard#warn] connections") < 10, log


def _idle_connections(port: int, count: int) -> list[socket.socket]:
    """``count`` connections, each begun without waiting and sent half a request line."""
    held = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        with contextlib.suppress(OSError):
            s.send(b"GET /healthz HTTP/1.1\r\n")
        held.append(s)
    return held


def _answers(port: int, line: bytes, headers: bytes) -> bool:
    """Whether the daemon answers ``line`` with a 200 within a few seconds."""
    head = line + b" HTTP/1.1\r\nhost: x\r\n" + headers + b"content-length: 2\r\n\r\n{}"
    try:
        return request(port, head, 5.0).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


# Slow headers


@pytest.mark.parametrize("timeout", ["2s", "off"])
def test_a_header_trickle_is_cut(tmp_path: Path, timeout: str) -> None:
    with daemon_with_token(tmp_path, f"--header-timeout={timeout}") as (daemon, _):
        s, cut = trickle_headers(daemon.port, b"GET /healthz HTTP/1.1", timeout == "off")
        if timeout == "off":
            s.sendall(b": y\r\nconnection: close\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            return
        assert cut
        assert "header timeout: closed a connection" in daemon.log.read_text()


# Token guessing


@pytest.mark.parametrize("gate", ["headers", "off"])
def test_wrong_tokens_are_paced_per_peer(tmp_path: Path, gate: str, many_descriptors: None) -> None:
    """Wrong tokens sent at once: a burst is answered, then one per pace interval for a
    bounded wait; the rest are closed unanswered (the right token is never paced)."""
    guesses = 800
    with daemon_with_token(
        tmp_path, f"--auth-gate={gate}", wrapper=("prlimit", "--nofile=8192:8192", "--")
    ) as (daemon, token):
        sockets = []
        for n in range(guesses):
            s = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
            s.sendall(
                b"GET /sandboxes HTTP/1.1\r\nhost: x\r\nauthorization: Bearer guess-%d\r\n\r\n" % n
            )
            sockets.append(s)
        answered = 0
        for s in sockets:
            with contextlib.suppress(OSError):
                answered += s.recv(65536).startswith(b"HTTP/1.1 401")
            s.close()
        assert create(daemon.port, token).startswith(b"HTTP/1.1 200")  # the right token: served
    if gate == "off":
        assert answered == guesses
    else:
        assert 100 <= answered < guesses, answered  # the rest: closed unanswered
