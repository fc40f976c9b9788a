"""Self-defence (docs/operating.rst, "Connections") from inside a sandbox: a command in ``host``
network mode (its own uid, its own cgroup, no token) attacks the daemon on ``127.0.0.1`` with an
unauthenticated chunked body and with idle connections, and the daemon's other callers keep being
served. With the protections off (``--auth-gate=off --max-connections=off``) the same attack works.

The state root is a small tmpfs (the sandbox measures the spool itself: its workspace is on
it) and the daemon runs under ``prlimit --nofile=160``.
"""

import base64
import contextlib
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.security.live_daemon import call, create, exec_frames, new_token
from tests.security.test_self_defence import STORED_BOUND, healthz
from tests.security.test_self_defence import create as raw_create
from tests.support.daemon import SHARED_ROOTS, start_daemon, stop_daemon

pytestmark = pytest.mark.kernel

UIDS = ("--uid-min=590100", "--uid-max=590107")
ATTACK_MIB = 32
DESCRIPTORS = 160
IDLE = 140
"""Idle connections each of the sandbox's two processes holds: under the 160 descriptors each
inherits from the daemon, above what the daemon has left of them together."""

ATTACK = r"""
import os, socket, sys, time
port, mib, idle = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def used():
    st = os.statvfs(".")
    return (st.f_blocks - st.f_bfree) * st.f_frsize
before = used()
s = socket.create_connection(("127.0.0.1", port), timeout=20)
s.sendall(b"PUT /sandboxes/0123456789abcdef/file?path=x HTTP/1.1\r\nhost: x\r\n"
          b"transfer-encoding: chunked\r\n\r\n")
chunk = b"%x\r\n%s\r\n" % (1 << 20, b"x" * (1 << 20))
sent = 0
try:
    while sent < mib:
        s.sendall(chunk)
        sent += 1
except OSError:
    pass
time.sleep(0.5)  # what the socket buffers still held reaches the daemon
stored = used() - before
try:
    answer = s.recv(200).split(b"\r\n")[0].decode()
except OSError as e:
    answer = type(e).__name__
s.close()
print(sent, stored, answer, flush=True)
child = os.fork()  # two processes: each has only the 256 descriptors of the daemon's limit
held = []
for _ in range(idle):
    c = socket.socket()
    c.setblocking(False)
    c.connect_ex(("127.0.0.1", port))
    held.append(c)
time.sleep(1)
for c in held:
    try:
        c.send(b"GET /healthz HTTP/1.1\r\n")
    except OSError:
        pass
time.sleep(1)
if child:
    open("holding", "w").close()
    time.sleep(float(sys.argv[4]))
    os.waitpid(child, 0)
else:
    time.sleep(float(sys.argv[4]) + 1)
    os._exit(0)
"""


@contextlib.contextmanager
def tmpfs_root(tmp_path: Path) -> Iterator[None]:
    """``tmp_path/root`` linked to a tmpfs that sandbox uids can pass through."""
    SHARED_ROOTS.mkdir(mode=0o711, exist_ok=True)
    mount = Path(tempfile.mkdtemp(prefix="defence-", dir=SHARED_ROOTS))
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=160m,mode=0711", "tmpfs", str(mount)], check=True
    )
    (tmp_path / "root").symlink_to(mount)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
        with contextlib.suppress(OSError):
            mount.rmdir()


@pytest.mark.parametrize(
    "protections",
    [
        "on",
        # With the protections off: left to the wide run (``sudo tests/run -m wide``), not
        # the gate, where it cost 100 s of CI for an outcome it cannot yet promise.
        pytest.param(
            "off",
            marks=[
                pytest.mark.slow,
                pytest.mark.wide,
                pytest.mark.xfail(
                    reason="the attack without the cap reaches the descriptor limit when run"
                    " alone (2 passed, 192 s) but held 121, 133 and 136 of 160 in full-suite"
                    " runs: how many of its connects the daemon accepts is not understood yet",
                    strict=False,
                ),
            ],
        ),
    ],
)
def test_a_sandbox_in_host_mode_cannot_starve_the_daemon(tmp_path: Path, protections: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("real isolation needs root")
    token = new_token()
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    off = ("--auth-gate=off", "--max-connections=off") if protections == "off" else ()
    with tmpfs_root(tmp_path):
        try:
            daemon = start_daemon(
                tmp_path,
                "--isolation=auto",
                *UIDS,
                f"--token-file={token_file}",
                "--network=host",
                "--header-timeout=off",  # the idle connections are the cap's to handle
                "--socket-buffers=off",  # charged, the sandbox could not open them all
                *off,
                wrapper=("prlimit", f"--nofile={DESCRIPTORS}:{DESCRIPTORS}", "--"),
            )
        except AssertionError as e:
            pytest.skip(f"the daemon cannot isolate here: {str(e).strip().splitlines()[-1]}")
        try:
            _attack(daemon, token, protections == "on")
        finally:
            stop_daemon(daemon)


def _attack(daemon: Any, token: str, protected: bool) -> None:
    attacker = create(daemon, token)
    result: list[tuple[int, list[dict[str, Any]]]] = []
    # The attacker holds its connections while the daemon is probed: 75 s without the
    # protections (their connects may take 50 s to get in, below), 15 s with them.
    hold = "15" if protected else "75"
    argv = ["python3", "-c", ATTACK, str(daemon.port), str(ATTACK_MIB), str(IDLE), hold]
    thread = threading.Thread(
        target=lambda: result.append(exec_frames(daemon, attacker, {"cmd": argv}, token))
    )
    thread.start()
    deadline = time.monotonic() + 60
    while not list(daemon.root.glob("**/holding")) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not list(daemon.root.glob("**/holding")):
        thread.join(60)
        raise AssertionError(f"the attack did not get to its idle part: {result}")
    fds = Path(f"/proc/{daemon.process.pid}/fd")
    # Past the listen backlog, connects wait for their SYN retries (1, 3, 7, 15, 31 s): on a
    # busy machine the last ones get in late.
    settled = time.monotonic() + (50 if not protected else 2)
    while time.monotonic() < settled and len(os.listdir(fds)) < DESCRIPTORS - 4:
        time.sleep(0.2)
    descriptors = len(os.listdir(fds))
    answers = []
    for probe in (lambda: healthz(daemon.port), lambda: raw_create(daemon.port, token)):
        try:
            answers.append(probe().startswith(b"HTTP/1.1 200"))
        except OSError:
            answers.append(False)
    thread.join(180)
    status, frames = result[0]
    assert status == 200 and frames[-1]["exit"] == 0, frames[-1]
    sent, stored, answer = base64.b64decode(frames[-1]["out"]).decode().split(None, 2)
    if protected:
        assert answer.startswith("HTTP/1.1 401"), answer
        assert int(stored) < STORED_BOUND and int(sent) < ATTACK_MIB, (sent, stored)
        assert answers == [True, True]
        assert call(daemon, "GET", "/healthz").status == 200
    else:
        assert int(sent) == ATTACK_MIB and int(stored) >= (ATTACK_MIB << 20) // 2, stored
        assert descriptors >= DESCRIPTORS - 4 and answers != [True, True], descriptors
