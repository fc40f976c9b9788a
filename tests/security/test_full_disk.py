"""Disk full (docs/contract.rst, "Bad input and faults"): ``507 InsufficientStorage``, and the
partial file removed.

The daemon's root is a small tmpfs (8 MiB) mounted for the test (root only; skipped
otherwise), and the daemon is a real ``twistd -n sandboxd`` over real TCP.
"""

import base64
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.security.live_daemon import call, create, exec_frames, start_daemon, stop_daemon

SIZE = 8 << 20


@pytest.fixture
def tmpfs_root(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root = tmp_path / "root"
    root.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0711", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield root
    finally:
        if subprocess.run(["umount", str(root)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(root)], check=True)


@pytest.fixture
def daemon(tmp_path: Path, tmpfs_root: Path) -> Iterator[Any]:
    live = start_daemon(tmp_path, "--isolation=none")
    assert Path(live.root) == tmpfs_root
    try:
        yield live
    finally:
        stop_daemon(live)  # before the tmpfs is unmounted


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def everything_in(directory: Path) -> list[str]:
    """Every entry below ``directory``, hidden ones (the upload's temporary files) included."""
    return sorted(
        os.path.relpath(os.path.join(top, name), directory)
        for top, dirs, files in os.walk(directory)
        for name in dirs + files
    )


def chunks(data: bytes) -> Iterator[bytes]:
    for start in range(0, len(data), 1 << 20):
        yield data[start : start + (1 << 20)]


def test_an_upload_that_fills_the_disk_is_507_and_leaves_nothing(daemon: Any) -> None:
    rid = create(daemon)
    ws = Path(daemon.root) / rid / "workspace"
    free = free_bytes(ws)
    s = f"/sandboxes/{rid}"
    data = os.urandom(16 << 20)
    for reply in (
        call(daemon, "PUT", f"{s}/file?path=dir/big.bin", raw=data),
        call(daemon, "PUT", f"{s}/file?path=dir/big.bin", raw=chunks(data)),  # chunked
    ):
        assert (reply.status, reply.error()) == (507, "InsufficientStorage"), reply
        assert [e for e in everything_in(ws) if e != "dir"] == []  # no partial, no temp file
        assert free_bytes(ws) >= free - (64 << 10)  # the space is given back
    small = os.urandom(1 << 20)
    assert call(daemon, "PUT", f"{s}/file?path=dir/small.bin", raw=small).status == 204
    assert call(daemon, "GET", f"{s}/file?path=dir/small.bin").body == small


def test_a_replacement_that_fills_the_disk_keeps_the_old_file(daemon: Any) -> None:
    rid = create(daemon)
    s = f"/sandboxes/{rid}"
    old = os.urandom(2 << 20)
    assert call(daemon, "PUT", f"{s}/file?path=f.bin", raw=old).status == 204
    reply = call(daemon, "PUT", f"{s}/file?path=f.bin", raw=os.urandom(16 << 20))
    assert (reply.status, reply.error()) == (507, "InsufficientStorage"), reply
    assert call(daemon, "GET", f"{s}/file?path=f.bin").body == old
    assert everything_in(Path(daemon.root) / rid / "workspace") == ["f.bin"]
    assert call(daemon, "GET", f"{s}/size?path=f.bin").json() == {"size": len(old)}


def test_a_command_filling_the_disk_is_just_a_result(daemon: Any) -> None:
    rid = create(daemon)
    s = f"/sandboxes/{rid}"
    status, frames = exec_frames(
        daemon, rid, {"cmd": ["sh", "-c", "head -c 16777216 /dev/zero > big; echo wrote $?"]}
    )
    assert status == 200, frames
    last = frames[-1]
    assert "exit" in last, last
    assert last["exit"] == 0  # the shell's own result: the echo ran
    assert base64.b64decode(last["out"]).startswith(b"wrote ")
    assert base64.b64decode(last["out"]) != b"wrote 0\n"
    assert b"No space left" in base64.b64decode(last["err"])
    reply = call(daemon, "PUT", f"{s}/file?path=more.bin", raw=os.urandom(1 << 20))
    assert (reply.status, reply.error()) == (507, "InsufficientStorage"), reply
    assert call(daemon, "DELETE", f"{s}/file?path=big").status == 204
    assert call(daemon, "PUT", f"{s}/file?path=more.bin", raw=b"fits").status == 204
    status, frames = exec_frames(daemon, rid, {"cmd": ["cat", "more.bin"]})
    assert status == 200 and base64.b64decode(frames[-1]["out"]) == b"fits"
    health = call(daemon, "GET", "/healthz")
    assert health.status == 200 and health.json()["status"] == "ok"
    assert call(daemon, "DELETE", s).status == 204
    assert not (Path(daemon.root) / rid).exists()
