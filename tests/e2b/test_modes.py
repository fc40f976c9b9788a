"""The modes of what the E2B front's file calls make are envd's (files 0644, directories
0755), whatever the daemon's umask: the front in memory, its file work in this process, run
under a umask of 077 and of 022."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2b.memory import Memory, memory_front


@pytest.fixture(params=[0o077, 0o022])
def memory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Memory]:
    previous = os.umask(request.param)
    try:
        yield from memory_front(str(tmp_path))
    finally:
        os.umask(previous)


def mode(memory: Memory, sandbox_id: str, path: str) -> int:
    return stat.S_IMODE(
        os.lstat(os.path.join(memory.manager.layout.workspace(sandbox_id), path)).st_mode
    )


def test_written_files_and_made_directories_have_envds_modes(memory: Memory) -> None:
    entry = memory.create()
    headers = memory.envd_headers(entry)
    octets = {**headers, "Content-Type": "application/octet-stream"}
    assert memory.call("POST", "/files?path=new/deep/raw", data=b"x", headers=octets).status == 200
    boundary = "b0undary"
    multipart = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="form.txt"\r\n'
        f"\r\nform\r\n--{boundary}--\r\n"
    ).encode()
    form = {**headers, "Content-Type": f"multipart/form-data; boundary={boundary}"}
    assert memory.call("POST", "/files?path=form.txt", data=multipart, headers=form).status == 200
    made = memory.rpc(entry, "filesystem.Filesystem/MakeDir", {"path": "made/inner"})
    assert made.status == 200
    assert made.json()["entry"]["permissions"] == "drwxr-xr-x"
    assert {p: mode(memory, entry.id, p) for p in ("new", "new/deep", "made", "made/inner")} == {
        "new": 0o755,
        "new/deep": 0o755,
        "made": 0o755,
        "made/inner": 0o755,
    }
    assert mode(memory, entry.id, "new/deep/raw") == 0o644
    assert mode(memory, entry.id, "form.txt") == 0o644
    stated = memory.rpc(entry, "filesystem.Filesystem/Stat", {"path": "form.txt"}).json()
    assert stated["entry"]["permissions"] == "-rw-r--r--"
