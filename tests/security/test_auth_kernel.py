"""Auth (docs/extensions.rst, "Auth") under real isolation: a sandbox (its own uid, its own cgroup)
can neither read the token nor use the API.

Root and a usable cgroup hierarchy are needed (``--isolation=auto``); where the daemon cannot
isolate, the test is skipped with the daemon's own reason.
"""

import base64
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.security.live_daemon import (
    call,
    create,
    exec_frames,
    new_token,
    start_daemon,
    stop_daemon,
)

pytestmark = pytest.mark.kernel

SHARED = Path("/tmp/sandboxd-tests")
UIDS = ("--uid-min=590000", "--uid-max=590007")

ATTACK = r"""
trap '' PIPE  # the daemon may answer and close before reading all: not the test's concern
for request in "POST /drain" "POST /sandboxes" "GET /sandboxes" "DELETE /sandboxes/$1" \
               "POST /sandboxes/$1/exec" "GET /sandboxes/$1/file?path=victim.txt" "GET /metrics"; do
  for auth in "X-Probe: 1" "Authorization: Bearer $(cat "$2" 2>/dev/null)"; do
    exec 3<>/dev/tcp/127.0.0.1/$3
    printf '%s HTTP/1.0\r\n%s\r\nContent-Length: 19\r\n\r\n{"cmd": ["true"]}  ' \
      "$request" "$auth" >&3
    read -r version status rest <&3
    echo "$request $status"
    exec 3>&-
  done
done
"""


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory sandbox uids can pass through (pytest's own are root-only)."""
    if os.geteuid() != 0:
        pytest.skip("real isolation needs root")
    SHARED.mkdir(mode=0o711, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="token-", dir=SHARED))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def isolated(tmp_path: Path, scratch: Path) -> Iterator[tuple[Any, str, Path]]:
    token = new_token()
    token_file = scratch / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    try:
        daemon = start_daemon(
            tmp_path,
            "--isolation=auto",
            *UIDS,
            f"--token-file={token_file}",
            "--keepalive=1s",
            "--network=host",  # the attack drives the API on the host's loopback
        )
    except AssertionError as e:
        pytest.skip(f"the daemon cannot isolate here: {str(e).strip().splitlines()[-1]}")
    try:
        yield daemon, token, token_file
    finally:
        stop_daemon(daemon)


def test_a_sandbox_cannot_read_the_token_nor_use_the_api(
    isolated: tuple[Any, str, Path],
) -> None:
    daemon, token, token_file = isolated
    health = call(daemon, "GET", "/healthz").json()
    assert "isolation.none" not in health["capabilities"]
    victim = create(daemon, token)
    assert call(daemon, "PUT", f"/sandboxes/{victim}/file?path=victim.txt", raw=b"v",
                token=token).status == 204  # fmt: skip
    attacker = create(daemon, token)
    pid = daemon.process.pid
    status, frames = exec_frames(
        daemon,
        attacker,
        {
            "cmd": [
                "sh",
                "-c",
                'id -u; cat "$1"; cat /proc/$2/environ; env',
                "sh",
                str(token_file),
                str(pid),
            ]
        },
        token,
    )
    assert status == 200, frames
    out = base64.b64decode(frames[-1]["out"])
    err = base64.b64decode(frames[-1]["err"])
    assert int(out.split()[0]) >= 590000  # the sandbox's own uid
    assert token.encode() not in out + err
    assert b"Permission denied" in err
    status, frames = exec_frames(
        daemon,
        attacker,
        {"cmd": ["bash", "-c", ATTACK, "bash", victim, str(token_file), str(daemon.port)]},
        token,
    )
    assert status == 200 and frames[-1]["exit"] == 0, frames[-1]
    lines = base64.b64decode(frames[-1]["out"]).decode().splitlines()
    assert len(lines) == 14, lines
    assert all(line.endswith(" 401") for line in lines), lines
    assert call(daemon, "GET", f"/sandboxes/{victim}/file?path=victim.txt", token=token).body \
        == b"v"  # fmt: skip
    assert call(daemon, "GET", "/healthz").json()["status"] == "ok"
    listing = call(daemon, "GET", "/sandboxes", token=token).json()["sandboxes"]
    assert sorted(s["remote_id"] for s in listing) == sorted([victim, attacker])
